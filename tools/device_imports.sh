#!/usr/bin/env bash
# One GPU-machine call: why a run's imports take 18-23 s there (5 s on a 2-core CPU VM). Is the interpreter
# compiling the installed packages' sources on every start (no usable .pyc), and does a writable bytecode cache
# (PYTHONPYCACHEPREFIX) cut it? Writes $OUT/imports.txt. Usage: bash tools/device_imports.sh
set -u
. tools/device_install.sh
o="$OUT/imports.txt"
{
  echo "== interpreter"; env | grep -E '^PYTHON' ; python3 - <<'PY'
import sys, os, importlib.util
print(sys.version.split()[0], "dont_write_bytecode", sys.flags.dont_write_bytecode, "pycache_prefix", sys.pycache_prefix)
for name in ("torch", "transformers", "sympy", "peft", "sklearn", "datasets"):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        print(name, "absent"); continue
    root = os.path.dirname(spec.origin)
    py = pyc = 0
    for d, _, files in os.walk(root):
        py += sum(f.endswith(".py") for f in files)
        pyc += sum(f.endswith(f".{sys.implementation.cache_tag}.pyc") for f in files)
    print(f"{name}: {root} writable={os.access(root, os.W_OK)} .py={py} .{sys.implementation.cache_tag}.pyc={pyc}")
PY
  df -h / /usr /tmp 2>/dev/null; mount | grep -E ' / | /usr ' | head
  nproc; cat /proc/cpuinfo | grep -m1 'model name'
  for i in 1 2 3; do /usr/bin/time -f "plain import run: %e s" python3 -c 'import gpucert.finetune.train.run' ; done
  for i in 1 2 3; do PYTHONPYCACHEPREFIX=/tmp/pyc /usr/bin/time -f "PYTHONPYCACHEPREFIX import run: %e s" python3 -c 'import gpucert.finetune.train.run' ; done
  for i in 1 2; do /usr/bin/time -f "plain import torch: %e s" python3 -c 'import torch' ; done
  for i in 1 2; do PYTHONPYCACHEPREFIX=/tmp/pyc /usr/bin/time -f "prefix import torch: %e s" python3 -c 'import torch' ; done
  echo "== -X importtime, top self times (plain)"
  python3 -X importtime -c 'import gpucert.finetune.train.run' 2> /tmp/it.txt; sort -t'|' -k1.13 -n -r /tmp/it.txt | head -25
  echo "== -X importtime, top self times (prefix)"
  PYTHONPYCACHEPREFIX=/tmp/pyc python3 -X importtime -c 'import gpucert.finetune.train.run' 2> /tmp/it2.txt; sort -t'|' -k1.13 -n -r /tmp/it2.txt | head -25
  sort -t'|' -k2 -n -r /tmp/it2.txt | head -40
} > "$o" 2>&1
cat "$o" | head -150
