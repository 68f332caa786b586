#!/usr/bin/env bash
# One call on one GPU machine: this tree's fine-tuning code against variants of it, alternated in the same call
# (the same line differs by 1-3 % between machines and calls, so a lever is judged only beside its absence).
# A variant is a folder of files at their repository paths (say scratch/ab-old/src/gpucert/...): a plan line
# whose name contains "-NAME" runs with the folder of variant NAME copied over the tree, which is put back after
# it. First the GPU tests named by TESTS_K (tests/gpu/test_finetune.py), then the plan's lines
# (tools/device_finetune.sh's format).
# Usage: VARIANTS="old=scratch/ab-old pad=scratch/ab-pad" TESTS_K=mlp_backward PLAN=tools/plans/FILE.txt \
#   bash tools/device_call_ab.sh   (carry .whl and each variant's folder). Results in one $OUT/results.tgz.
set -u
: "${PLAN:?PLAN: the plan file}"
declare -A variant=()
for pair in ${VARIANTS:-}; do
  name=${pair%%=*} dir=${pair#*=}
  # Else a line meant for the variant would measure this tree under the variant's name.
  [ -d "$dir" ] || { echo "variant $name: $dir is no folder (carry it)" >&2; exit 2; }
  variant[$name]=$dir
done
. tools/device_call_setup.sh
start=$(date +%s)
# This tree's version of every file some variant replaces, put back after each line and however the script ends.
saved=/tmp/ab-saved; rm -rf $saved; mkdir -p $saved
for dir in "${variant[@]}"; do
  (cd "$dir" && find . -type f) | while read -r f; do mkdir -p "$saved/$(dirname "$f")"; cp "$f" "$saved/$f"; done
done
restore() { cp -r $saved/. .; }
trap 'restore; finish' EXIT
if [ -n "${TESTS_K:-}" ]; then
  timeout -k 10 ${TEST_TIMEOUT:-200} python3 -m pytest -q -s tests/gpu/test_finetune.py -k "$TESTS_K" > $res/gpu-tests.txt 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - start )) s"; grep -E "passed|failed|Error" $res/gpu-tests.txt | tail -n 5
fi
while read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  name=${line%% *}
  for v in "${!variant[@]}"; do
    if [[ "$name" == *-"$v"* ]]; then cp -r "${variant[$v]}/." . || exit 2; fi
  done
  echo "$line" > /tmp/plan-line.txt
  RUN_TIMEOUT=${RUN_TIMEOUT:-150} SKIP_INSTALL=1 bash tools/device_finetune.sh /tmp/plan-line.txt < /dev/null
  restore
done < "$PLAN"
echo "done at $(( $(date +%s) - start )) s"
