from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucert.hardware import software
from gpucert.hardware.software import (
    collect_software,
    format_cudnn_version,
    format_nccl_version,
    parse_os_release,
    parse_torch_build,
)

INSTALLED = {"torch": "2.6.0+cu124", "nvidia-ml-py": "12.570.86", "transformers": "4.51.3"}


@pytest.fixture
def fake_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        if name not in INSTALLED:
            raise importlib.metadata.PackageNotFoundError(name)
        return INSTALLED[name]

    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n', "Ubuntu 22.04.4 LTS"),
        ("NAME='Rocky Linux'\nVERSION_ID=\"9.3\"\n", "Rocky Linux 9.3"),
        (
            '# comment\nPRETTY_NAME="Red Hat Enterprise Linux 9.4 (Plow)"\n',
            "Red Hat Enterprise Linux 9.4 (Plow)",
        ),
        ("", None),
    ],
)
def test_parse_os_release(text: str, expected: str | None) -> None:
    assert parse_os_release(text) == expected


@pytest.mark.parametrize(("code", "expected"), [(90100, "9.1.0"), (91000, "9.10.0"), (8902, "8.9.2"), (None, None)])
def test_format_cudnn_version(code: int | None, expected: str | None) -> None:
    assert format_cudnn_version(code) == expected


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ((2, 28, 3), "2.28.3"),
        ((2, 21, 5, "+cuda12.4"), "2.21.5+cuda12.4"),
        (21803, "2.18.3"),
        (2708, "2.7.8"),
        ("2.18.3", None),
    ],
)
def test_format_nccl_version(version: object, expected: str | None) -> None:
    assert format_nccl_version(version) == expected


@pytest.mark.usefixtures("fake_metadata")
def test_hgx_versions(hgx_root: Path) -> None:
    versions = collect_software(hgx_root, probe_torch=False)
    assert versions.torch == "2.6.0+cu124"
    assert (versions.transformers, versions.peft, versions.nvidia_ml_py) == ("4.51.3", None, "12.570.86")
    assert (versions.kernel, versions.os) == ("5.15.0-105-generic", "Ubuntu 22.04.4 LTS")
    assert versions.python == platform.python_version()


@pytest.mark.parametrize(
    ("answer", "parsed"),
    [
        (["12.4", 90100, [2, 21, 5]], ("12.4", "9.1.0", "2.21.5")),  # a CUDA build, as the probe prints it
        ([None, None, None], (None, None, None)),  # a CPU build: no CUDA, no cuDNN, no NCCL
    ],
)
def test_torch_build_versions_from_the_probe(answer: list, parsed: tuple) -> None:
    assert parse_torch_build(answer) == parsed


def test_the_child_probe_needs_torch_alone_not_gpucert(tmp_path: Path) -> None:
    # An interpreter that finds torch but not gpucert: no site processing (-S: the editable install's path file is
    # not read), no environment (-I), torch's directory alone on the path; then the probe's script as it is.
    import torch

    script = software._TORCH_PROBE + "print(json.dumps(ask_torch()))\n"
    site = str(Path(torch.__file__).parents[1])
    setup = f"import sys, importlib.util; sys.path.insert(0, {site!r}); assert not importlib.util.find_spec('gpucert')"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"{setup}\nexec({script!r})"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0] == torch.version.cuda


def test_a_stand_in_for_torch_leaves_the_question_to_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    for stand_in in (None, object()):  # a blocked import; a stub without torch's attributes
        monkeypatch.setitem(sys.modules, "torch", stand_in)
        assert software._ask_torch_here() is None
    monkeypatch.setitem(sys.modules, "torch", torch)
    answer = software._ask_torch_here()
    assert answer is not None and answer[0] == torch.version.cuda


def test_the_torch_probe_runs_in_a_child_and_leaves_this_process_without_torch() -> None:
    script = (
        "import json, sys\nfrom gpucert.hardware.software import _torch_build_versions\n"
        "print(json.dumps([_torch_build_versions(), 'torch' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    versions, imported = json.loads(done.stdout)
    import torch

    assert versions[0] == torch.version.cuda and imported is False


def test_a_process_that_has_torch_asks_it_without_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"started a child process {args}: torch is imported here already")

    monkeypatch.setattr(software.subprocess, "run", no_child)
    cuda, _, _ = software._torch_build_versions()
    assert cuda == torch.version.cuda


@pytest.mark.usefixtures("fake_metadata")
def test_gpucert_version_falls_back_to_package_attribute(tmp_path: Path) -> None:
    gpucert = pytest.importorskip("gpucert")
    assert collect_software(tmp_path, probe_torch=False).gpucert == gpucert.__version__


def test_real_vm_os_and_kernel(docker_vm_root: Path) -> None:
    versions = collect_software(docker_vm_root, probe_torch=False)
    assert versions.os == "Debian GNU/Linux 12 (bookworm)"
    assert versions.kernel == "6.18.44-fc-v657"
    assert (versions.torch_cuda, versions.cudnn, versions.nccl) == (None, None, None)


def test_os_release_falls_back_to_usr_lib(make_tree: Callable[..., Path]) -> None:
    root = make_tree({"usr/lib/os-release": 'PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"\n'})
    assert collect_software(root, probe_torch=False).os == "Rocky Linux 9.3 (Blue Onyx)"


def test_missing_tree_yields_none(tmp_path: Path) -> None:
    versions = collect_software(tmp_path, probe_torch=False)
    assert (versions.os, versions.kernel) == (None, None)
    assert json.loads(json.dumps(asdict(versions)))["python"] == platform.python_version()
