#!/usr/bin/env bash
# Second call on a 2 x H200 machine (2026-11-28, issue 31), after tools/device_call_h200x2.sh, whose two-node
# metrics did not come back (the device returns a few files only: everything now goes into one results.tgz):
#  1. where a 7B model's load goes (tools/model_load_time.py): the Mistral recipe on GPU 0, the speed recipe on
#     GPU 1, at once;
#  2. the speed recipe across two "nodes" on an empty shared compile cache, then one GPU on the warm cache
#     (tools/two_nodes_gpu.py finetune), with each rank's compile counters;
#  3. tests/gpu/test_finetune_fp8.py's FP8 DDP test over both GPUs.
# Usage: bash tools/device_call_h200x2_b.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
start=$(date +%s)
mistral=(--set model.name=configs/finetune/models/mistral-7b --set model.random_init=true --set data.source=synthetic)
CUDA_VISIBLE_DEVICES=0 timeout -k 10 120 python3 tools/model_load_time.py configs/finetune/mistral-7b-alpaca.yaml \
  "${mistral[@]}" > $res/load-mistral.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout -k 10 120 python3 tools/model_load_time.py configs/finetune/qwen2-7b-speed.yaml \
  > $res/load-qwen.txt 2>&1
wait
tail -n 3 $res/load-mistral.txt $res/load-qwen.txt | tee -a $res/summary.txt
echo "loads done at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt
timeout -k 20 "${TWO_NODES_TIMEOUT:-240}" python3 tools/two_nodes_gpu.py finetune --out $res/two-nodes \
  > $res/two-nodes-stdout.txt 2>&1
echo "two nodes exit $? at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt
cp /tmp/ft-two-nodes/metrics.json $res/two-nodes-metrics.json 2>/dev/null
cp /tmp/ft-one-gpu/metrics.json $res/one-gpu-metrics.json 2>/dev/null
python3 - <<'PY' | tee -a $res/summary.txt
import json
for name in ("two-nodes", "one-gpu"):
    try:
        m = json.load(open(f"/tmp/res/{name}-metrics.json"))
    except OSError:
        print(name, "no metrics"); continue
    print(name, m["status"], f"{m['tokens_per_s_per_gpu']['effective']:,.0f} tok/s/GPU",
          f"first step after {m['time_to_first_step_s']:.1f} s")
    for r in m["compile"]["ranks"]:
        w = r.get("warm_up") or {}
        print(f"  rank {r['rank']}: {w.get('order')} {w.get('seconds', 0):.1f} s (waited {w.get('waited_s', 0):.1f}) {w.get('counters')}")
PY
timeout -k 20 "${DDP_TIMEOUT:-200}" python3 -m pytest -q -s -p no:cacheprovider --durations=3 \
  "tests/gpu/test_finetune_fp8.py::test_fp8_trains_under_ddp_on_all_gpus" > $res/gpu-test-fp8-ddp.txt 2>&1
echo "fp8 ddp test exit $? at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt
tail -4 $res/gpu-test-fp8-ddp.txt
