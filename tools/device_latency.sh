#!/usr/bin/env bash
# Run on the lent 2-GPU machine (carry .vendor): where small all_reduce time goes (tools/latency_probe.py, with
# and without torch's flight recorder), nccl-tests all_reduce_perf beside it (eager and -G 1), and the 2-GPU
# collectives timing test. In $OUT: latency*.jsonl, nccl-tests.txt, gpu-test.txt, host.txt.
set -u
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
{ lscpu | grep -E "Model name|^CPU\(s\)|MHz"; nvidia-smi topo -m | head -4; env | grep -E "^(NCCL|TORCH_NCCL)_"; \
  python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; } > "$OUT/host.txt" 2>&1
timeout 240 torchrun --nproc-per-node 2 tools/latency_probe.py > "$OUT/latency.jsonl" 2> "$OUT/latency-err.txt"
echo "probe exit $?"
TORCH_NCCL_TRACE_BUFFER_SIZE=0 timeout 240 torchrun --nproc-per-node 2 tools/latency_probe.py \
  > "$OUT/latency-notrace.jsonl" 2>> "$OUT/latency-err.txt"
echo "probe (no flight recorder) exit $?"
nccl=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
[ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
make -C .vendor/nccl-tests/src -j16 BUILDDIR=/tmp/nt NCCL_HOME="$nccl" CUDA_HOME=/usr/local/cuda \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/nt/all_reduce_perf > /tmp/nt-build.log 2>&1 \
  || tail -20 /tmp/nt-build.log
for g in 0 1; do
  timeout 120 /tmp/nt/all_reduce_perf -b 8 -e 16M -f 2 -g 2 -d bfloat16 -w 5 -n 20 -G $g >> "$OUT/nccl-tests.txt" 2>&1
done
timeout 300 python3 -m pytest -q -x tests/gpu/test_collectives_timing.py > "$OUT/gpu-test.txt" 2>&1
echo "gpu test exit $?"
tail -3 "$OUT/gpu-test.txt"
