"""How long each verb takes to refuse a bad input, as a user waits for it: a fresh `python -m gpucert` process
per try, the wall time from start to exit. The target is under 2 s on a 2-core machine (tests/test_recipes.py
checks the cause, that nothing heavy is imported first; this measures the effect).

    python tools/bench_input_errors.py [--repeats 5] [--json OUT]

Prints one line per case: median and slowest of the repeats, the exit code and the first line of stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    ("finetune: missing --config file", ["finetune", "--config", "nope.yaml"]),
    ("finetune: unknown recipe name", ["finetune", "--config", "qwen2-7b-glaivee"]),
    ("finetune: unknown key", ["finetune", "--set", "train.bogus=1"]),
    ("finetune: bad value", ["finetune", "--config", "qwen2-7b-glaive", "--set", "lora.r=0"]),
    ("finetune --list-recipes", ["finetune", "--list-recipes"]),
    ("evaluate: missing --data file", ["evaluate", "--adapter", "ADAPTER", "--data", "/nonexistent.jsonl"]),
    ("evaluate: missing --adapter", ["evaluate", "--adapter", "nowhere"]),
    ("accept: missing --config file", ["accept", "--config", "nope.yaml"]),
    ("health: unknown key", ["health", "--set", "health.bogus=1"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the timings here as well")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        adapter = Path(scratch) / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}\n")
        for label, argv in CASES:
            argv = [str(adapter) if a == "ADAPTER" else a for a in argv]
            times, done = [], None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "gpucert", *argv], cwd=scratch, capture_output=True, text=True, check=False
                )
                times.append(time.perf_counter() - t0)
            assert done is not None
            said = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[0][:90]
            rows.append(
                {
                    "case": label,
                    "argv": ["gpucert", *argv],
                    "median_s": round(statistics.median(times), 3),
                    "max_s": round(max(times), 3),
                    "exit_code": done.returncode,
                    "says": said,
                }
            )
            median = statistics.median(times)
            print(f"{label:34} median {median:5.2f} s  max {max(times):5.2f} s  exit {done.returncode}  {said}")
    if args.json:
        load = os.getloadavg()
        meta = {"cpus": os.cpu_count(), "loadavg_1m": round(load[0], 2), "repeats": args.repeats}
        args.json.write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
