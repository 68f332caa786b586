"""`gpucert report` on real fine-tuning runs of the offline default recipe (tiny model, bundled data, on the CPU):
the terminal, Markdown and HTML views of a run and the comparison of two. The browser's helpers below open a page
in headless Chromium with every plot decoded; the offline default's run and its evaluation are drawn so in
tests/finetune/test_cli_finetune.py, beside the run's other checks (one 40-step run, not two)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucert.cli import main
from gpucert.report.compare import HIGHER, LOWER, compare_reports
from gpucert.report.store import load_report

CHROMIUM = Path("/usr/bin/chromium")
TRAINING_PLOTS = ["finetune.loss", "finetune.throughput", "finetune.memory"]
# Six steps of 256-token rows: seconds on a CPU. The loss threshold is one a 6-step run meets.
SHORT = ["--set", "train.max_steps=6", "--set", "train.eval_every=3", "--set", "train.save_every=6"]
SHORT += ["--set", "data.max_length=256", "--set", "train.final_loss_max=9"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two identical short runs (same seed, same data): their losses agree, their speeds need not."""
    root = tmp_path_factory.mktemp("finetune")
    here = os.getcwd()
    os.chdir(root)  # the data cache lands in ./.gpucert-cache
    try:
        for name in ("a", "b"):
            assert main(["finetune", "--output", str(root / name), *SHORT]) == 0
    finally:
        os.chdir(here)
    yield root / "a", root / "b"


@pytest.mark.slow
def test_report_shows_a_training_run(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(runs[0])]) == 0
    out = capsys.readouterr().out
    for name in ("final_loss", "checkpoint_present", "no_oom", "tokens_per_s_per_gpu", "data.preparation"):
        assert name in out, name
    assert "verdict: PASS" in out
    assert main(["report", str(runs[0]), "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# gpucert finetune: PASS")
    assert re.search(r"\| PASS \| final_loss \| run \| [0-9.]+ nats/token \| <= 9 \|", markdown)


def test_report_html_of_a_training_run(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(runs[0]), "--html"]) == 0
    assert capsys.readouterr().out.strip() == f"html: {runs[0] / 'report.html'}"
    html = (runs[0] / "report.html").read_text()
    assert re.findall(r'<img data-plot="([^"]+)"', html) == TRAINING_PLOTS
    assert "<h3>Data preparation</h3>" in html and "unparsable examples (10)" in html


@pytest.mark.slow
def test_report_compares_two_training_runs(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(runs[0]), str(runs[1]), "--markdown"])
    out = capsys.readouterr().out
    # Two CPU runs differ in speed by chance (a regression beyond 5 % is FAIL), never in their losses.
    assert code in (0, 1, 2)
    assert out.startswith("# gpucert comparison: ") and "results compared" in out
    comparisons = {c.name: c for c in compare_reports(load_report(runs[0]), load_report(runs[1]))}
    assert comparisons["final_loss"].direction == LOWER and comparisons["final_loss"].change_pct == pytest.approx(0)
    assert comparisons["eval_loss"].direction == LOWER and not comparisons["eval_loss"].regressed
    assert comparisons["tokens_per_s_per_gpu"].direction == HIGHER
    assert comparisons["peak_rss_gib"].direction == LOWER


def test_a_run_directory_from_before_reports_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path}: no report.json, only metrics.json" in err and "run it again" in err


# --- In a real browser --------------------------------------------------------------------------------------

# Added to a copy of the page (the report itself has no script): once everything has loaded, list every image
# with whether it decoded, for --dump-dom to print.
IMAGE_CHECK = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify([...document.images].map(i => ({
    plot: i.dataset.plot, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})));
  document.body.appendChild(out);
});
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def images_in_browser(page: Path, tmp_path: Path) -> list[dict[str, object]]:
    """Every image of the page as Chromium decoded it; fails on any console message (a page error)."""
    checked = tmp_path / f"{page.parent.name}-checked.html"
    checked.write_text(page.read_text().replace("</body>", IMAGE_CHECK + "</body>"))
    run = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", checked.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    found = re.search(r'<pre id="image-check">(.*?)</pre>', run.stdout, re.S)
    assert found is not None, run.stdout[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot_colours(page: Path, tmp_path: Path) -> int:
    from PIL import Image

    shot = tmp_path / f"{page.parent.name}.png"
    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1300,3000", page.as_uri())
    assert shot.exists(), run.stderr[-2000:]
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    return len(colours or [])
