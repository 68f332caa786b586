#!/usr/bin/env bash
# One GPU call: install, the GPU tests (bounded: TERM at TESTS_TIMEOUT, KILL 30 s later), then tools/device_finetune.sh on a plan.
# Usage: GPU_TESTS="tests/gpu" TESTS_TIMEOUT=200 bash tools/device_session.sh PLAN
set -u
. tools/device_install.sh
if [ -n "${GPU_TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout -k 30 "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider --durations=12 $GPU_TESTS > "$OUT/gpu-tests.txt" 2>&1
  echo "gpu tests exit $?" | tee -a "$OUT/summary.txt"
  tail -25 "$OUT/gpu-tests.txt"
fi
SKIP_INSTALL=1 bash tools/device_finetune.sh "$1"
