#!/usr/bin/env bash
# One call on a 2 x H200 machine (2026-11-29, issue 31 part 4): the speed recipe in FP8 across two "nodes" on an
# empty shared compile cache, then one GPU on the warm cache (tools/two_nodes_gpu.py finetune --set
# model.precision=fp8), with each rank's compile counters: does the second node load what the first compiled, now
# that AOTAutograd's cache keeps graphs that call FP8's autograd.Functions (8686f04)?
# Usage: bash tools/device_call_h200x2_fp8.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
start=$(date +%s)
timeout -k 20 560 python3 tools/two_nodes_gpu.py finetune --out $res/two-nodes --set model.precision=fp8 \
  > $res/two-nodes-stdout.txt 2>&1
echo "two nodes exit $? at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt
# finetune.json (under two-nodes/) holds each run's figures with every rank's warm-up order and cache counters.
cp /tmp/ft-two-nodes/metrics.json $res/two-nodes-metrics.json 2>/dev/null
cp /tmp/ft-one-gpu/metrics.json $res/one-gpu-metrics.json 2>/dev/null
