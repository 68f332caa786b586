"""The benchmarks, in the order `gpucert accept` runs them, and the module behind each name.

Each module has `measure(env, cfg) -> dict | None` (runs on every rank, rank 0 returns the data) and
`judge(data, profile, cfg) -> list[Result]` (pure).
"""

from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS = ("matmul", "burn", "memory", "p2p", "collectives", "train")

_MODULES = {
    "matmul": "gpucert.bench.matmul",
    "burn": "gpucert.bench.burn",
    "memory": "gpucert.bench.memory",
    "p2p": "gpucert.bench.p2p",
    "collectives": "gpucert.bench.collectives",
    "train": "gpucert.bench.train_proxy",
}


def load(name: str) -> ModuleType:
    """Imported on demand: a worker process loads only the benchmark it runs."""
    return importlib.import_module(_MODULES[name])
