#!/usr/bin/env bash
# One call on one H200 (2026-11-29, issue 31 part 5): the FP8 MLP as one function (fp8_mlp.py). First the GPU
# tests named by TESTS_K in tests/gpu/test_finetune_fp8.py (the kernels against their reference at Qwen2-7B's
# shape; the tiny FP8-vs-bf16 loss parity run), then the 7B lines of $PLAN
# (default tools/plans/h200-fp8-mlp.txt). Results in one $OUT/results.tgz.
# Usage: TESTS_K="fp8_mlp" bash tools/device_call_fp8_mlp.sh (carry .whl); SKIP_TESTS=1, SKIP_RUNS=1 leave parts out.
. tools/device_call_setup.sh
start=$(date +%s)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout -k 10 ${TEST_TIMEOUT:-200} python3 -m pytest -q -s tests/gpu/test_finetune_fp8.py ${TESTS_K:+-k "$TESTS_K"} \
    > $res/gpu-tests.txt 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - start )) s"; grep -E "FP8 MLP|passed|failed|Error" $res/gpu-tests.txt | tail -n 12
fi
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh ${PLAN:-tools/plans/h200-fp8-mlp.txt}
fi
echo "done at $(( $(date +%s) - start )) s"
