# Sourced by the tools/device_*.sh scripts on the lent GPU machine (`. tools/device_install.sh`): the wheels it
# lacks (carried in the git-ignored .whl/: datasets, dill, multiprocess) into /tmp/site, put on PYTHONPATH, then
# gpucert itself, editable, without touching the machine's torch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
