# Sourced first by the tools/device_call_*.sh scripts on the lent GPU machine (`. tools/device_call_setup.sh`): the
# shell settings, the install (tools/device_install.sh), and $res, whose files come back as one $OUT/results.tgz
# when the script exits, however it exits (the device returns a few files only). A runs.tgz that
# tools/device_finetune.sh left in $OUT goes into it too.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
res=/tmp/res; mkdir -p $res
finish() { [ -f "$OUT/runs.tgz" ] && cp "$OUT/runs.tgz" $res/; rm -f "$OUT/runs.tgz"; tar czf "$OUT/results.tgz" -C $res . ; }
trap finish EXIT
