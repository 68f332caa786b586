#!/usr/bin/env bash
# Run on the lent multi-GPU machine (carry .vendor: the nccl-tests source in .vendor/nccl-tests): nccl-tests and
# `gpucert bench collectives` over the same sizes (8 B to 4 GiB, x2, bf16) and ops, one after the other, then a
# side-by-side table of time and busbw per size (tools/nccl_compare.py).
# Usage: [OPS="all_reduce all_gather"] [MAX=4G] [EAGER=1] [BUFFERS=nccl] [TWO_NODES=1] \
#          bash tools/device_nccl_compare.sh [name]
#   OPS: gpucert op names (default: all six; nccl-tests has a binary for each). gpucert runs once with its
#   default (CUDA graphs; EAGER=1: eager calls); nccl-tests twice: as usually run (-n 20, eager) and with its
#   launches amortised (-n 100 -G 5: graphs of 100 ops, launched 5 times), one table against each.
#   BUFFERS=nccl: gpucert's timed buffers from ncclMemAlloc, as nccl-tests allocates them (default torch).
#   TWO_NODES=1 then runs all_reduce over two gpucert node agents of one GPU each, NCCL on the network path.
# In $OUT: <name>-nccl-tests{,-graph}.txt, <name>-collectives.json, <name>-compare{,-graph}.md, <name>-log.txt.
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

# gpucert once over the same sizes and ops, nccl-tests as usually run and with graphs, a table against each.
json="$OUT/$name-collectives.json"
cuda_graph=true; [ "${EAGER:-0}" = 1 ] && cuda_graph=false
timeout 500 gpucert bench collectives --set "bench.collectives.ops=[$list]" --set bench.collectives.min_bytes=8 \
  --set "bench.collectives.max_bytes=$max_bytes" --set "bench.collectives.gate_bytes=$max_bytes" \
  --set "bench.collectives.cuda_graph=$cuda_graph" --set "bench.collectives.buffers=${BUFFERS:-torch}" \
  -o /tmp/coll --json > /dev/null 2>> "$log"
echo "gpucert bench collectives cuda_graph=$cuda_graph buffers=${BUFFERS:-torch} exit $?" | tee -a "$log"
cp /tmp/coll/report.json "$json" 2>> "$log"
for suffix in "" -graph; do
  txt="$OUT/$name-nccl-tests$suffix.txt"
  flags=(-n 20 -G 0); [ "$suffix" = -graph ] && flags=(-n 100 -G 5)
  : > "$txt"
  for bin in "${bins[@]}"; do
    timeout 300 "/tmp/nt/$bin" -b 8 -e "$max" -f 2 -g "$n" -d bfloat16 -w 5 "${flags[@]}" >> "$txt" 2>&1
    echo "$bin ${flags[*]} exit $?" | tee -a "$log"
  done
  python3 tools/nccl_compare.py "$json" "$txt" > "$OUT/$name-compare$suffix.md" 2>> "$log"
  grep -E "^## |^\| (8|1048576|2097152|4194304|16777216|1073741824|$max_bytes) " "$OUT/$name-compare$suffix.md"
done
if [ "${TWO_NODES:-0}" = 1 ]; then
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES=$node NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 300 gpucert bench collectives \
      --set "bench.collectives.ops=[all_reduce]" --set bench.collectives.max_bytes=67108864 \
      --set bench.collectives.gate_bytes=67108864 --set health.expected_gpus=2 --nnodes 2 --node-rank $node \
      --master-addr 127.0.0.1 --master-port 29541 -o /tmp/two --json > "/tmp/two-node$node.json" 2>> "$log" &
  done
  wait
  cp /tmp/two-node0.json "$OUT/$name-two-nodes.json" 2>> "$log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(x['name'], x['status'], x['message'][:150]) for x in r['results'] if x['name'].startswith('collective')]" /tmp/two-node0.json
fi
tail -5 "$log"
