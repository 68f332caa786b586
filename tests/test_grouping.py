"""The suite's own scheduling (tests/conftest.py): under `make test`'s `-n 2 --dist loadgroup`, the tests of one
module fixture run on one worker, which builds the fixture once. pytest 9 stopped reading the suffix by which
pytest-xdist groups a test, and every such fixture was built on both workers unnoticed until this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODULE = """
import os
from pathlib import Path

import pytest

LOG = Path(__file__).parent / "built.log"


@pytest.fixture(scope="module")
def shared():
    with LOG.open("a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.mark.parametrize("n", range(8))
def test_uses_the_fixture(shared, n):
    assert shared == os.environ.get("PYTEST_XDIST_WORKER")


@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    pass
"""


def test_a_module_fixtures_tests_run_on_one_worker_which_builds_it_once(tmp_path: Path) -> None:
    (tmp_path / "test_synthetic.py").write_text(MODULE)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2"]
    argv += ["--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_synthetic.py")]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "16 passed" in done.stdout, done.stdout[-3000:]
    built = (tmp_path / "built.log").read_text().split()
    assert len(built) == 1, f"the module fixture was built on {built}"
