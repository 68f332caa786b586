#!/usr/bin/env bash
# Run on the lent 2-GPU machine (carry .vendor): why nccl-tests -G is faster than gpucert's graphs for
# all_gather, all_to_all and send/recv at 16 MiB-1 GiB. Suspect: nccl-tests allocates with ncclMemAlloc, and in a
# CUDA graph NCCL registers such buffers itself and copies user buffer to user buffer (zero-copy).
# Runs nccl-tests -G as before, with NCCL_GRAPH_REGISTER=0, and eager with -R 1 (local registration); then
# gpucert in graphs with buffers=torch and buffers=nccl. In $OUT: register-*.txt, register-*.json, log.
set -u
log="$OUT/register-log.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
nccl=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
[ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
bins="all_gather_perf alltoall_perf sendrecv_perf all_reduce_perf"
make -C .vendor/nccl-tests/src -j16 BUILDDIR=/tmp/nt NCCL_HOME="$nccl" CUDA_HOME=/usr/local/cuda \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" $(for b in $bins; do echo /tmp/nt/$b; done) \
  > /tmp/nt-build.log 2>&1 || { tail -20 /tmp/nt-build.log | tee -a "$log"; exit 1; }
nt() {  # label, env..., -- flags
  local label=$1; shift
  for b in $bins; do
    env "$@" timeout 120 /tmp/nt/$b -b 16M -e 1G -f 4 -g 2 -d bfloat16 -w 5 $NTFLAGS >> "$OUT/register-$label.txt" 2>&1
    echo "$label $b exit $?" >> "$log"
  done
}
NTFLAGS="-n 100 -G 5" nt graph NCCL_DEBUG=WARN
NTFLAGS="-n 100 -G 5" nt graph-noreg NCCL_GRAPH_REGISTER=0
NTFLAGS="-n 20 -G 0 -R 1" nt eager-R1 NCCL_DEBUG=WARN
NTFLAGS="-n 20 -G 0" nt eager NCCL_DEBUG=WARN
for buffers in torch nccl; do
  timeout 240 gpucert bench collectives --set "bench.collectives.ops=[all_gather,all_to_all,send_recv,all_reduce]" \
    --set bench.collectives.min_bytes=16777216 --set bench.collectives.max_bytes=1073741824 \
    --set bench.collectives.gate_bytes=1073741824 --set bench.collectives.buffers=$buffers \
    -o /tmp/reg-$buffers --json > /dev/null 2>> "$log"
  echo "gpucert buffers=$buffers exit $?" | tee -a "$log"
  cp /tmp/reg-$buffers/report.json "$OUT/register-gpucert-$buffers.json" 2>> "$log"
done
python3 - "$OUT" <<'PY' | tee "$OUT/register-summary.txt"
import json, sys, pathlib
from gpucert.bench.nccl_tests import IN_PLACE_OPS, parse_nccl_tests
out = pathlib.Path(sys.argv[1])
tables = {}
for label in ("eager", "eager-R1", "graph", "graph-noreg"):
    path = out / f"register-{label}.txt"
    for run in parse_nccl_tests(path.read_text()) if path.exists() else []:
        for row in run.rows:
            # gpucert runs all_reduce and broadcast in place: compare with nccl-tests' in-place column there.
            tables.setdefault(label, {})[(run.op, row.size_bytes)] = row.placement(run.op in IN_PLACE_OPS).busbw_gbps
for buffers in ("torch", "nccl"):
    path = out / f"register-gpucert-{buffers}.json"
    for r in json.loads(path.read_text())["results"] if path.exists() else []:
        d = r.get("details", {})
        if r["name"].startswith("collective.") and "busbw_gbps" in d:
            for size, busbw in zip(d["sizes_bytes"], d["busbw_gbps"]):
                tables.setdefault(f"gpucert-{buffers}", {})[(d["op"], size)] = busbw
keys = sorted({k for t in tables.values() for k in t}, key=lambda k: (str(k[0]), k[1]))
print("busbw GB/s; op, MiB, then " + " | ".join(tables))
for k in keys:
    print(k[0], k[1] >> 20, " ".join(f"{tables[t].get(k, float('nan')):7.1f}" for t in tables))
PY
tail -20 "$log"
