"""gpucert: acceptance testing and fine-tuning benchmarks for NVIDIA GPU nodes and clusters."""

__version__ = "0.1.0"

# Bumped whenever a measurement or judging method changes, so numbers from different methods are never
# compared as if they were the same (stas00/ml-engineering's `benchmark_version`).
# 2: an "fp32" matmul is true fp32 (it ran as TF32 before); fixed-size matmuls are judged against the node median
# and a share of the peak (INFO where nothing can judge them); the burn phase (sustained per-GPU load, judged by
# its median window) joins accept.
# Also in 2: collectives time batches of back-to-back calls between one pair of events (nccl-tests), not each call.
# 3: on NCCL, collectives replay each batch as CUDA graphs of graph_calls calls on a non-blocking stream (eager
# calls before), so small sizes time NCCL, not the host.
METHOD_VERSION = "3"
