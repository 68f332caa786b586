"""One rank of a benchmark: `python -m gpucert.bench.worker SPEC.json OUT.json` (torchrun starts us).

SPEC names the benchmark and its config; every rank measures, rank 0 gathers and writes OUT.json. The
benchmarks are listed here explicitly: a name maps to the function that measures it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucert.bench.distributed import DistEnv, cleanup, init_distributed

Measure = Callable[[DistEnv, dict[str, Any]], dict[str, Any] | None]


def measures() -> dict[str, Measure]:
    # Imported here so a worker loads only the benchmark it runs.
    from gpucert.bench import collectives, matmul, memory, p2p, train_proxy

    return {
        "matmul": matmul.measure,
        "memory": memory.measure,
        "collectives": collectives.measure,
        "p2p": p2p.measure,
        "train": train_proxy.measure,
    }


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Measure in this process (a torchrun worker, or an outside torchrun/srun rank); rank 0's result."""
    env = init_distributed()
    try:
        return measures()[spec["benchmark"]](env, spec["config"])
    finally:
        cleanup()


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec)
    if result is not None:
        Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
