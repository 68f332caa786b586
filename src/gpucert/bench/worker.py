"""One rank of a benchmark: `python -m gpucert.bench.worker SPEC.json OUT.json` (gpucert's node agent starts
one per GPU on every node; together they are one job).

SPEC names the benchmark (see catalog.py), its config and the runtime's timeouts; every rank measures, rank 0
writes OUT.json. A rank that fails records why in the job's store, so every other rank of every node stops
within a heartbeat and the agent can name it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from gpucert.bench import catalog
from gpucert.config.loader import ConfigError
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import (
    ABORTED_EXIT,
    RendezvousError,
    Runtime,
    fail,
    leave_failed,
    say,
    start_runtime,
    stop_runtime,
)
from gpucert.runtime.spawn import die_with_parent


def run(rt: Runtime, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Measure in this process, with the job's other ranks; rank 0's result (None elsewhere)."""
    rt.set_phase(f"bench {spec['benchmark']}")
    return catalog.load(spec["benchmark"]).measure(rt, spec["config"])


def main(argv: list[str]) -> int:
    agent = os.environ.get("GPUCERT_AGENT_PID")
    die_with_parent(int(agent) if agent else None)
    spec = json.loads(Path(argv[0]).read_text())
    try:
        rt = start_runtime(RuntimeConfig(**spec.get("runtime", {})))
    except (RendezvousError, ConfigError) as exc:
        say(str(exc))
        return ABORTED_EXIT
    try:
        data = run(rt, spec)
        if data is not None:
            out = Path(argv[1])
            tmp = out.with_name(f".{out.name}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(out)  # the agent must never read half a result
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        traceback.print_exc()
        record = fail(rt, exc)
        say(record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}")
        leave_failed(rt, ABORTED_EXIT)
    stop_runtime(rt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
