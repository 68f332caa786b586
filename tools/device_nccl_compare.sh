#!/usr/bin/env bash
# Run on the lent multi-GPU machine (carry .vendor: the nccl-tests source in .vendor/nccl-tests): nccl-tests and
# `gpucert bench collectives` over the same sizes (8 B to 4 GiB, x2, bf16) and ops, one after the other, then a
# side-by-side table of time and busbw per size (tools/nccl_compare.py).
# Usage: [OPS="all_reduce all_gather"] [MAX=4G] [GRAPH=1] bash tools/device_nccl_compare.sh [name]
#   OPS: gpucert op names (default: all six; nccl-tests has a binary for each). GRAPH=1 adds a second pass with
#   nccl-tests -G 1 and bench.collectives.cuda_graph=true (the CUDA-graph path, first run on a GPU there).
# In $OUT: <name>-nccl-tests.txt, <name>-collectives.json, <name>-compare.md (and -graph variants), <name>-log.txt.
set -u
name=${1:-nccl-compare}
ops=${OPS:-all_reduce all_gather reduce_scatter all_to_all broadcast send_recv}
max=${MAX:-4G}
log="$OUT/$name-log.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
n=$(nvidia-smi -L | wc -l)
nccl=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
[ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
{ echo "GPUs: $n; NCCL_* set: $(env | grep ^NCCL_ | tr '\n' ' ')"; nvidia-smi topo -m | head -$((n + 2)); } > "$log"

declare -A perf=([all_reduce]=all_reduce_perf [all_gather]=all_gather_perf [reduce_scatter]=reduce_scatter_perf
                 [all_to_all]=alltoall_perf [broadcast]=broadcast_perf [send_recv]=sendrecv_perf)
targets=() bins=()
for op in $ops; do
  [ -n "${perf[$op]:-}" ] || { echo "unknown op $op; known: ${!perf[*]}" | tee -a "$log"; exit 3; }
  targets+=("/tmp/nt/${perf[$op]}") bins+=("${perf[$op]}")
done
if ! make -C .vendor/nccl-tests/src -j16 BUILDDIR=/tmp/nt NCCL_HOME="$nccl" CUDA_HOME=/usr/local/cuda \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "${targets[@]}" > /tmp/nt-build.log 2>&1; then
  tail -20 /tmp/nt-build.log | tee -a "$log"; exit 1
fi
list=$(echo $ops | tr ' ' ',')
max_bytes=$(numfmt --from=iec "$max")

# One pass: every nccl-tests binary, then gpucert over the same sizes and ops, then the table.
pass() {
  local suffix=$1 graph_flag=$2 cuda_graph=$3
  local txt="$OUT/$name-nccl-tests$suffix.txt" json="$OUT/$name-collectives$suffix.json"
  : > "$txt"
  for bin in "${bins[@]}"; do
    timeout 300 "/tmp/nt/$bin" -b 8 -e "$max" -f 2 -g "$n" -d bfloat16 -w 5 -n 20 -G "$graph_flag" >> "$txt" 2>&1
    echo "$bin -G $graph_flag exit $?" | tee -a "$log"
  done
  timeout 400 gpucert bench collectives --set "bench.collectives.ops=[$list]" --set bench.collectives.min_bytes=8 \
    --set "bench.collectives.max_bytes=$max_bytes" --set "bench.collectives.gate_bytes=$max_bytes" \
    --set "bench.collectives.cuda_graph=$cuda_graph" -o "/tmp/coll$suffix" --json > /dev/null 2>> "$log"
  echo "gpucert bench collectives cuda_graph=$cuda_graph exit $?" | tee -a "$log"
  cp "/tmp/coll$suffix/report.json" "$json" 2>> "$log"
  python3 tools/nccl_compare.py "$json" "$txt" > "$OUT/$name-compare$suffix.md" 2>> "$log"
  grep -E "^## |^\| (8|1024|1048576|16777216|1073741824|$max_bytes) " "$OUT/$name-compare$suffix.md"
}
pass "" 0 false
[ "${GRAPH:-0}" = 1 ] && pass "-graph" 1 true
tail -5 "$log"
