#!/usr/bin/env bash
# One call on 2 x H200 (2026-11-29, eighth session): bench.collectives.force_ring through the command line, where
# the ranks gpucert starts must get NCCL's Ring variables (bench.suite.rank_env); before the fix every such gate,
# localize's pair jobs included, was ERROR "expected NCCL_ALGO=Ring ... found no NCCL_* variables".
# Usage: bash tools/device_call_ring.sh (carry .whl). Results in one $OUT/results.tgz.
. tools/device_call_setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $res/gpus.csv
timeout -k 10 240 gpucert bench collectives --set bench.collectives.force_ring=true \
  --set "bench.collectives.ops=[all_gather,all_reduce]" --set bench.collectives.max_bytes=1073741824 \
  --set bench.collectives.gate_bytes=1073741824 -o $res/ring > $res/ring.txt 2>&1
echo "bench collectives (Ring forced) exit $?"
grep -E "collective\.|force_ring|verdict" $res/ring.txt | cut -c1-220
python3 - <<'PY'
import json
r = json.load(open("/tmp/res/ring/report.json"))
for x in r["results"]:
    if x["name"].startswith("collective."):
        d = x.get("details") or {}
        print(x["name"], x["status"], "nccl_env", d.get("nccl_env"), "algos", d.get("algorithms") or d.get("algo"))
PY
timeout -k 10 300 gpucert cluster localize --hosts localhost:0 localhost:1 --set health.expected_gpus=2 \
  -o $res/localize > $res/localize.txt 2>&1
echo "localize exit $?"
tail -n 12 $res/localize.txt | cut -c1-220
grep -h '"name": "collective.force_ring"' -A3 $res/localize/pairs/*/report.json | head -8 || true
python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/res/localize/pairs/*/report.json")):
    r = json.load(open(path))
    bad = [x["name"] for x in r["results"] if x["status"] == "ERROR"]
    print(path.split("/")[-2], r.get("status") or "", "ERROR rows:", bad)
PY
