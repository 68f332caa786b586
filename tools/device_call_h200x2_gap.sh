#!/usr/bin/env bash
# One call on a 2 x H200 machine (2026-11-29, seventh session):
# 1. the operator's Ctrl-C to one node of a two-node fine-tuning job, to node 1's gpucert and then to node 0's
#    (tools/two_nodes_gpu.py stop): both nodes gone, in how long, saying what, nothing left on the GPUs, and node 0
#    naming the checkpoint a rerun continues from;
# 2. where the two-node FP8 gap goes (95.9 % kept over sockets, bf16 98.6 %, 2026-11-28/29): the speed recipe
#    across two nodes over NCCL's network path and over the host's own path, in FP8 and in bf16, each beside one
#    GPU alone. Each part has its own time limit; the whole stays inside the call's 600 s.
# Usage: bash tools/device_call_h200x2_gap.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
start=$(date +%s)
part() {  # NAME LIMIT_S ARGS...: one run of tools/two_nodes_gpu.py, its output under $res/NAME
  local name=$1 limit=$2; shift 2
  timeout -k 15 "$limit" python3 tools/two_nodes_gpu.py "$@" --out $res/$name > $res/$name-stdout.txt 2>&1
  echo "$name exit $? at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt
}
part fp8-net 200 finetune --set model.precision=fp8
part stop 130 stop --set model.precision=fp8
part fp8-local 80 finetune --set model.precision=fp8 --transport local --warm --two-nodes-only
part bf16-net 150 finetune
