#!/usr/bin/env bash
# One call on a 2 x H200 machine (2026-11-30, eleventh session): `gpucert finetune --nproc 2 2>&1 | head`, one rank
# per GPU over NCCL, as a user pipes it: how long from the reader leaving to the job's end, its exit code (141), what
# rank 1's log says, that no process is left on either GPU, and that a rerun with --resume auto continues.
# Usage: COMMIT=<sha> bash tools/device_call_reader_left.sh (carry .whl)
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $res/summary.txt
echo "code ${COMMIT:-?}" | tee -a $res/summary.txt
mkdir -p /tmp/w && cd /tmp/w
sets="--set train.max_steps=200 --set train.save_every=20"
python3 - "$res" $sets <<'PY' 2>&1 | tee -a $res/summary.txt
import subprocess, sys, time, re, pathlib
res, sets = sys.argv[1], sys.argv[2:]
argv = ["gpucert", "finetune", "--nproc", "2", "-o", "/tmp/w/run", *sets]
t0 = time.monotonic()
proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
seen = []
while True:  # as `| head` would: read on until step 40 (two checkpoints), then leave
    line = proc.stdout.readline()
    if not line:
        break
    seen.append(line)
    if re.match(r"\[finetune\] step 40/", line):
        break
pathlib.Path(res, "read.txt").write_text("".join(seen))
proc.stdout.close()
left = time.monotonic()
code = proc.wait(timeout=300)
print(f"read {len(seen)} lines in {left - t0:.1f} s; exit {code} {time.monotonic() - left:.1f} s after the reader left")
PY
sleep 1
echo "left on the GPUs: $(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader | wc -l) processes" | tee -a $res/summary.txt
echo "gpucert processes left: $(pgrep -fc 'gpucert finetune' || true)" | tee -a $res/summary.txt
cp /tmp/w/run/logs/rank-1.log $res/rank-1.log 2>/dev/null
tail -3 /tmp/w/run/logs/rank-1.log | cut -c1-300 | tee -a $res/summary.txt
ls /tmp/w/run/checkpoints | tee -a $res/summary.txt
timeout -k 10 240 gpucert finetune --nproc 2 -o /tmp/w/run --resume auto $sets \
  > $res/resume.txt 2> $res/resume-stderr.txt
echo "resume auto exit $?" | tee -a $res/summary.txt
grep -E "resum|step 41/|step 200/" $res/resume-stderr.txt | head -5 | cut -c1-200 | tee -a $res/summary.txt
tail -1 $res/resume.txt | cut -c1-200 | tee -a $res/summary.txt
