"""A real Prometheus (Debian's `prometheus` package) for the scrape test: installed with apt-get where missing,
started on 127.0.0.1 with one scrape job, queried over its HTTP API, stopped at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port


class PrometheusSetupError(RuntimeError):
    pass


def reason_cannot_install() -> str | None:
    """Why Prometheus cannot run here (a skip reason), or None."""
    if shutil.which("prometheus"):
        return None
    if shutil.which("apt-get") is None:
        return "Prometheus is not installed and apt-get is unavailable (install Debian's `prometheus` package)"
    if os.geteuid() != 0:
        return "Prometheus is not installed and apt-get needs root (install Debian's `prometheus` package)"
    return None


def install() -> str:
    """The prometheus binary, apt-get installed (after `apt-get update` when the first try fails)."""
    found = shutil.which("prometheus")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=120"]
    command = [*apt, "install", "-y", "--no-install-recommends", "prometheus"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        subprocess.run([*apt, "update"], env=env, capture_output=True, timeout=600, check=False)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusSetupError(
            f"expected `{' '.join(command)}` to install prometheus, found none (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return found


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant query's vector (empty until a scrape has brought the series)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(address, timeout=5) as answer:
            body = json.loads(answer.read())
        if body.get("status") != "success":
            raise PrometheusSetupError(f"query {promql!r}: expected status success, found {body}")
        return list(body["data"]["result"])

    def wait_for(self, promql: str, timeout_s: float) -> list[dict[str, Any]]:
        """Poll the query until it answers a non-empty vector; fail naming Prometheus' log if it never does."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                found = self.query(promql)
                if found:
                    return found
            except OSError as exc:  # not listening yet
                last = exc
            time.sleep(0.5)
        raise PrometheusSetupError(
            f"expected {promql!r} to answer within {timeout_s} s, found nothing (last error: {last}); "
            f"prometheus log:\n{self.log.read_text()[-3000:]}"
        )


def start(binary: str, workdir: Path, target: str, scrape_interval_s: int = 1) -> Prometheus:
    """Prometheus scraping `target` (host:port) every second, its data and log under workdir."""
    config = {
        "global": {"scrape_interval": f"{scrape_interval_s}s", "evaluation_interval": f"{scrape_interval_s}s"},
        "scrape_configs": [{"job_name": "gpucert", "static_configs": [{"targets": [target]}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    # Prometheus takes its listen address on the command line, so the port is chosen here; the kernel's pick of
    # an ephemeral port is not handed out again at once.
    port = free_port()
    log = workdir / "prometheus.log"
    argv = [
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Prometheus(process, f"http://127.0.0.1:{port}", log)


def stop(prometheus: Prometheus) -> None:
    prometheus.process.terminate()
    try:
        prometheus.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        prometheus.process.kill()
        prometheus.process.wait(timeout=5)
