#!/usr/bin/env bash
# Run on the lent GPU machine: build FlashAttention-3 (Dao-AILab/flash-attention hopper/, bf16, head dim 128,
# Hopper only) from the source carried in .vendor/fa3/fa3-src.tar.xz, then time it against SDPA's cuDNN kernels
# (tools/bench_attention.py). FlashAttention-3 has no wheel for the device's torch and CUDA 13, and its full build
# takes hours: the FLASH_ATTENTION_DISABLE_* switches leave the one kernel family the 7B models use.
# The wheel comes back in $OUT when it fits (carry it to later calls instead of building again).
# Make the tarball here (git-ignored; never committed):
#   (cd <flash-attention checkout> && git archive HEAD hopper README.md) | tar -x -C /tmp/fa
#   (cd <cutlass checkout at the submodule's commit> && git archive HEAD include) | tar -x -C /tmp/fa/csrc/cutlass
#   tar -cJf .vendor/fa3/fa3-src.tar.xz -C /tmp fa
# Usage: bash tools/device_fa3.sh   (env VARLEN=1 keeps the variable-length kernels packed rows need; SKIP_BENCH=1
# builds only; the wheel is installed under /tmp/fa3site)
set -u
export PYTHONUNBUFFERED=1
src=.vendor/fa3/fa3-src.tar.xz
rm -rf /tmp/fa && tar -xJf "$src" -C /tmp
python3 -c "import pyarrow; print('device pyarrow', pyarrow.__version__)" | tee "$OUT/notes.txt"
nvcc --version | tail -2 | tee -a "$OUT/notes.txt"
for f in SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 FP8 CLUSTER HDIM64 HDIM96 HDIM192 HDIM256 SM80 \
  HDIMDIFF64 HDIMDIFF192; do
  export "FLASH_ATTENTION_DISABLE_$f=TRUE"
done
[ "${VARLEN:-0}" = 1 ] || export FLASH_ATTENTION_DISABLE_VARLEN=TRUE
start=$(date +%s)
(
  cd /tmp/fa/hopper &&
    FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS=8 NVCC_THREADS=4 timeout "${BUILD_TIMEOUT:-420}" \
      python3 setup.py bdist_wheel > /tmp/fa3-build.log 2>&1
)
echo "build exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/notes.txt"
grep -iE "error|warning: .*spill|bytes stack frame" /tmp/fa3-build.log | head -20 >> "$OUT/notes.txt"
tail -30 /tmp/fa3-build.log > "$OUT/fa3-build-tail.log"
wheel=$(ls /tmp/fa/hopper/dist/*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  ls -la "$wheel" | tee -a "$OUT/notes.txt"
  python3 -m pip install -q --no-deps --no-index --target /tmp/fa3site "$wheel"
  export PYTHONPATH=/tmp/fa3site${PYTHONPATH:+:$PYTHONPATH}
  [ "$(stat -c %s "$wheel")" -lt 16000000 ] && cp "$wheel" "$OUT/"
fi
[ "${SKIP_BENCH:-0}" = 1 ] || timeout 240 python3 tools/bench_attention.py "$OUT/attention.json" 2>&1 | tail -80
