#!/usr/bin/env bash
# Run on the lent GPU machine (carry .whl and .bfcl): `gpucert evaluate --suite bfcl` on the Qwen2-7B shape.
# .bfcl holds BFCL v4's data files (questions and possible_answer/) copied from gorilla's bfcl_eval/data, which
# the GPU machine cannot download. A short fine-tuning run of the speed recipe (random weights) makes the adapter;
# the scores are meaningless (random weights), the time per category and the pipeline are what is measured.
# Usage: LIMIT=25 bash tools/device_bfcl.sh   (the first LIMIT entries of each category; $OUT/bfcl/ gets the report)
set -u
. tools/device_install.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start=$(date +%s)
gpucert finetune --config qwen2-7b-speed --output /tmp/ft --set train.max_steps=2 --set model.compile=false \
  > /tmp/ft.log 2>&1
echo "finetune exit $? in $(( $(date +%s) - start )) s"; tail -3 /tmp/ft.log
adapter=$(dirname "$(find /tmp/ft -path '*/adapter/adapter_config.json' | head -1)")
start=$(date +%s)
gpucert evaluate --config qwen2-7b-speed --adapter "$adapter" --suite bfcl --bfcl-data .bfcl --bfcl-limit "${LIMIT:-25}" \
  --output "$OUT/bfcl" ${EXTRA:-} 2>&1 | tail -40
echo "evaluate exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"
