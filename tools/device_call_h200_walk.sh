#!/usr/bin/env bash
# One call on one GPU (2026-11-29, ninth session): the fine-tuning paths the session changed, as a user meets them
# with the 7B speed recipe from a directory outside the checkout, then the GPU tests.
#   1. a 6-step run (cold compile cache), its verdict line and tokens/s;
#   2. the same command into the same --output: refused in one line before any rank starts (was: rank 0's setup);
#   3. --resume auto with train.lr changed: refused naming both values; with train.max_steps=9: steps 7-9 trained;
#   4. SIGTERM mid-run to a lone run: exit 143 and the checkpoint --resume auto continues from;
#   5. pytest -m gpu tests/gpu.
# Usage: bash tools/device_call_h200_walk.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
start=$(date +%s)
said() { echo "$1 exit $2 at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt; }
mkdir -p /tmp/w && cd /tmp/w
FT="gpucert finetune --config qwen2-7b-speed"  # word-split on purpose: timeout runs a command, not a function
timeout -k 10 240 $FT --set train.max_steps=6 --set train.save_every=3 -o /tmp/w/spd > $res/1-run.txt 2> $res/1-run-stderr.txt
said 1-run $?
tail -1 $res/1-run.txt | tee -a $res/summary.txt
grep -E "step 6/6" $res/1-run-stderr.txt | tee -a $res/summary.txt
cp /tmp/w/spd/metrics.json $res/1-metrics.json 2>/dev/null
t0=$(date +%s.%N)
timeout -k 10 60 $FT --set train.max_steps=6 -o /tmp/w/spd > /dev/null 2> $res/2-again.txt
rc=$?; echo "2-again took $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s" | tee -a $res/summary.txt
said 2-again $rc
tail -1 $res/2-again.txt | cut -c1-300 | tee -a $res/summary.txt
timeout -k 10 60 $FT --set train.max_steps=9 --set train.lr=1e-3 --resume auto -o /tmp/w/spd > /dev/null 2> $res/3-lr.txt
said 3-lr $?
tail -1 $res/3-lr.txt | cut -c1-300 | tee -a $res/summary.txt
timeout -k 10 200 $FT --set train.max_steps=9 --set train.save_every=3 --resume auto -o /tmp/w/spd > $res/3-more.txt 2> $res/3-more-stderr.txt
said 3-more $?
grep -E "resumed from|step [6-9]/9" $res/3-more-stderr.txt | cut -c1-160 | tee -a $res/summary.txt
timeout --preserve-status -k 10 -s TERM 110 $FT --set train.max_steps=200 --set train.save_every=5 -o /tmp/w/term > /dev/null 2> $res/4-term.txt
said 4-sigterm $?
tail -2 $res/4-term.txt | cut -c1-300 | tee -a $res/summary.txt
cd - > /dev/null
timeout -k 10 400 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x > $res/pytest-gpu.txt 2>&1
said pytest-gpu $?
tail -3 $res/pytest-gpu.txt | tee -a $res/summary.txt
