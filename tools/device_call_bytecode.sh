#!/usr/bin/env bash
# One GPU call (2026-11-28, issue 31 part 4): the first step with Python's bytecode in gpucert's cache (bytecode.py),
# on a machine that sets PYTHONDONTWRITEBYTECODE=1 and whose torch has no .pyc. Usage: bash tools/device_call_bytecode.sh
set -u
export NCCL_NVLS_ENABLE=0
. tools/device_install.sh
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}" | tee "$OUT/summary.txt"
for i in 1 2; do /usr/bin/time -f "torchrun --help, no prefix: %e s" torchrun --help > /dev/null; done 2>&1 | tee -a "$OUT/summary.txt"
RUN_TIMEOUT=240 SKIP_INSTALL=1 bash tools/device_finetune.sh tools/plans/h100-first-step-bytecode.txt
du -sh ~/.cache/gpucert/bytecode | tee -a "$OUT/summary.txt"; find ~/.cache/gpucert/bytecode -name '*.pyc' | wc -l | tee -a "$OUT/summary.txt"
