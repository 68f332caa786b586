#!/usr/bin/env bash
# Third call on a 2 x H200 machine (2026-11-28, issue 31 part 4), the adapters now built on the GPU:
#  GPU 0: where the model's load goes (tools/model_load_time.py, both recipes, with PEFT's CPU build profiled
#         beside), then the speed recipe cold and warm (tools/plans/h200-speed-first-step.txt);
#  GPU 1: the Mistral recipe cold and warm (tools/plans/h200-mistral.txt).
# Results in one $OUT/results.tgz. Usage: bash tools/device_call_h200x2_c.sh (carry .whl)
. tools/device_call_setup.sh
start=$(date +%s)
(
  export CUDA_VISIBLE_DEVICES=0
  mistral=(--set model.name=configs/finetune/models/mistral-7b --set model.random_init=true --set data.source=synthetic)
  timeout -k 10 150 python3 tools/model_load_time.py configs/finetune/mistral-7b-alpaca.yaml "${mistral[@]}" \
    > $res/load-mistral.txt 2>&1
  timeout -k 10 150 python3 tools/model_load_time.py configs/finetune/qwen2-7b-speed.yaml > $res/load-qwen.txt 2>&1
  grep -h "s (\|get_peft_model, " $res/load-mistral.txt $res/load-qwen.txt
  echo "loads done at $(( $(date +%s) - start )) s"
) > $res/gpu0.txt 2>&1 &
gpu0=$!
CONFIG=configs/finetune/mistral-7b-alpaca.yaml RUN_TIMEOUT=170 SKIP_INSTALL=1 \
  bash tools/device_finetune.sh tools/plans/h200-mistral.txt
wait $gpu0
cat $res/gpu0.txt
RUN_TIMEOUT=170 SKIP_INSTALL=1 bash tools/device_finetune.sh tools/plans/h200-speed-first-step.txt
echo "done at $(( $(date +%s) - start )) s"
cp "$OUT/summary.txt" $res/ 2>/dev/null; rm -f "$OUT/summary.txt" "$OUT/gpus.csv" "$OUT/versions.txt"
cat $res/summary.txt
