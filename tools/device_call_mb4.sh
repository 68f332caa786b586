#!/usr/bin/env bash
# One GPU call (2026-11-28): where a warm start's imports go now (bytecode cache warm), how long CUDA's first touch
# takes, micro-batch 4 against auto, then the GPU tests the rooms split had not re-run (bounded).
set -u
export NCCL_NVLS_ENABLE=0
. tools/device_install.sh
export PYTHONPYCACHEPREFIX="$HOME/.cache/gpucert/bytecode"  # what gpucert's entry points set: the profile below reads it
python3 -c 'import sys; sys.dont_write_bytecode = False; import gpucert.finetune.train.run' 2>/dev/null  # fills it
python3 -c 'import sys; sys.dont_write_bytecode = False; import torch.distributed.run'
{
  for i in 1 2; do /usr/bin/time -f "import run, bytecode cache warm: %e s" python3 -c 'import gpucert.finetune.train.run'; done
  python3 -c 'import time, torch; t = time.time(); torch.zeros(1, device="cuda"); print(f"CUDA first touch: {time.time() - t:.2f} s")'
  python3 -X importtime -c 'import gpucert.finetune.train.run' 2> /tmp/it.txt
  echo "== self"; sort -t'|' -k1.13 -n -r /tmp/it.txt | head -20
  echo "== cumulative"; sort -t'|' -k2 -n -r /tmp/it.txt | head -45
} > "$OUT/imports-warm.txt" 2>&1
head -4 "$OUT/imports-warm.txt"
unset PYTHONPYCACHEPREFIX
RUN_TIMEOUT=200 SKIP_INSTALL=1 bash tools/device_finetune.sh tools/plans/h100-microbatch4.txt
timeout -k 20 "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider --durations=8 \
  "tests/gpu/test_finetune_fp8.py::test_a_tiny_run_in_fp8_follows_the_bf16_run" \
  "tests/gpu/test_finetune_fp8.py::test_fp8_trains_under_ddp_on_all_gpus" \
  tests/gpu/test_live_node.py > "$OUT/gpu-tests.txt" 2>&1
echo "gpu tests exit $?" | tee -a "$OUT/summary.txt"; tail -15 "$OUT/gpu-tests.txt"
