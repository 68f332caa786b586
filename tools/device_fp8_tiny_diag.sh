#!/usr/bin/env bash
# One GPU call (2026-11-28): the bf16 half of tests/gpu/test_finetune_fp8.py's tiny run, as the test starts it,
# with its output kept (the test captures it and was cut off at 300 s twice with nothing to show).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
python3 - <<'PY'
from pathlib import Path
import sys
sys.path.insert(0, ".")
from tests.gpu.test_finetune_fp8 import CONFIG, aligned_tiny_model
tmp = Path("/tmp/fp8diag"); tmp.mkdir(exist_ok=True)
model = aligned_tiny_model(tmp)
(tmp / "tiny-aligned.yaml").write_text(CONFIG.replace("MODEL", str(model)).replace("CACHE", str(tmp / "cache")))
PY
start=$(date +%s)
timeout -k 10 "${DIAG_TIMEOUT:-170}" torchrun --standalone --nproc-per-node=1 -m gpucert.finetune.train /tmp/fp8diag/tiny-aligned.yaml \
  --output-dir /tmp/fp8diag/bf16 2>&1 | while IFS= read -r line; do echo "$(( $(date +%s) - start ))s $line"; done > "$OUT/bf16.log"
echo "exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s" | tee -a "$OUT/bf16.log"
grep -v "^[0-9]*s \[finetune\] step [0-9]*/" "$OUT/bf16.log" | tail -40
