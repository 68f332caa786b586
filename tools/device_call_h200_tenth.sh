#!/usr/bin/env bash
# One call on one GPU (2026-11-29, tenth session): the README's main job and the 7B speed recipe as a user runs them
# from a directory outside the checkout, at this session's last code commit, then the GPU tests.
#   1. `gpucert accept` (the README's first line on a GPU node): verdict line and time;
#   2. a config file with three mistakes: all three said at once, each with its line, before any rank starts;
#   3. the 7B speed recipe, 6 steps, cold compile cache: verdict, tokens/s, time to the first step;
#   4. pytest -m gpu tests/gpu.
# Usage: bash tools/device_call_h200_tenth.sh, then PART=tests bash tools/device_call_h200_tenth.sh while the machine
# is still warm (carry .whl): the four steps do not fit one call's 600 s.
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
echo "code ${COMMIT:-?}" | tee -a $res/summary.txt
start=$(date +%s)
said() { echo "$1 exit $2 at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt; }
if [ "${PART:-run}" = tests ]; then
  timeout -k 10 450 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider > $res/pytest-gpu.txt 2>&1
  said pytest-gpu $?
  tail -3 $res/pytest-gpu.txt | tee -a $res/summary.txt
  exit
fi
mkdir -p /tmp/w && cd /tmp/w
timeout -k 10 240 gpucert accept -o /tmp/w/accept > $res/1-accept.txt 2> $res/1-accept-stderr.txt
said 1-accept $?
tail -1 /tmp/w/accept/report.md 2>/dev/null | cut -c1-200 | tee -a $res/summary.txt
grep -E "^verdict" $res/1-accept.txt | tee -a $res/summary.txt
cp /tmp/w/accept/report.json $res/1-accept.json 2>/dev/null
printf 'train:\n  lr: fast\n  max_stepz: 5\nmodel:\n  name: tiny\n  bogus: 1\n' > bad.yaml
t0=$(date +%s.%N)
timeout -k 10 60 gpucert finetune --config bad.yaml -o /tmp/w/bad > /dev/null 2> $res/2-bad.txt
rc=$?; echo "2-bad took $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s" | tee -a $res/summary.txt
said 2-bad $rc
cut -c1-160 $res/2-bad.txt | tee -a $res/summary.txt
ls /tmp/w/bad 2>&1 | head -2 | tee -a $res/summary.txt
timeout -k 10 240 gpucert finetune --config qwen2-7b-speed --set train.max_steps=6 -o /tmp/w/spd > $res/3-run.txt 2> $res/3-run-stderr.txt
said 3-speed $?
tail -1 $res/3-run.txt | tee -a $res/summary.txt
grep -E "loading|step 1/6|step 6/6|first step" $res/3-run-stderr.txt | cut -c1-200 | tee -a $res/summary.txt
cp /tmp/w/spd/metrics.json $res/3-metrics.json 2>/dev/null
