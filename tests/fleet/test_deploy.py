"""deploy/: the Kubernetes manifests and the image they name, checked for structure (no cluster here): kinds,
images, every gpucert command they run parsed by gpucert's own parser, mounts for every path they write, the
node-problem-detector config consistent with the plugin, and the Dockerfile's sources present in the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpucert
from gpucert import cli
from gpucert.fleet.npd import MESSAGE_CHARS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
IMAGE = f"registry.example.com/gpucert:{gpucert.__version__}"


def documents(name: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), f"{name}: one object of each kind expected"
    return by_kind


def parse_gpucert(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """gpucert's own parser on a manifest's command; paths that exist only on a node are not looked up here."""
    monkeypatch.setattr(cli, "metrics_path", Path)
    try:
        return cli.build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"gpucert refuses the manifest's command {argv}", pytrace=False)


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def mounted(pod: dict[str, Any], path: str) -> bool:
    (container,) = pod["containers"]
    return any(path == m["mountPath"] or path.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])


def check_pod(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= volumes
    # Reports and metrics name the node: the pod takes the node's hostname.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    return container


def test_npd_daemonset_runs_the_health_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = documents("gpucert-npd.yaml")
    assert set(objects) == {"Namespace", "ServiceAccount", "ClusterRoleBinding", "ConfigMap", "DaemonSet"}
    daemonset = objects["DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    container = check_pod(pod)
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["ClusterRoleBinding"]["roleRef"]["name"] == "system:node-problem-detector"
    # No GPU is taken from the node's jobs: NVML sees them all through the toolkit's environment.
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    assert {e["name"]: e.get("value") for e in container["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"

    # The binary the Dockerfile puts in the image, with the plugin config the ConfigMap mounts.
    binary, *flags = container["command"]
    assert f"/node-problem-detector {binary}" in dockerfile()
    (monitor,) = [f.split("=", 1)[1] for f in flags if f.startswith("--config.custom-plugin-monitor=")]
    assert {"--port=0", "--prometheus-port=0"} <= set(flags)  # host network: no port of a node's own NPD taken
    (config_mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert Path(monitor).parent == Path(config_mount["mountPath"])
    plugin = json.loads(objects["ConfigMap"]["data"][Path(monitor).name])

    assert plugin["plugin"] == "custom"
    assert plugin["pluginConfig"]["max_output_length"] >= MESSAGE_CHARS
    conditions = {c["type"] for c in plugin["conditions"]}
    (rule,) = plugin["rules"]
    assert rule["type"] == "permanent" and rule["condition"] in conditions
    assert _seconds(rule["timeout"]) <= _seconds(plugin["pluginConfig"]["timeout"])  # NPD refuses a longer one
    # pip installs the console script there in the Python image the Dockerfile starts from.
    assert rule["path"] == "/usr/local/bin/gpucert" and "FROM ${PYTHON_IMAGE}" in dockerfile()
    args = parse_gpucert(rule["args"], monkeypatch)
    assert (args.verb, args.npd) == ("health", True)
    assert "health.liveness=false" in args.overrides  # the GPUs may be running jobs
    assert mounted(pod, str(args.output)) and mounted(pod, str(args.metrics_file))


def test_accept_job_takes_a_whole_idle_node(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = documents("gpucert-accept-job.yaml")
    assert set(objects) == {"Job"}
    job = objects["Job"]
    pod = job["spec"]["template"]["spec"]
    container = check_pod(pod)
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    program, *argv = container["command"]
    assert program == "gpucert"
    args = parse_gpucert(argv, monkeypatch)
    assert args.verb == "accept"
    runs_dir = next(o.split("=", 1)[1] for o in args.overrides if o.startswith("runs_dir="))
    assert mounted(pod, runs_dir) and mounted(pod, str(args.metrics_file))
    assert mounted(pod, "/dev/shm")


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)([smh])", text)
    assert match, text
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def copied_sources() -> list[str]:
    """What deploy/Dockerfile COPYs from the build context (the repository root)."""
    sources = []
    for line in dockerfile().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            sources += words[1:-1]
    return sources


def test_dockerfile_copies_files_that_exist_and_the_dockerignore_lets_them_in() -> None:
    sources = copied_sources()
    assert sources == ["pyproject.toml", "README.md", "src/", "configs/"]
    allowed = {line[1:] for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if line[:1] == "!"}
    for source in sources:
        assert (REPO / source).exists(), f"deploy/Dockerfile copies {source}, which the repository lacks"
        assert source in allowed, f"deploy/Dockerfile.dockerignore keeps {source} out of the build context"
    # The [bench] extra: torch for accept and the liveness matmul.
    assert '"${wheel}[bench]"' in dockerfile()


@pytest.mark.slow
def test_the_wheel_the_image_installs_holds_every_module(tmp_path: Path) -> None:
    """The wheel built from just what the Dockerfile copies carries every package of src/gpucert (one missing
    from pyproject's package list would be missing from the image)."""
    context = tmp_path / "context"
    context.mkdir()
    for source in copied_sources():
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / source, context / source)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", "dist", "."]
    done = subprocess.run(command, cwd=context, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (context / "dist").glob("gpucert-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(p.parent.relative_to(REPO / "src").as_posix() for p in (REPO / "src").rglob("__init__.py"))
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, f"pyproject.toml's [tool.setuptools] packages lacks {missing}: the image would too"
