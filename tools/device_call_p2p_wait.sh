#!/usr/bin/env bash
# One call on a machine of 2 or more GPUs (2026-11-29, seventh session): what the other ranks do while local rank 0
# measures the p2p matrix (tools/p2p_wait_check.py: NCCL barrier, host wait, NCCL barrier again), then gpucert's
# own `bench p2p` and `accept` at this code (the other ranks wait on the host, group.host_barrier).
# Usage: [SKIP_ACCEPT=1] bash tools/device_call_p2p_wait.sh (carry .whl)
. tools/device_call_setup.sh
n=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
nvidia-smi topo -m > $res/topo.txt 2>&1
start=$(date +%s)
said() { echo "$1 exit $2 at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt; }
timeout -k 10 150 torchrun --nproc-per-node $n tools/p2p_wait_check.py --out $res > $res/p2p-wait.txt 2>&1
said p2p-wait $?
grep -E "^(nccl|host)" $res/p2p-wait.txt | tee -a $res/summary.txt
COLUMNS=160 timeout -k 10 120 gpucert bench p2p -o /tmp/bench-p2p > $res/bench-p2p.txt 2>&1
said bench-p2p $?
cp /tmp/bench-p2p/report.json $res/bench-p2p.json 2>/dev/null
grep -E "^(PASS|FAIL|WARN|ERROR) *\| p2p.matrix" $res/bench-p2p.txt | cut -c1-200 | tee -a $res/summary.txt
[ -n "${SKIP_ACCEPT:-}" ] && exit 0  # SKIP_ACCEPT=1: the two measurements above only (about 3 minutes less)
COLUMNS=160 timeout -k 10 240 gpucert accept --set health.expected_gpus=$n -o /tmp/accept > $res/accept.txt 2>&1
said accept $?
cp /tmp/accept/report.json /tmp/accept/report.md /tmp/accept/report.html $res/ 2>/dev/null
tail -3 $res/accept.txt | tee -a $res/summary.txt
