#!/usr/bin/env bash
# One GPU call (issue 31, 2026-11-29): build FlashAttention-3 with its variable-length kernels
# (tools/device_fa3.sh VARLEN=1, about 150 s on an H200), run its GPU test beside SDPA (one document a row, eager;
# packed and padded rows, compiled), then the speed recipe's packed rows with FlashAttention-3 cold and warm
# beside varlen (tools/plans/h200-fa3-varlen.txt), then tools/bench_attention.py if time is left.
# Usage: bash tools/device_call_fa3_varlen.sh   (carry .vendor for the FA3 source, .whl for datasets)
. tools/device_call_setup.sh
start=$(date +%s)
VARLEN=1 SKIP_BENCH=1 BUILD_TIMEOUT=300 bash tools/device_fa3.sh
echo "fa3 built at $(( $(date +%s) - start )) s"; tail -4 "$OUT/notes.txt"
export PYTHONPATH=/tmp/fa3site${PYTHONPATH:+:$PYTHONPATH}
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$HOME/.cache/gpucert/bytecode" timeout -k 10 120 \
  python3 -m pytest -q -p no:cacheprovider -k "flash_attention_3" \
  tests/gpu/test_finetune.py::test_gpucerts_own_attention_trains_as_sdpa_in_bf16 > "$res/gpu-test-fa3.txt" 2>&1
echo "fa3 gpu test exit $? at $(( $(date +%s) - start )) s"; tail -3 "$res/gpu-test-fa3.txt"
RUN_TIMEOUT=110 SKIP_INSTALL=1 bash tools/device_finetune.sh tools/plans/h200-fa3-varlen.txt
left=$(( 560 - $(date +%s) + start ))
[ $left -gt 40 ] && timeout $(( left - 10 )) python3 tools/bench_attention.py "$res/attention.json" 2>&1 | tail -20
echo "total $(( $(date +%s) - start )) s"
