#!/usr/bin/env bash
# One call on one H200 (2026-11-29, issue 31 part 5): the FP8 MLP's kernels at several tilings and the MLP fused
# and unfused with their kernels (tools/bench_swiglu_fp8.py); then, with the fastest tilings written into this
# call's copy of kernels/swiglu_fp8.py (not committed), the GPU tests named by TESTS_K and the first PLAN_LINES
# lines of $PLAN (default tools/plans/h200-fp8-mlp.txt). Results in one $OUT/results.tgz. Usage: bash tools/device_call_fp8_mlp_tune.sh
. tools/device_call_setup.sh
start=$(date +%s)
timeout -k 10 ${BENCH_TIMEOUT:-240} python3 tools/bench_swiglu_fp8.py > $res/bench.txt 2>&1
echo "bench exit $? at $(( $(date +%s) - start )) s"; grep -v "^{" $res/bench.txt | tail -n 40
python3 - "$res/bench.txt" <<'PY'
import ast, json, re, sys
found = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
path = "src/gpucert/finetune/model/kernels/swiglu_fp8.py"
src = open(path).read()
default = {n: ast.literal_eval(re.search(rf"^{n} = (.*)$", src, re.M).group(1)) for n in ("BWD_TILING", "QUANT_TILING")}
fwd = {ast.literal_eval(k[len("forward "):]): v["ms"] for k, v in found.items() if k.startswith("forward ")}
pairs = {}
for k, v in found.items():
    if k.startswith("backward "):
        b, q = k[len("backward "):].split(" quant ")
        pairs[(ast.literal_eval(b), ast.literal_eval(q))] = v["ms"]
picks = {
    "FWD_TILING": min(fwd, key=fwd.get),
    "BWD_TILING": min((p for p in pairs if p[1] == default["QUANT_TILING"]), key=pairs.get)[0],
    "QUANT_TILING": min((p for p in pairs if p[0] == default["BWD_TILING"]), key=pairs.get)[1],
}
for name, value in picks.items():
    src = re.sub(rf"^{name} = .*$", f"{name} = {value}", src, flags=re.M)
open(path, "w").write(src)
print("tilings for the runs:", picks)
PY
grep -E "^(FWD|BWD|QUANT)_TILING" src/gpucert/finetune/model/kernels/swiglu_fp8.py | tee $res/tilings.txt
if [ -n "${TESTS_K:-}" ]; then
  timeout -k 10 ${TEST_TIMEOUT:-120} python3 -m pytest -q -s tests/gpu/test_finetune_fp8.py -k "$TESTS_K" > $res/gpu-tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "FP8 MLP|passed|failed" $res/gpu-tests.txt | tail -n 5
fi
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  head -n ${PLAN_LINES:-6} ${PLAN:-tools/plans/h200-fp8-mlp.txt} > /tmp/plan.txt
  RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh /tmp/plan.txt
fi
echo "done at $(( $(date +%s) - start )) s"
