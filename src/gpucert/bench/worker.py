"""One rank of a benchmark: `python -m gpucert.bench.worker SPEC.json OUT.json` (gpucert's node agent starts
one per GPU on every node; together they are one job).

SPEC names the benchmark (see catalog.py), its config and the runtime's timeouts; every rank measures, rank 0
writes OUT.json. A rank that fails records why in the job's store, so every other rank of every node stops
within a heartbeat and the agent can name it, and writes its own exception (type, message, where it was
raised, the traceback's last lines) to failure-rank<R>.json beside OUT.json: that is what the ERROR result
shows, also for a lone rank, which has no shared store.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpucert.bench import catalog
from gpucert.config.loader import ConfigError
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import (
    ABORTED_EXIT,
    AbortRecord,
    RendezvousError,
    Runtime,
    fail,
    leave_failed,
    own_record,
    say,
    start_runtime,
    stop_runtime,
)
from gpucert.runtime.spawn import die_with_parent

# Traceback lines kept in the failure file: the raising frame and its caller, and the exception line(s).
TRACEBACK_LINES = 8


def failure_path(out: Path, rank: int) -> Path:
    return out.with_name(f"failure-rank{rank}.json")


def raised_at(exc: BaseException) -> str | None:
    """Where exc was raised: `file:line in function` of the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = last.filename
    for root in ("/site-packages/", "/src/"):  # the package path, not where it is installed
        if root in path:
            path = path.split(root, 1)[1]
            break
    return f"{path}:{last.lineno} in {last.name}"


def write_failure(out: Path, rank: int, record: AbortRecord, exc: BaseException) -> None:
    """This rank's own failure, for the agent on this node (best effort: the rank is on its way out)."""
    text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    lines = [line for line in text if line.strip(" ^~")]  # not the column markers under the code
    payload = {**asdict(record), "where": raised_at(exc), "traceback": lines[-TRACEBACK_LINES:]}
    path = failure_path(out, rank)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(payload))
        tmp.replace(path)  # the agent may read it at any moment: whole or not at all


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
    # The rank's log says who it is and that it joined: from here on it beats and is watched.
    say(f"{rt.me.describe()} joined the job ({rt.world_size} ranks): bench {spec['benchmark']}")
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
        # This rank's account is on disk before the store can name it: an agent that reads the record stops
        # every worker at once, then reads the culprit's file. Written after, it raced the kill (CI, stop 26).
        write_failure(Path(argv[1]), rt.rank, own_record(rt, exc), exc)
        record = fail(rt, exc)
        say(record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}")
        leave_failed(rt, ABORTED_EXIT)
    stop_runtime(rt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
