#!/usr/bin/env bash
# One call on one H200 (2026-11-29, issue 31 part 5): FP8 with its adapters in the frozen GEMMs (fp8_in_gemm.py).
# First the tiny FP8-vs-bf16 loss parity test, which now runs the adapters in the FP8 GEMMs, then the 7B speed
# lines of tools/plans/h200-fp8-in-gemm.txt (in-GEMM off and on, alternated). Results in one $OUT/results.tgz.
# Usage: bash tools/device_call_fp8_in_gemm.sh (carry .whl)
# Measured at commit 858e7e4, which held fp8_in_gemm.py; reverted in the next commit (4 % slower), so on later
# commits model.adapters_in_gemm is off in fp8 and both variants run the adapters beside the FP8 GEMMs.
. tools/device_call_setup.sh
start=$(date +%s)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout -k 10 ${TEST_TIMEOUT:-200} python3 -m pytest -x -q -s tests/gpu/test_finetune_fp8.py ${TESTS_K:+-k "$TESTS_K"} \
    > $res/gpu-tests.txt 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - start )) s"; tail -n 5 $res/gpu-tests.txt
fi
RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh ${PLAN:-tools/plans/h200-fp8-in-gemm.txt}
echo "done at $(( $(date +%s) - start )) s"
