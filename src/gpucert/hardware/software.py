"""Versions of the software stack that decide how a GPU node behaves.

Package versions come from installed metadata, so nothing heavy is imported for them. Only the CUDA, cuDNN
and NCCL versions that torch was built with need ``import torch``, done in a child process and optionally (in this
process when torch is already imported here).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucert.hardware.sysfs import read_text


@dataclass(frozen=True)
class SoftwareVersions:
    python: str | None
    gpucert: str | None
    torch: str | None
    torch_cuda: str | None
    cudnn: str | None
    nccl: str | None
    transformers: str | None
    peft: str | None
    nvidia_ml_py: str | None
    kernel: str | None
    os: str | None


def parse_os_release(text: str) -> str | None:
    """PRETTY_NAME from os-release(5) text, falling back to NAME and VERSION_ID."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or key.strip().startswith("#"):
            continue
        try:
            # The format is a subset of shell assignments, quotes and escapes included.
            words = shlex.split(raw, comments=False)
        except ValueError:
            words = [raw.strip("\"'")]
        values[key.strip()] = " ".join(words)
    if values.get("PRETTY_NAME"):
        return values["PRETTY_NAME"]
    name = " ".join(v for v in (values.get("NAME"), values.get("VERSION_ID")) if v)
    return name or None


def format_cudnn_version(code: int | None) -> str | None:
    """Decode CUDNN_VERSION, what torch.backends.cudnn.version() returns. Its encoding changed in cuDNN 9
    (cudnn_version.h): major*1000 + minor*100 + patch before, major*10000 + minor*100 + patch since."""
    if code is None:
        return None
    major, rest = divmod(code, 10000) if code >= 90000 else divmod(code, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def format_nccl_version(version: Any) -> str | None:
    """torch.cuda.nccl.version() returns a tuple such as (2, 28, 3), with a suffix string as a fourth item
    when NCCL has one. Older torch returned NCCL_VERSION_CODE: major*10000 + minor*100 + patch since
    NCCL 2.9, major*1000 + minor*100 + patch before."""
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version[:3]) + "".join(str(part) for part in version[3:])
    if isinstance(version, int):
        major, rest = divmod(version, 10000) if version >= 20900 else divmod(version, 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpucert_version() -> str | None:
    version = _package_version("gpucert")
    if version is not None:
        return version
    try:
        from gpucert import __version__  # a source checkout that was never installed
    except ImportError:
        return None
    return str(__version__)


# What torch was built with, as [torch.version.cuda, cuDNN's version, NCCL's version], None for each torch cannot
# tell. Source text, so that a child needs torch alone (not gpucert, which a plain interpreter may not find), and a
# process that has torch already runs the same lines.
_TORCH_PROBE = """
import json

def ask_torch():
    import torch

    def ask(fn):
        try:
            return fn()
        except Exception:
            return None

    return [torch.version.cuda, ask(torch.backends.cudnn.version), ask(torch.cuda.nccl.version)]
"""


def _ask_torch_here() -> list[Any] | None:
    """The probe in this process when torch is imported here already; None when it is not, or is a stand-in
    without torch's attributes (a test's stub, a blocked import), which leaves the question to a child."""
    if sys.modules.get("torch") is None:
        return None
    namespace: dict[str, Any] = {}
    try:
        exec(_TORCH_PROBE, namespace)  # our own constant: the child's script
        answer: list[Any] = namespace["ask_torch"]()
    except Exception:
        return None
    return answer


def _torch_build_versions(timeout_s: float = 120.0) -> tuple[str | None, str | None, str | None]:
    """(CUDA, cuDNN, NCCL) that torch was built with; None for each that a CPU build lacks.

    Asked in a child process: `gpucert health` itself never imports torch (seconds, more from a slow shared
    filesystem; absent in a light `pip install gpucert`). A process that has torch already (a fine-tuning rank
    writing its report, `gpucert evaluate`) asks it directly: the child's import took 1.7 s of every fine-tuning
    run's end on one H200.
    """
    here = _ask_torch_here()
    if here is not None:
        return parse_torch_build(here)
    if importlib.util.find_spec("torch") is None:
        return None, None, None
    script = _TORCH_PROBE + "print(json.dumps(ask_torch()))\n"
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        return parse_torch_build(json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        return None, None, None


def parse_torch_build(answer: list[Any]) -> tuple[str | None, str | None, str | None]:
    """The probe's [torch.version.cuda, cudnn version, NCCL version] as (CUDA, cuDNN, NCCL) strings."""
    cuda, cudnn, nccl = answer
    return (
        str(cuda) if cuda else None,
        format_cudnn_version(cudnn) if cudnn else None,
        format_nccl_version(tuple(nccl) if isinstance(nccl, list) else nccl) if nccl else None,
    )


def collect_os_name(root: Path = Path("/")) -> str | None:
    # os-release(5): /etc/os-release wins, /usr/lib/os-release is the fallback.
    for relative in ("etc/os-release", "usr/lib/os-release"):
        text = read_text(root / relative)
        if text is not None:
            return parse_os_release(text)
    return None


def collect_software(root: Path = Path("/"), probe_torch: bool = True) -> SoftwareVersions:
    """``probe_torch=False`` skips ``import torch``, which takes seconds (more from a slow shared
    filesystem) and is not needed when only package versions matter."""
    cuda, cudnn, nccl = _torch_build_versions() if probe_torch else (None, None, None)
    # /proc/sys/kernel/osrelease holds the same string as uname -r, and can be faked under root.
    kernel = read_text(root / "proc/sys/kernel/osrelease")
    return SoftwareVersions(
        python=platform.python_version(),
        gpucert=_gpucert_version(),
        torch=_package_version("torch"),
        torch_cuda=cuda,
        cudnn=cudnn,
        nccl=nccl,
        transformers=_package_version("transformers"),
        peft=_package_version("peft"),
        nvidia_ml_py=_package_version("nvidia-ml-py"),
        kernel=kernel.strip() if kernel else None,
        os=collect_os_name(root),
    )
