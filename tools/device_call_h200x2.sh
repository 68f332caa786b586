#!/usr/bin/env bash
# One call on a 2 x H200 machine (2026-11-28, issue 31), in two phases:
#  1. at once: GPU 0 runs the FP8 tiny-run parity test (tests/gpu/test_finetune_fp8.py, bf16 then FP8, 20 steps
#     each) with up to FP8_TIMEOUT s; GPU 1 runs the Mistral recipe on its architecture, cold then warm
#     (tools/plans/h200-mistral.txt);
#  2. the shipped speed recipe (varlen) across two "nodes" of one GPU each on an empty shared compile cache, then
#     one GPU alone on the warm cache (tools/two_nodes_gpu.py finetune): who compiled, who loaded, share kept.
# Usage: bash tools/device_call_h200x2.sh (carry .whl)
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee "$OUT/summary.txt"
start=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout -k 20 "${FP8_TIMEOUT:-330}" python3 -m pytest -q -s -p no:cacheprovider \
    --durations=4 "tests/gpu/test_finetune_fp8.py::test_a_tiny_run_in_fp8_follows_the_bf16_run" \
    > "$OUT/gpu-test-fp8.txt" 2>&1
  echo "fp8 tiny-run test exit $? in $(( $(date +%s) - start )) s" >> "$OUT/summary.txt" ) &
fp8=$!
CONFIG=configs/finetune/mistral-7b-alpaca.yaml RUN_TIMEOUT=160 SKIP_INSTALL=1 \
  bash tools/device_finetune.sh tools/plans/h200-mistral.txt
wait "$fp8"
tail -8 "$OUT/gpu-test-fp8.txt"
echo "phase 1 done at $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
mkdir -p "$OUT/two-nodes"
timeout -k 20 "${TWO_NODES_TIMEOUT:-230}" python3 tools/two_nodes_gpu.py finetune --out "$OUT/two-nodes" \
  > "$OUT/two-nodes/stdout.txt" 2>&1
echo "two nodes exit $? at $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
tail -40 "$OUT/two-nodes/stdout.txt"
cat "$OUT/summary.txt"
