#!/usr/bin/env bash
# Run on the lent GPU machine: capture a raw hardware bundle (test fixtures) for this node into $OUT/$1.tar.gz.
set -u
name=${1:?bundle name}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
mkdir -p /tmp/$name
python3 - "$name" <<'PY'
import sys
from pathlib import Path
from gpucert.hardware.capture import capture_node
print(capture_node(Path("/tmp") / sys.argv[1]))
PY
python3 - > /tmp/$name/torch.json <<'PY'
import json, torch
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                  "nccl": list(torch.cuda.nccl.version()), "device_count": torch.cuda.device_count(),
                  "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))
PY
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|peft|nvidia-ml-py|rich|pyyaml|datasets|accelerate|triton|numpy|matplotlib|tokenizers) " > /tmp/$name/pip-list.txt
cat /tmp/$name/problems.txt /tmp/$name/torch.json
head -30 /tmp/$name/nvidia-smi-topo-m.txt
ls /sys/class/infiniband 2>&1 | head; ls /sys/class/net
tar czf "$OUT/$name.tar.gz" -C /tmp "$name"
ls -la "$OUT"
