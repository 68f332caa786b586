#!/usr/bin/env bash
# One GPU call (2026-11-28, issue 31): the FP8 tiny-run parity test (bf16 and FP8 runs of 20 steps through
# `python -m gpucert.finetune.train`, which also fill gpucert's bytecode cache), then the speed recipe as shipped
# (varlen attention) cold and warm (tools/plans/h100-varlen-c.txt). Usage: bash tools/device_call_fp8_varlen.sh
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/summary.txt"
start=$(date +%s)
timeout -k 20 "${FP8_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider --durations=4 \
  "tests/gpu/test_finetune_fp8.py::test_a_tiny_run_in_fp8_follows_the_bf16_run" > "$OUT/gpu-test-fp8.txt" 2>&1
echo "fp8 tiny-run test exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"; tail -12 "$OUT/gpu-test-fp8.txt"
RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh tools/plans/h100-varlen-c.txt
