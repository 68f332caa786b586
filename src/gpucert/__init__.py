"""gpucert: acceptance testing and fine-tuning benchmarks for NVIDIA GPU nodes and clusters."""

__version__ = "0.1.0"

# Bumped whenever a measurement or judging method changes, so numbers from different methods are never
# compared as if they were the same (stas00/ml-engineering's `benchmark_version`).
METHOD_VERSION = "1"
