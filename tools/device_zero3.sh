#!/usr/bin/env bash
# Run on the lent 2-GPU machine: the 7B LoRA workload under DeepSpeed ZeRO-3 (tools/zero3_finetune.py), and DDP
# and FSDP2 through gpucert's trainer with the same settings (tools/plans/h200x2-engines.txt).
# The wheels do not fit in one carry (64 MiB: pyarrow alone is 55 MB), so this runs in two calls on one warm
# machine (call 2 within the machine's idle release):
#   1. carry .whl (datasets, pyarrow...):  bash tools/device_zero3.sh
#      installs them into /tmp/site and runs DDP and FSDP2;
#   2. carry .whl-ds (DeepSpeed 0.19.8 built here with DS_BUILD_OPS=0, and its dependencies: hjson, msgpack,
#      ninja, py-cpuinfo, einops, pydantic and pydantic-core, annotated-types, typing-inspection,
#      typing-extensions): bash tools/device_zero3.sh  installs them into /tmp/site-ds and runs ZeRO-3 with
#      /tmp/site from call 1.
# To fill .whl-ds here (the device has no network; it runs Python 3.12):
#   pip download deepspeed==0.19.8 --no-deps -d /tmp/ds && tar xzf /tmp/ds/deepspeed-0.19.8.tar.gz -C /tmp/ds
#   DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation -w .whl-ds /tmp/ds/deepspeed-0.19.8
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps -d .whl-ds \
#     einops hjson msgpack ninja py-cpuinfo pydantic pydantic-core annotated-types typing-inspection typing-extensions
# In $OUT: zero3.json and zero3.log (call 2); device_finetune.sh's summary.txt and runs.tgz (call 1).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site SKIP_INSTALL=1 RUN_TIMEOUT=${RUN_TIMEOUT:-300} \
    bash tools/device_finetune.sh tools/plans/h200x2-engines.txt
  exit
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-ds .whl-ds/*.whl
export PYTHONPATH=/tmp/site-ds:/tmp/site
python3 -c "import datasets, deepspeed; print('datasets', datasets.__version__, 'deepspeed', deepspeed.__version__)" \
  2>&1 | tail -1
start=$(date +%s)
timeout "${RUN_TIMEOUT:-300}" torchrun --standalone --nproc-per-node=2 tools/zero3_finetune.py \
  configs/finetune/qwen2-7b-speed.yaml --out "$OUT/zero3.json" --set data.source=synthetic \
  --set model.gradient_checkpointing=false --set model.compile=false --set model.attn_implementation=sdpa \
  --set lora.dropout=0 > /tmp/zero3.log 2>&1
echo "zero3 exit $? in $(( $(date +%s) - start )) s"
grep -v "^\[zero3\] step" /tmp/zero3.log | tail -40 > "$OUT/zero3.log"
grep "^\[zero3\]" /tmp/zero3.log | tail -4
