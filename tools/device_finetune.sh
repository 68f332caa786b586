#!/usr/bin/env bash
# Run on the lent GPU machine (carry .whl: the device lacks `datasets`, dill and multiprocess; its pyarrow 25.0.1
# meets datasets 5.2, so pyarrow stays behind; a flash_attn_3 wheel built by tools/device_fa3.sh may ride along):
# Qwen2-7B-shaped fine-tuning runs of configs/finetune/qwen2-7b-speed.yaml, one per line of a plan file
# "NAME NPROC --set key=value ...".
# Each run's metrics.json (NAME.json) and log tail (NAME.log) come back in $OUT/runs.tgz (one file: the device
# returns only a few), a line each in $OUT/summary.txt; adapters and checkpoints stay on the machine
# (gigabytes). Usage: bash tools/device_finetune.sh PLAN
# A plan line may put environment assignments before its options ("NAME 1 SDPA_BACKEND=cudnn --set ..."); a
# line whose environment sets PROFILE_STEP, READ_AHEAD, TORCHINDUCTOR_CUDAGRAPHS, GC, GC_STATS, HOST_LAYOUT,
# LOSS_KERNEL, LOSS_CHUNK or ACT_BUDGET runs tools/profile_finetune.py, and a profile's kernel table comes back as
# NAME.prof.txt.
set -u
plan=${1:?plan file}
config=${CONFIG:-configs/finetune/qwen2-7b-speed.yaml}
export PYTHONUNBUFFERED=1
mkdir -p /tmp/results
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  . tools/device_install.sh
fi
python3 -c "import flash_attn" 2>/dev/null && echo "flash_attn present" || echo "flash_attn absent"
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv | tee "$OUT/gpus.csv"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|peft|triton|accelerate) " > "$OUT/versions.txt"

while read -r name nproc args; do
  case "$name" in ''|'#'*) continue ;; esac
  start=$(date +%s)
  envs=()
  # shellcheck disable=SC2206
  words=($args)
  while [ "${#words[@]}" -gt 0 ] && [[ "${words[0]}" == [A-Z]*=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
  entry=(-m gpucert.finetune.train)
  [[ " ${envs[*]} " =~ \ (PROFILE_STEP|READ_AHEAD|TORCHINDUCTOR_CUDAGRAPHS|GC|GC_STATS|HOST_LAYOUT|LOSS_KERNEL|LOSS_CHUNK|ACT_BUDGET)= ]] && entry=(tools/profile_finetune.py)
  env "${envs[@]}" PROFILE_OUT="/tmp/results/$name.prof.txt" timeout "${RUN_TIMEOUT:-400}" \
    torchrun --standalone --nproc-per-node="$nproc" "${entry[@]}" \
    "$config" --output-dir "/tmp/runs/$name" "${words[@]}" > "/tmp/$name.log" 2>&1
  echo "$name exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  grep -v "^\[finetune\] step [0-9]*/" "/tmp/$name.log" | tail -60 > "/tmp/results/$name.log"
  grep "^gc in step" "/tmp/$name.log" >> "/tmp/results/$name.log"
  [ -f "/tmp/runs/$name/metrics.json" ] && cp "/tmp/runs/$name/metrics.json" "/tmp/results/$name.json"
  python3 - "$name" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
name = sys.argv[1]
try:
    m = json.load(open(f"/tmp/runs/{name}/metrics.json"))
except OSError:
    sys.exit(0)
t = m["tokens_per_s_per_gpu"]
s = m.get("step_time_s") or {}
print(f"  {name}: {m['world_size']} x {m['device']} | effective {t['effective']:,.0f} tok/s/GPU | MFU "
      f"{(m['mfu'] or 0):.1%} | peak {m['peak_memory_gib'] or 0:.1f} GiB | T_eff {m['t_eff']:.0f} | oom {m['oom']} | "
      f"step median {1000 * (s.get('median') or 0):.1f} ms, slowest {1000 * (s.get('slowest') or 0):.1f} "
      f"(step {s.get('slowest_step')})")
if m.get("time_to_first_step_s") is not None:
    c = m.get("compile") or {}
    w = ((c.get("ranks") or [{}])[0].get("warm_up") or {})
    print(f"  {name}: first step after {m['time_to_first_step_s']:.1f} s (compile warm-up {c.get('warm_up_s') or 0:.1f} s, "
          f"step {m['first_step_s']:.1f} s) | {w.get('counters')} | {w.get('phases_s')}")
PY
  rm -rf "/tmp/runs/$name/checkpoints" "/tmp/runs/$name/adapter"
  tar czf "$OUT/runs.tgz" -C /tmp/results .  # after every run: a timed-out call still brings back the finished ones
done < "$plan"
