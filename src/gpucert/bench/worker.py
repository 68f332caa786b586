"""One rank of a benchmark: `python -m gpucert.bench.worker SPEC.json OUT.json` (torchrun starts us).

SPEC names the benchmark (see catalog.py) and its config; every rank measures, rank 0 gathers and writes
OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpucert.bench import catalog
from gpucert.bench.distributed import cleanup, init_distributed


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Measure in this process (a torchrun worker, or an outside torchrun/srun rank); rank 0's result."""
    env = init_distributed()
    try:
        return catalog.load(spec["benchmark"]).measure(env, spec["config"])
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
