#!/usr/bin/env bash
# Run on the lent 4-GPU machine (carry .whl): the multi-node launch path on GPUs, as two "nodes" of two GPUs,
# each its own torchrun agent (static rendezvous, --node-rank 0/1) over NCCL, the Qwen2-7B shape with DDP.
# Usage: [PER_NODE=4] bash tools/device_two_nodes.sh  (GPUs per "node", 2 by default; metrics in $OUT/two-nodes.json)
set -u
. tools/device_install.sh
export PYTHONUNBUFFERED=1
args=(--set data.source=synthetic --set train.max_steps=10 --set model.gradient_checkpointing=false
      --set model.compile=true --set model.attn_implementation=sdpa --set lora.dropout=0 --set train.parallel=ddp)
per=${PER_NODE:-2}
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=$(seq -s, $((per * node)) $((per * node + per - 1))) timeout 300 torchrun --nnodes=2 \
    --node-rank=$node --nproc-per-node="$per" --master-addr=127.0.0.1 --master-port=29533 -m gpucert.finetune.train \
    configs/finetune/qwen2-7b-speed.yaml --output-dir /tmp/runs/two-nodes "${args[@]}" > "/tmp/node$node.log" 2>&1 &
done
wait
tail -5 /tmp/node0.log; tail -3 /tmp/node1.log
cp /tmp/runs/two-nodes/metrics.json "$OUT/two-nodes.json"
