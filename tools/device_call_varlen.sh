#!/usr/bin/env bash
# One GPU call (issue 31, parts 4 and 5): torch's own varlen attention (model.attn_implementation varlen) on the GPU
# for the first time. Its GPU test (each path in bf16 as close to fp32 as SDPA's bf16), then the speed recipe with
# flex attention against varlen, each on its own empty compile cache and then warm (tools/plans/h100-varlen.txt),
# then the FP8 tiny-run parity test if time is left (FP8_TIMEOUT=0: not). Usage: bash tools/device_call_varlen.sh;
# the second call: PLAN=tools/plans/h100-varlen-b.txt TEST_K="varlen and packed" FP8_TIMEOUT=0 bash tools/device_call_varlen.sh
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/summary.txt"
# The test runs with gpucert's bytecode cache as its prefix (what the entry points set), so the plan's cold runs
# below find torch's, transformers' and inductor's bytecode already there: their cold rows differ by compile only.
start=$(date +%s)
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$HOME/.cache/gpucert/bytecode" timeout -k 20 "${TEST_TIMEOUT:-150}" \
  python3 -m pytest -q -p no:cacheprovider --durations=6 -k "${TEST_K:-varlen}" \
  "tests/gpu/test_finetune.py::test_gpucerts_own_attention_trains_as_sdpa_in_bf16" > "$OUT/gpu-test-varlen.txt" 2>&1
echo "varlen gpu test exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"; tail -8 "$OUT/gpu-test-varlen.txt"
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$HOME/.cache/gpucert/bytecode" python3 -c 'import gpucert.finetune.train.run'
RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh "${PLAN:-tools/plans/h100-varlen.txt}"
start=$(date +%s)
[ "${FP8_TIMEOUT:-90}" = 0 ] && exit 0
timeout -k 20 "${FP8_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider --durations=4 \
  "tests/gpu/test_finetune_fp8.py::test_a_tiny_run_in_fp8_follows_the_bf16_run" > "$OUT/gpu-test-fp8.txt" 2>&1
echo "fp8 tiny-run test exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"; tail -6 "$OUT/gpu-test-fp8.txt"
