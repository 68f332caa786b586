# Sourced first by the tools/device_call_*.sh scripts on the lent GPU machine (`. tools/device_call_setup.sh`): the
# shell settings, the install (tools/device_install.sh), and $res, whose files come back as one $OUT/results.tgz
# when the script exits, however it exits (the device returns a few files only). What tools/device_finetune.sh left
# in $OUT goes into it too: its runs.tgz and summary.txt (its gpus.csv and versions.txt are in each run's metrics).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. tools/device_install.sh
res=/tmp/res; mkdir -p $res
finish() {
  [ -f "$OUT/runs.tgz" ] && cp "$OUT/runs.tgz" $res/
  [ -f "$OUT/summary.txt" ] && cp "$OUT/summary.txt" $res/
  rm -f "$OUT/runs.tgz" "$OUT/summary.txt" "$OUT/gpus.csv" "$OUT/versions.txt"
  tar czf "$OUT/results.tgz" -C $res .
}
trap finish EXIT
