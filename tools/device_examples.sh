#!/usr/bin/env bash
# Run on the lent GPU machine: gpu-marked tests, example reports and a fresh capture bundle into $OUT.
# Usage (from the device tool): bash tools/device_examples.sh <name>
set -u
name=${1:?name}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONUNBUFFERED=1
n=$(nvidia-smi -L | wc -l)
python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/$name-pytest.txt" | tail -5
gpucert discover -o /tmp/discover > "$OUT/$name-discover.txt" 2>&1; echo "discover exit $?"
cp /tmp/discover/report.json "$OUT/$name-discover.json"
COLUMNS=140 gpucert health --set health.expected_gpus=$n -o /tmp/health > "$OUT/$name-health.txt" 2>&1
echo "health exit $?"
cp /tmp/health/report.json "$OUT/$name-health.json"; cp /tmp/health/report.md "$OUT/$name-health.md"
gpucert capture -o /tmp/$name > /dev/null 2>&1; tar czf "$OUT/$name-bundle.tar.gz" -C /tmp "$name"
tail -25 "$OUT/$name-health.txt"
