#!/usr/bin/env bash
# Run on the lent 2xH200 (carry .whl: the device lacks `datasets`): two "nodes" of one GPU each on one host,
# NCCL over the network path (P2P and SHM off, NVLS off), so the cluster path runs on real GPUs.
#   STEP=accept    gpucert accept --nnodes 2 (gpucert's node agents), then the same run under two torchrun
#                  agents (every rank runs accept), each one cluster report
#   STEP=finetune  a short Qwen2-7B-shape DDP fine-tuning over two torchrun agents, then node 0 alone (the
#                  rendezvous timeout names the missing node); BASELINE=1 first runs the same workload on one
#                  GPU alone and prints the two-node run's tokens/s per GPU as a share of it (issue 13: >= 97 %)
#   STEP=verify    the GPU test tier (tests/gpu, both GPUs), then accept under two torchrun agents
#   STEP=localize  gpucert cluster localize over the two "nodes" (localhost:0, localhost:1), first idle, then with
#                  GPU 1 kept busy by a competing process (a bf16 matmul loop); FLOOR=3 also holds the pair to
#                  3 GB/s busbw; NODES=4 on a 4-GPU machine
#   STEP=faults    accept under two torchrun agents again; a 2-node fine-tuning whose rank 1 is SIGKILLed mid-run
#                  (both nodes must end within 60 s, naming it); a matmul benchmark whose rank 1 is SIGSTOPped
# Results: $OUT/cluster.tgz (reports, logs), $OUT/summary.txt. Usage: STEP=accept bash tools/device_cluster.sh
set -u
step=${STEP:?accept or finetune}
. tools/device_install.sh
export PYTHONUNBUFFERED=1
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0
mkdir -p /tmp/res
nvidia-smi -L | tee /tmp/res/gpus.txt
# Two nodes on one host: each sees both GPUs through NVML (health checks both) but drives its own.
common=(--set health.expected_gpus=2 --set bench.collectives.max_bytes=268435456
        --set bench.collectives.gate_bytes=268435456)
two_nodes() {  # NAME PORT COMMAND...: node 0 and node 1 of one run, each on its GPU, logs kept
  local name=$1 port=$2; shift 2
  local start=$(date +%s)
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node timeout 560 "$@" --nnodes 2 --node-rank $node --master-addr 127.0.0.1 \
      --master-port "$port" > "/tmp/res/$name-node$node.log" 2>&1 &
  done
  wait
  echo "$name: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}
torchrun_accept() {  # PORT: every rank of two torchrun agents runs `gpucert accept` (train left out, short sweep)
  local start=$(date +%s)
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node timeout 400 torchrun --nnodes=2 --node-rank=$node --nproc-per-node=1 \
      --master-addr=127.0.0.1 --master-port="$1" -m gpucert accept -o /tmp/res/accept-torchrun "${common[@]}" \
      --skip train --set bench.matmul.sweep_budget_s=10 > "/tmp/res/accept-torchrun-node$node.log" 2>&1 &
  done
  wait
  echo "accept-torchrun: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}
hog() {  # GPU SECONDS: a competing process that keeps one GPU busy with bf16 matmuls
  CUDA_VISIBLE_DEVICES=$1 timeout "$2" python3 -c "
import torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
i = 0
while True:
    a = (a @ a).clamp_(-1, 1); i += 1
    if i % 50 == 0: torch.cuda.synchronize()
" > /tmp/res/hog.log 2>&1 &
}
if [ "$step" = localize ]; then
  n=${NODES:-2}; hosts=(); for g in $(seq 0 $((n - 1))); do hosts+=("localhost:$g"); done
  loc=(--hosts "${hosts[@]}" --set health.expected_gpus=$n)
  start=$(date +%s)
  timeout 280 gpucert cluster localize "${loc[@]}" -o /tmp/res/localize-idle > /tmp/res/localize-idle.log 2>&1
  echo "localize-idle ($n nodes): exit $? $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  hog $((n - 1)) 300; sleep 5
  start=$(date +%s)
  timeout 280 gpucert cluster localize "${loc[@]}" -o /tmp/res/localize-slowed > /tmp/res/localize-slowed.log 2>&1
  echo "localize-slowed ($n nodes, GPU $((n - 1)) busy): exit $? $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  if [ -n "${FLOOR:-}" ]; then  # the pair judged against a floor (GB/s) too
    start=$(date +%s)
    timeout 280 gpucert cluster localize "${loc[@]}" --set localize.pair_busbw_gbps_min="$FLOOR" \
      -o /tmp/res/localize-slowed-floor > /tmp/res/localize-slowed-floor.log 2>&1
    echo "localize-slowed-floor ($FLOOR GB/s): exit $? $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  fi
  pkill -f "a = torch.randn" ; nvidia-smi --query-gpu=index,utilization.gpu --format=csv | tee -a "$OUT/summary.txt"
elif [ "$step" = accept ]; then
  two_nodes accept-agents 29610 gpucert accept -o /tmp/res/accept-agents "${common[@]}"
  torchrun_accept 29620
elif [ "$step" = verify ]; then
  ( unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE; timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu ) \
    > /tmp/res/gpu-tests.log 2>&1
  echo "tests/gpu: exit $?; $(tail -n 1 /tmp/res/gpu-tests.log)" | tee -a "$OUT/summary.txt"
  torchrun_accept 29670
elif [ "$step" = faults ]; then
  torchrun_accept 29650
  args=(--set data.source=synthetic --set train.max_steps=200 --set model.gradient_checkpointing=false
        --set model.compile=false --set model.attn_implementation=sdpa --set lora.dropout=0 --set train.parallel=ddp)
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node timeout 500 torchrun --nnodes=2 --node-rank=$node --nproc-per-node=1 \
      --master-addr=127.0.0.1 --master-port=29660 -m gpucert.finetune.train configs/finetune/qwen2-7b-speed.yaml \
      --output-dir /tmp/runs/killed "${args[@]}" > "/tmp/res/killed-node$node.log" 2>&1 &
    pids[$node]=$!
  done
  for _ in $(seq 300); do grep -q "step 3/" /tmp/res/killed-node0.log 2>/dev/null && break; sleep 1; done
  victim=$(for p in $(pgrep -f gpucert.finetune.train); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1 && echo "$p"; done | head -1)
  kill -9 "$victim"; killed=$(date +%s)
  for node in 0 1; do wait "${pids[$node]}"; echo "killed-node$node: exit $? $(( $(date +%s) - killed )) s after SIGKILL of rank 1" | tee -a "$OUT/summary.txt"; done
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 gpucert bench matmul --set bench.matmul.warmup_s=120 -o /tmp/res/stopped \
    > /tmp/res/stopped.log 2>&1 &
  bench=$!
  for _ in $(seq 120); do
    victim=$(for p in $(pgrep -f gpucert.bench.worker); do
      tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1 && echo "$p"; done | head -1)
    [ -n "$victim" ] && break; sleep 1
  done
  sleep 20; kill -STOP "$victim"; stopped=$(date +%s)
  wait "$bench"; echo "stopped: exit $? $(( $(date +%s) - stopped )) s after SIGSTOP of rank 1" | tee -a "$OUT/summary.txt"
  pgrep -af "gpucert.bench.worker|gpucert.finetune.train" | tee -a "$OUT/summary.txt"  # must print nothing
else
  args=(--set data.source=synthetic --set train.max_steps=${STEPS:-12} --set model.gradient_checkpointing=false
        --set model.compile=true --set model.attn_implementation=sdpa --set lora.dropout=0 --set train.parallel=ddp)
  if [ "${BASELINE:-0}" = 1 ]; then
    # One GPU, P2P and SHM as set above (nothing to communicate), the same workload: the denominator.
    CUDA_VISIBLE_DEVICES=0 timeout 300 torchrun --standalone --nproc-per-node=1 -m gpucert.finetune.train \
      configs/finetune/qwen2-7b-speed.yaml --output-dir /tmp/runs/one-gpu \
      "${args[@]/train.parallel=ddp/train.parallel=auto}" > /tmp/res/finetune-one-gpu.log 2>&1
    echo "finetune-one-gpu: exit $?" | tee -a "$OUT/summary.txt"
    cp /tmp/runs/one-gpu/metrics.json /tmp/res/finetune-one-gpu.json
  fi
  start=$(date +%s)
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node timeout 500 torchrun --nnodes=2 --node-rank=$node --nproc-per-node=1 \
      --master-addr=127.0.0.1 --master-port=29630 -m gpucert.finetune.train configs/finetune/qwen2-7b-speed.yaml \
      --output-dir /tmp/runs/two-nodes "${args[@]}" > "/tmp/res/finetune-node$node.log" 2>&1 &
  done
  wait
  echo "finetune-ddp-2nodes: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  cp /tmp/runs/two-nodes/metrics.json /tmp/res/finetune-two-nodes.json
  if [ "${BASELINE:-0}" = 1 ]; then
    python3 - <<'PY' | tee -a "$OUT/summary.txt"
import json
one, two = (json.load(open(f"/tmp/res/finetune-{n}.json"))["tokens_per_s_per_gpu"]["effective"]
            for n in ("one-gpu", "two-nodes"))
print(f"DDP over two nodes: {two:,.0f} tokens/s per GPU against {one:,.0f} on one GPU: {two / one:.1%}")
PY
  fi
  start=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 120 gpucert accept --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
    --master-port 29640 --set runtime.rendezvous_timeout_s=20 -o /tmp/res/alone > /tmp/res/alone.log 2>&1
  echo "node 0 alone: exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
fi
for f in /tmp/res/*.log; do echo "== $f"; tail -n 4 "$f"; done >> "$OUT/summary.txt"
tar czf "$OUT/cluster.tgz" -C /tmp res
