"""Side-by-side table of nccl-tests and `gpucert bench collectives` over the same sizes and ops.

Usage: python tools/nccl_compare.py REPORT.json NCCL_TESTS.txt [NCCL_TESTS.txt ...] > compare.md
REPORT.json is the report of `gpucert bench collectives` (its collective.<op> results carry the curves); each
text file holds the output of one or more *_perf runs (several runs of one op are averaged per size).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucert.bench.nccl_tests import compare_markdown, parse_nccl_tests


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 3
    report = json.loads(Path(argv[0]).read_text())
    curves = [
        r["details"]
        for r in report["results"]
        if r["name"].startswith("collective.") and r.get("node") is None and "busbw_gbps" in r.get("details", {})
    ]
    runs = [run for path in argv[1:] for run in parse_nccl_tests(Path(path).read_text())]
    if not curves or not runs:
        print(f"found {len(curves)} gpucert curves in {argv[0]} and {len(runs)} nccl-tests runs", file=sys.stderr)
        return 3
    sys.stdout.write(compare_markdown(runs, curves))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
