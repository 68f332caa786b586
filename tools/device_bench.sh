#!/usr/bin/env bash
# Run on the lent GPU machine (carry .vendor): the acceptance suite, nccl-tests next to our all_reduce,
# and the gpu-marked tests. Usage: bash tools/device_bench.sh <name>
set -u
name=${1:?name}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
n=$(nvidia-smi -L | wc -l)
nccl=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
[ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
if [ -d .vendor/nccl-tests ]; then
  (make -C .vendor/nccl-tests/src -j8 BUILDDIR=/tmp/nt NCCL_HOME="$nccl" CUDA_HOME=/usr/local/cuda \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/nt/all_reduce_perf > /tmp/nt-build.log 2>&1
   echo "build exit $?" >> /tmp/nt-build.log) &
fi
start=$(date +%s)
COLUMNS=160 gpucert accept --set health.expected_gpus=$n ${ACCEPT_ARGS:-} -o /tmp/accept > "$OUT/$name-accept.txt" 2>&1
echo "accept exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/$name-accept.txt"
cp /tmp/accept/report.json "$OUT/$name-accept.json"; cp /tmp/accept/report.html "$OUT/$name-accept.html" 2>/dev/null
wait
tail -3 /tmp/nt-build.log
if [ -x /tmp/nt/all_reduce_perf ] && [ "$n" -gt 1 ]; then
  export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
  nt="/tmp/nt/all_reduce_perf -b 64M -e 4G -f 2 -g $n -d bfloat16 -w 5 -n 20"
  { echo "== nccl-tests before"; $nt; } > "$OUT/$name-nccl-tests.txt" 2>&1
  gpucert bench collectives --set 'bench.collectives.ops=[all_reduce]' --set bench.collectives.min_bytes=67108864 \
    -o /tmp/coll --json > /dev/null 2>"$OUT/$name-collectives.err"
  cp /tmp/coll/report.json "$OUT/$name-collectives.json"
  { echo "== nccl-tests after"; $nt; } >> "$OUT/$name-nccl-tests.txt" 2>&1
  grep -E "^ +(67108864|1073741824|4294967296) " "$OUT/$name-nccl-tests.txt"
fi
if [ "${RUN_PYTEST:-1}" = 1 ]; then
  python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > "$OUT/$name-pytest.txt" 2>&1; tail -3 "$OUT/$name-pytest.txt"
fi
grep -E "verdict|FAIL|ERROR" "$OUT/$name-accept.txt" | head -30
