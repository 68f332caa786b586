"""One benchmark in a job of its own: `python -m gpucert.bench.worker SPEC.json OUT.json`, as the ranks of
`bench.suite.launch_local` (tests and tools that measure one benchmark without a report).

SPEC names the benchmark (see catalog.py), its config, the runtime's timeouts and `timeout_s`; every rank measures,
rank 0 writes OUT.json. A rank that fails records why (its exception, where it was raised) in the job's store, so
every other rank stops within a heartbeat and the launcher names it.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from gpucert.bench import catalog
from gpucert.config.loader import ConfigError
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import (
    ABORTED_EXIT,
    RendezvousError,
    Runtime,
    deadline,
    fail,
    leave_failed,
    say,
    start_runtime,
    stop_runtime,
)


def run(rt: Runtime, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Measure in this process, with the job's other ranks; rank 0's result (None elsewhere)."""
    rt.set_phase(f"bench {spec['benchmark']}")
    return catalog.load(spec["benchmark"]).measure(rt, spec["config"])


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        rt = start_runtime(RuntimeConfig(**spec.get("runtime", {})))
    except (RendezvousError, ConfigError) as exc:
        say(str(exc))
        return ABORTED_EXIT
    say(f"{rt.me.describe()} joined the job ({rt.world_size} ranks): bench {spec['benchmark']}")
    limit = spec.get("timeout_s")
    bounded = deadline(rt, f"bench {spec['benchmark']}", float(limit), "timeout_s") if limit else nullcontext()
    try:
        with bounded:
            data = run(rt, spec)
        if data is not None:
            out = Path(argv[1])
            tmp = out.with_name(f".{out.name}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(out)  # whoever reads it must never read half a result
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        record = fail(rt, exc)
        say(record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}")
        leave_failed(rt, ABORTED_EXIT)
    stop_runtime(rt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
