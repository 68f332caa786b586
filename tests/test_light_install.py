"""A Slurm prolog's install: `pip install gpucert` alone runs discover and health, and neither they nor
`gpucert --help` import torch or the fine-tuning stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "datasets", "tensorboard", "matplotlib")


@pytest.mark.parametrize("argv", [["--help"], ["health", "--profile", "cpu"], ["discover"]])
def test_light_verbs_import_nothing_heavy(argv: list[str], tmp_path: Path) -> None:
    script = (
        "import json, sys\nfrom gpucert.cli import main\n"
        f"try:\n    main({argv + (['-o', str(tmp_path / 'run')] if argv[0] != '--help' else [])!r})\n"
        "except SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], done.stderr[-2000:]


@pytest.mark.slow
def test_pip_install_gpucert_alone_runs_health(tmp_path: Path) -> None:
    """A fresh environment with the core dependencies only (no torch anywhere): health still judges."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Only what the fresh environment installed: a developer's PYTHONPATH (a checkout's src/) would shadow it.
    fresh = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(REPO)], capture_output=True, text=True, timeout=600, env=fresh
    )
    assert install.returncode == 0, install.stderr[-3000:]
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, check=False, env=fresh)
    assert no_torch.returncode != 0
    run = tmp_path / "run"
    done = subprocess.run(
        [str(env_dir / "bin" / "gpucert"), "health", "--profile", "cpu", "-o", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=fresh,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "PASS"
    assert {r["name"] for r in report["results"]} >= {"gpu.count", "node.xid"}
