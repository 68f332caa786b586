"""Shared test plumbing: fixture paths and the `gpu` marker, skipped where no NVIDIA GPU answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
NODE_BUNDLES = FIXTURES / "nodes"


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the lent GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def bundle_copy(tmp_path: Path):
    """A writable copy of a captured node bundle, for scenarios that alter it."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(NODE_BUNDLES / name, dst, symlinks=True)
        return dst

    return copy
