#!/usr/bin/env bash
# One call on one GPU (2026-11-29, seventh session): the session's code as a user meets it, `gpucert accept` as the
# README prints it (its first line now `starting 1 rank on ...`), then the GPU tests, each under its own limit.
# Usage: bash tools/device_call_h200_check.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
start=$(date +%s)
said() { echo "$1 exit $2 at $(( $(date +%s) - start )) s" | tee -a $res/summary.txt; }
COLUMNS=160 timeout -k 10 170 gpucert accept --set health.expected_gpus=1 -o /tmp/accept > $res/accept.txt 2> $res/accept-stderr.txt
said accept $?
head -3 $res/accept-stderr.txt | tee -a $res/summary.txt
tail -3 $res/accept.txt | tee -a $res/summary.txt
cp /tmp/accept/report.json $res/ 2>/dev/null
timeout -k 10 400 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x > $res/pytest-gpu.txt 2>&1
said pytest-gpu $?
tail -3 $res/pytest-gpu.txt | tee -a $res/summary.txt
