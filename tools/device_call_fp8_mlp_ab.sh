#!/usr/bin/env bash
# One call on one H200 (issue 31 part 5): the FP8 MLP's kernels as in this tree against an earlier copy of
# kernels/swiglu_fp8.py, in the same call. First the kernels' tilings (tools/bench_swiglu_fp8.py kernels), then
# the GPU tests named by TESTS_K (tests/gpu/test_finetune_fp8.py), then the lines of $PLAN: a line whose name ends
# in "-old" runs with $OLD copied over kernels/swiglu_fp8.py (put back after it), so the two alternate.
# Usage: git show f58ac59:src/gpucert/finetune/model/kernels/swiglu_fp8.py > scratch/swiglu_fp8_f58ac59.py;
# OLD=scratch/swiglu_fp8_f58ac59.py PLAN=tools/plans/h200-fp8-hpass.txt bash tools/device_call_fp8_mlp_ab.sh
# (carry .whl and the folder of OLD). Results in one $OUT/results.tgz.
kernels=src/gpucert/finetune/model/kernels/swiglu_fp8.py
if grep -q -- "-old " "${PLAN:?PLAN: the plan file}" && [ ! -f "${OLD:-}" ]; then
  # Else each "-old" run would measure this tree's kernels under the old name.
  echo "OLD=${OLD:-} is no file: give the earlier kernels/swiglu_fp8.py and carry its folder" >&2; exit 2
fi
. tools/device_call_setup.sh
start=$(date +%s)
cp $kernels /tmp/swiglu_fp8_new.py
# This tree's kernels back in place however the script ends; then the results, as device_call_setup.sh does.
trap 'cp /tmp/swiglu_fp8_new.py $kernels; finish' EXIT
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout -k 10 ${BENCH_TIMEOUT:-120} python3 tools/bench_swiglu_fp8.py kernels > $res/bench.txt 2>&1
  echo "bench exit $? at $(( $(date +%s) - start )) s"; grep -v "^{" $res/bench.txt | tail -n 20
fi
if [ -n "${TESTS_K:-}" ]; then
  timeout -k 10 ${TEST_TIMEOUT:-200} python3 -m pytest -q -s tests/gpu/test_finetune_fp8.py -k "$TESTS_K" > $res/gpu-tests.txt 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - start )) s"; grep -E "passed|failed|Error" $res/gpu-tests.txt | tail -n 5
fi
while read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  name=${line%% *}
  if [[ "$name" == *-old ]]; then cp "$OLD" $kernels || exit 2; fi
  echo "$line" > /tmp/plan-line.txt
  RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh /tmp/plan-line.txt < /dev/null
  cp /tmp/swiglu_fp8_new.py $kernels
done < "$PLAN"
echo "done at $(( $(date +%s) - start )) s"
