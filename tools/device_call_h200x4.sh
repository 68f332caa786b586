#!/usr/bin/env bash
# One call on a 4 x H200 machine (2026-11-29, seventh session): one node of four GPUs as the README prints it, on
# the one execution path (gpucert's launcher starts a rank per GPU), which no multi-GPU node had run since it
# replaced the old node agents:
# 1. `gpucert accept --set health.expected_gpus=4` (NVLink peers, NCCL within the node, every benchmark);
# 2. `gpucert finetune --config qwen2-7b-speed` on the four GPUs, DDP, an empty compile cache: tokens/s per GPU,
#    time to the first step, and whether ranks 1-3 load what rank 0 compiled;
# 3. the same with train.parallel=fsdp2 (the cache warm).
# Each part has its own time limit; the whole stays inside the call's 600 s.
# Usage: bash tools/device_call_h200x4.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
nvidia-smi topo -m > $res/topo.txt 2>&1
start=$(date +%s)
said() { echo "$1 exit $2 at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt; }
COLUMNS=160 timeout -k 15 210 gpucert accept --set health.expected_gpus=4 -o /tmp/accept4 > $res/accept.txt 2>&1
said accept $?
cp /tmp/accept4/report.json /tmp/accept4/report.md /tmp/accept4/report.html $res/ 2>/dev/null
cache=/tmp/gpucert-compile-x4; rm -rf $cache
for mode in ddp fsdp2; do
  limit=$([ $mode = ddp ] && echo 170 || echo 140)
  timeout -k 15 $limit gpucert finetune --config qwen2-7b-speed --output /tmp/ft4-$mode \
    --set train.max_steps=20 --set train.parallel=$mode --set train.compile_cache_dir=$cache \
    > $res/finetune-$mode.txt 2>&1
  said finetune-$mode $?
  cp /tmp/ft4-$mode/metrics.json $res/finetune-$mode-metrics.json 2>/dev/null
  cp -r /tmp/ft4-$mode/logs $res/finetune-$mode-logs 2>/dev/null
done
nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l | sed 's/^/gpu processes left: /' | tee -a $res/summary.txt
