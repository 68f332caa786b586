#!/usr/bin/env bash
# Run on the lent GPU machine: the burn's GPU tests, `gpucert bench burn` on every GPU, then the burn and the
# matmul benchmark again with tools/load_gpu.py keeping GPU 1 busy (2+ GPUs). Usage: bash tools/device_burn.sh [30s]
set -u
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1 COLUMNS=160
duration=${1:-30s}
python3 -m pytest -m gpu tests/gpu/test_bench_burn.py -q -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
gpucert bench burn --duration "$duration" -o /tmp/burn-clean > "$OUT/burn-clean.txt" 2>&1
echo "burn, nothing else running: exit $?"
cp /tmp/burn-clean/report.json "$OUT/burn-clean.json"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  python3 tools/load_gpu.py --gpu 1 --seconds 900 &
  load=$!
  sleep 5
  gpucert bench burn --duration "$duration" -o /tmp/burn-busy > "$OUT/burn-busy.txt" 2>&1
  echo "burn, GPU 1 busy: exit $?"
  gpucert bench matmul --set bench.matmul.sweep_budget_s=10 --set bench.matmul.warmup_s=3 \
    --set 'bench.matmul.dtypes=[bf16,fp32]' -o /tmp/mm-busy > "$OUT/matmul-busy.txt" 2>&1
  echo "matmul, GPU 1 busy: exit $?"
  kill "$load"
  cp /tmp/burn-busy/report.json "$OUT/burn-busy.json"
  cp /tmp/mm-busy/report.json "$OUT/matmul-busy.json"
fi
grep -hE "burn\.|matmul\.(bf16|fp32)\.|telemetry\." "$OUT"/*.txt | cut -c1-220
