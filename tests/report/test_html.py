"""The HTML report and its plots, on the real health examples and the synthetic accept reports.

The browser test opens the page in headless Chromium (CI installs it; skipped where /usr/bin/chromium is
absent), takes a screenshot and dumps the DOM, so a page that only looks right to string matching fails.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from tests.conftest import FIXTURES
from tests.training_runs import evaluation_report, synthetic_metrics, training_report

import gpucert.report
from gpucert.report import plots
from gpucert.report.html import render_html
from gpucert.report.schema import Report, Result
from gpucert.report.store import load_report
from gpucert.status import Status

EXAMPLES = FIXTURES.parent.parent / "docs" / "examples"
SYNTHETIC = FIXTURES / "reports" / "accept-4xh200-synthetic.json"
REGRESSED = FIXTURES / "reports" / "accept-4xh200-synthetic-regressed.json"
HEALTH_EXAMPLES = [EXAMPLES / "h200x4-health.json", EXAMPLES / "h100-health.json"]
ALL_REPORTS = [*HEALTH_EXAMPLES, SYNTHETIC, REGRESSED]
SCHEMA = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
CHROMIUM = Path("/usr/bin/chromium")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TRAINING_PLOTS = ["finetune.loss", "finetune.throughput", "finetune.memory"]
SYNTHETIC_PLOTS = ["collectives", "matmul", "memory", "p2p", "training", "telemetry.matmul", "telemetry.train"]
# Which results each plot reads: dropping them must drop that plot and only that plot.
PLOT_INPUTS = {
    "collectives": lambda r: r.name.startswith("collective."),
    "matmul": lambda r: r.name.startswith("matmul."),
    "memory": lambda r: r.name.startswith("memory."),
    "p2p": lambda r: r.name == "p2p.matrix",
    "training": lambda r: r.name == "train.tokens_per_s_per_gpu",
    "telemetry.matmul": lambda r: r.name == "telemetry.matmul",
    "telemetry.train": lambda r: r.name == "telemetry.train",
}


@pytest.fixture(scope="module")
def synthetic() -> Report:
    return load_report(SYNTHETIC)


@functools.cache
def html_of(path: Path) -> str:
    # Rendering draws every plot (about a second for an accept report): once per file is enough.
    return render_html(load_report(path))


def plot_keys(html: str) -> list[str]:
    return re.findall(r'<img data-plot="([^"]+)"', html)


def with_results(report: Report, results: list[Result]) -> Report:
    return dataclasses.replace(report, results=results)


def replace_result(report: Report, name: str, **changes: object) -> Report:
    return with_results(report, [dataclasses.replace(r, **changes) if r.name == name else r for r in report.results])


@pytest.mark.parametrize("path", [SYNTHETIC, REGRESSED], ids=lambda p: p.stem)
def test_synthetic_fixtures_follow_the_schema(path: Path) -> None:
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert [e.message for e in validator.iter_errors(json.loads(path.read_text()))] == []


@pytest.mark.parametrize("path", ALL_REPORTS, ids=lambda p: p.stem)
def test_html_has_the_verdict_and_every_result(path: Path) -> None:
    report = load_report(path)
    html = html_of(path)
    assert html.startswith("<!DOCTYPE html>")
    assert f"<title>gpucert {report.meta.verb}: {report.status.value} on {report.meta.host}</title>" in html
    assert f'<span class="badge s-{report.status.value} big">{report.status.value}</span>' in html
    assert f"exit code {report.status.exit_code}" in html
    for r in report.results:
        assert f">{r.name}<" in html, r.name
    for g in report.inventory["gpus"]:
        assert f">{g['bus_id']}<" in html
    assert report.inventory["summary"] in html
    assert " ".join(report.meta.command) in html
    assert f"schema {report.schema_version}" in html


@pytest.mark.parametrize("path", ALL_REPORTS, ids=lambda p: p.stem)
def test_html_is_self_contained(path: Path) -> None:
    html = html_of(path)
    assert "<script" not in html
    assert re.findall(r'(?:src|href)="(?!data:image/png;base64,)', html) == []
    assert "url(" not in html
    assert "@import" not in html


@pytest.mark.parametrize("path", HEALTH_EXAMPLES, ids=lambda p: p.stem)
def test_health_reports_get_no_plots(path: Path) -> None:
    report = load_report(path)
    assert plots.report_plots(report) == []
    html = render_html(report)
    assert "<img" not in html and "<svg" not in html
    assert 'id="plots"' not in html


def test_synthetic_report_gets_one_image_per_plot() -> None:
    synthetic_html = html_of(SYNTHETIC)
    assert plot_keys(synthetic_html) == SYNTHETIC_PLOTS
    assert synthetic_html.count("<img") == len(SYNTHETIC_PLOTS)
    for b64 in re.findall(r'src="data:image/png;base64,([^"]+)"', synthetic_html):
        assert b64.startswith("iVBORw0KGgo")  # base64 of the PNG signature


@pytest.mark.parametrize("plot", SYNTHETIC_PLOTS)
def test_a_plot_is_drawn_only_when_its_results_exist(synthetic: Report, plot: str) -> None:
    report = with_results(synthetic, [r for r in synthetic.results if not PLOT_INPUTS[plot](r)])
    assert plot_keys(render_html(report)) == [p for p in SYNTHETIC_PLOTS if p != plot]


def test_health_results_never_feed_a_plot(synthetic: Report) -> None:
    # The same names outside the benchmark category (a health probe, say) are not benchmark data.
    health_only = with_results(synthetic, [dataclasses.replace(r, category="health") for r in synthetic.results])
    assert plots.report_plots(health_only) == []


def test_text_from_the_report_is_escaped(synthetic: Report) -> None:
    evil = "<script>alert('x')</script> & <b>bold</b>"
    report = replace_result(
        synthetic,
        "p2p.matrix",
        message=evil,
        remediation=f"do {evil}",
        subject="<i>node</i>",
        expected='<= "1"',
    )
    report = dataclasses.replace(report, meta=dataclasses.replace(report.meta, command=["gpucert", "<img src=x>"]))
    html = render_html(report)
    assert "<script" not in html
    assert "<b>bold</b>" not in html and "<i>node</i>" not in html and "<img src=x>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;i&gt;node&lt;/i&gt;" in html
    assert "&lt;= &quot;1&quot;" in html
    assert "gpucert &lt;img src=x&gt;" in html


def test_problems_section_lists_every_problem_worst_first() -> None:
    html = html_of(REGRESSED)
    section = html[html.index('id="problems"') : html.index('id="results"')]
    problems = re.findall(r'<div class="problem b-(\w+)">.*?</span> ([\w.]+) <span', section)
    assert problems == [
        ("FAIL", "matmul.bf16.max"),
        ("FAIL", "p2p.matrix"),
        ("FAIL", "p2p.pair"),
        ("FAIL", "p2p.pair"),
        ("FAIL", "collective.all_reduce"),
        ("WARN", "collective.all_gather"),
    ]
    assert "threshold: profile h200: benchmarks.busbw_gbps_min.all_reduce" in section
    assert "→ check NVLink state (nvidia-smi nvlink -s)" in section
    assert "found 317.3 GB/s" in section
    assert "on GPU 1 -&gt; GPU 2" in section


def test_a_clean_report_says_there_is_no_problem() -> None:
    html = html_of(EXAMPLES / "h200x4-health.json")
    assert "No WARN, FAIL or ERROR." in html


def test_per_gpu_grid_colours_each_cell_by_its_status() -> None:
    html = html_of(REGRESSED)
    row = re.search(r'<td class="check">matmul\.bf16\.max</td>(.*?)</tr>', html, re.S)
    assert row is not None
    cells = re.findall(r'<td class="cell s-(\w+)( bad)?" title="[^"]*">([^<]*)</td>', row.group(1))
    assert cells == [
        ("PASS", "", "800.5 TFLOP/s"),
        ("PASS", "", "797.8 TFLOP/s"),
        ("FAIL", " bad", "691.4 TFLOP/s"),
        ("PASS", "", "794.4 TFLOP/s"),
    ]
    assert "<th>GPU3</th>" in html


def test_node_results_and_inventory_tables() -> None:
    html = html_of(SYNTHETIC)
    assert '<td class="check">collective.all_reduce</td><td class="subject">4 ranks (nccl)</td>' in html
    assert ">44,591 tokens/s<" in html
    assert "<h3>per-GPU checks</h3>" in html and "<h3>per-GPU benchmark results</h3>" in html
    assert "<h3>node telemetry results</h3>" in html
    assert "GPU topology: NV18 all-to-all" in html
    assert html.count(">NV18<") == 12
    assert ">Gen5 x16 (Gen5 x16)<" in html
    assert "docker, unknown hypervisor (cpu flag)" in html
    assert "resolved configuration" in html


def test_a_report_with_a_minimal_inventory_renders(synthetic: Report) -> None:
    inventory = {"hostname": "n1", "summary": "no GPUs", "gpus": [], "topology": {"matrix": []}}
    html = render_html(dataclasses.replace(synthetic, inventory=inventory, results=[]))
    assert "No NVIDIA GPU found" in html
    assert "no judged results" in html


def test_plot_functions_return_png_only_when_the_data_exists(synthetic: Report) -> None:
    health = load_report(EXAMPLES / "h200x4-health.json").results
    drawers = [plots.plot_collectives, plots.plot_matmul, plots.plot_memory, plots.plot_p2p, plots.plot_training]
    for draw in drawers:
        png = draw(synthetic.results)
        assert png is not None and png.startswith(PNG_MAGIC), draw.__name__
        assert draw(health) is None, draw.__name__
        assert draw([]) is None, draw.__name__
    assert plots.telemetry_benchmarks(synthetic.results) == ["matmul", "train"]
    png = plots.plot_telemetry(synthetic.results, "matmul")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert plots.plot_telemetry(synthetic.results, "p2p") is None
    assert plots.telemetry_benchmarks(health) == []


def test_plots_render_the_same_bytes_twice(synthetic: Report) -> None:
    assert plots.plot_matmul(synthetic.results) == plots.plot_matmul(synthetic.results)


@pytest.mark.parametrize(
    ("name", "details"),
    [
        ("collective.all_reduce", {"sizes_bytes": [1024, 2048], "busbw_gbps": [1.0]}),
        ("collective.all_reduce", {"sizes_bytes": [1024, 2048], "busbw_gbps": [1.0, "fast"]}),
        ("collective.all_reduce", {"sizes_bytes": [0, 2048], "busbw_gbps": [1.0, 2.0]}),
        ("p2p.matrix", {"matrix_gbps": [[None, 1.0], [1.0]]}),
        ("p2p.matrix", {"matrix_gbps": [[None]]}),
        ("p2p.matrix", {"matrix_gbps": [[None, "x"], [1.0, None]]}),
        ("train.tokens_per_s_per_gpu", {"world_sizes": [1, 2], "tokens_per_s_per_gpu": [1.0]}),
        ("telemetry.matmul", {"t_s": [0, 1], "gpus": {"0": {"power_w": [1.0]}}}),
        ("telemetry.matmul", {"t_s": "soon", "gpus": {}}),
    ],
)
def test_malformed_details_draw_nothing(name: str, details: dict[str, object]) -> None:
    result = Result(
        name=name, subject="n", status=Status.PASS, message="m", expected="x", category="benchmark", details=details
    )
    assert [p for p in plots.report_plots(with_results(load_report(HEALTH_EXAMPLES[0]), [result]))] == []


def test_training_plot_without_loss_curves_still_draws_throughput() -> None:
    result = Result(
        name="train.tokens_per_s_per_gpu",
        subject="n",
        status=Status.PASS,
        message="m",
        expected="x",
        category="benchmark",
        details={"world_sizes": [1, 8], "tokens_per_s_per_gpu": [100.0, 95.0]},
    )
    png = plots.plot_training([result])
    assert png is not None and png.startswith(PNG_MAGIC)
    # A first size that measured 0 tokens/s has no share to print beside the others (it divided by zero).
    stalled = dataclasses.replace(result, details={"world_sizes": [1, 8], "tokens_per_s_per_gpu": [0.0, 95.0]})
    assert plots.plot_training([stalled]) is not None


def test_missed_samples_are_gaps_not_a_missing_plot() -> None:
    def telemetry(power: list[float | None]) -> Result:
        return Result(
            name="telemetry.matmul",
            subject="n",
            status=Status.PASS,
            message="m",
            expected="x",
            category="telemetry",
            details={"t_s": [0.0, 0.2, 0.4], "gpus": {"0": {"power_w": power}}},
        )

    png = plots.plot_telemetry([telemetry([500.0, None, 510.0])], "matmul")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert plots.plot_telemetry([telemetry([None, None, None])], "matmul") is None
    loss = Result(
        name="train.tokens_per_s_per_gpu",
        subject="n",
        status=Status.PASS,
        message="m",
        expected="x",
        category="benchmark",
        details={"loss": {"1": [10.0, None, 8.0]}},
    )
    assert plots.plot_training([loss]) is not None


@pytest.mark.parametrize(
    ("size", "text"),
    [(8, "8"), (1024, "1K"), (1536, "1.5K"), (1 << 20, "1M"), (256 << 20, "256M"), (4 << 30, "4G")],
)
def test_human_bytes(size: int, text: str) -> None:
    assert plots.human_bytes(size) == text


@pytest.mark.parametrize(
    ("expected", "limit"),
    [
        (">= 340", (">=", 340.0)),
        ("< 80 (FAIL at 87)", ("<", 80.0)),
        ("== 18 active", ("==", 18.0)),
        (">= 3.8", (">=", 3.8)),
        ("on", None),
        (None, None),
    ],
)
def test_parse_limit(expected: str | None, limit: tuple[str, float] | None) -> None:
    assert plots.parse_limit(expected) == limit


def test_rendering_leaves_matplotlib_global_state_alone() -> None:
    # In a fresh interpreter: no pyplot import, no backend chosen, no rcParams change. Reading
    # rcParams["backend"] would itself import pyplot to pick one, so the backend is asked without choosing.
    code = (
        "import sys, matplotlib\n"
        "rc = matplotlib.rcParams\n"
        "params = {k: rc[k] for k in rc if k != 'backend'}\n"
        "from pathlib import Path\n"
        "from gpucert.report.html import render_html\n"
        "from gpucert.report.store import load_report\n"
        f"render_html(load_report(Path({str(SYNTHETIC)!r})))\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "assert rc._get_backend_or_none() is None\n"
        "assert {k: rc[k] for k in rc if k != 'backend'} == params\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (CI installs it)")
def test_the_page_renders_in_a_real_browser(tmp_path: Path) -> None:
    from PIL import Image

    report = load_report(REGRESSED)
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    shot = tmp_path / "shot.png"

    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,3000", page.as_uri())
    assert shot.exists(), run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 3000)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # text, tables, badges and plots, not a blank page
    # The verdict badge and the FAIL problems are drawn in the FAIL red (#cf222e): CSS applied.
    red = sum(n for n, (r, g, b) in colours if abs(r - 0xCF) < 12 and abs(g - 0x22) < 12 and abs(b - 0x2E) < 12)
    assert red > 500

    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"gpucert {report.meta.verb} on {report.meta.host}" in dom.stdout
    assert '<span class="badge s-FAIL big">FAIL</span>' in dom.stdout
    assert len(re.findall(r"<img data-plot=", dom.stdout)) == len(SYNTHETIC_PLOTS)


# --- Fine-tuning runs and evaluations ------------------------------------------------------------------------


def section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}">')
    return html[start : html.index("</section>", start)]


FINETUNE_EXAMPLES = [EXAMPLES / "h100-finetune-tiny.json", EXAMPLES / "h100-finetune-qwen2-7b-speed.json"]


@pytest.mark.parametrize("path", FINETUNE_EXAMPLES, ids=lambda p: p.stem)
def test_real_training_reports_from_the_h100_validate_and_draw_every_curve(path: Path) -> None:
    data = json.loads(path.read_text())
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert [e.message for e in validator.iter_errors(data)] == []
    report = load_report(path)
    assert all(r.expected and r.threshold_source for r in report.results if r.status is Status.PASS)
    results = {r.name: r for r in report.results}
    # On a GPU the peak comes from the profile the GPU matched, and device memory is measured every step.
    assert results["mfu"].status is Status.INFO and "profile h100-sxm: bf16_peak_tflops" in results["mfu"].message
    series = results["steps"].details
    assert None not in series["mfu_pct"] and None not in series["memory_peak_gib"]
    html = html_of(path)
    assert plot_keys(html) == TRAINING_PLOTS
    assert "<h3>Rows dropped and repaired</h3>" in section(html, "training")


def test_a_training_run_gets_its_curves_and_its_data_report() -> None:
    report = training_report()
    html = render_html(report)
    assert plot_keys(html) == TRAINING_PLOTS
    training = section(html, "training")
    assert plot_keys(training) == TRAINING_PLOTS
    for r in report.results:
        assert f">{r.name}<" in html, r.name
    # The data-preparation report: the source, a column per split (nested counts flattened), the examples.
    assert "<h3>Data preparation</h3>" in training
    assert "<tr><th>unparsable</th><td>70</td></tr>" in training
    assert "<tr><th>source</th><td>glaiveai/glaive-function-calling-v2</td></tr>" in training
    assert '<td class="check">repairs.arguments_key</td><td class="num">41</td><td class="num">2</td>' in training
    assert '<td class="check">supervised_share</td><td class="num">31.0%</td><td class="num">30.0%</td>' in training
    assert "unparsable examples (2)" in training and "<code>17: arguments are not JSON</code>" in training
    assert "bad line examples (1)" in training
    # Each dropped or repaired case with its count and first example, most frequent first; data text escaped.
    cases = re.findall(r'<td>(\w+)</td><td class="check">(\w+)</td><td class="num">([\d,]+)</td>', training)
    assert cases == [
        ("dropped", "bad_arguments", "52"),
        ("dropped", "undeclared_function", "18"),
        ("repaired", "arguments_key", "43"),
    ]
    assert "excerpt: &lt;b&gt;x&lt;/b&gt;" in training and "<b>x</b>" not in training
    assert 'id="plots"' not in html and 'id="evaluation"' not in html


def test_a_training_plot_is_drawn_only_from_a_usable_series() -> None:
    def keys(metrics: dict) -> list[str]:
        return [p.key for p in plots.training_plots(training_report(metrics))]

    # A CPU run: no MFU panel, no device memory, host RSS still drawn.
    assert keys(synthetic_metrics(mfu=None, peak_gib=None)) == TRAINING_PLOTS
    legacy = synthetic_metrics()
    for record in legacy["step_log"]:
        del record["memory_gib"]  # steps logged by a gpucert that did not record memory
    assert keys(legacy) == ["finetune.loss", "finetune.throughput"]
    report = training_report()
    steps = next(r for r in report.results if r.name == "steps")
    short = {**steps.details, "loss": steps.details["loss"][:-1]}  # one step short: not aligned with `step`
    assert [p.key for p in plots.training_plots(replace_result(report, "steps", details=short))] == [
        "finetune.throughput",
        "finetune.memory",
    ]
    without = with_results(report, [r for r in report.results if r.name != "steps"])
    assert plots.training_plots(without) == []
    # The data report alone still gets its section.
    assert "<h3>Data preparation</h3>" in section(render_html(without), "training")
    # Results of another category with the same names are not a training run.
    other = with_results(report, [dataclasses.replace(r, category="benchmark") for r in report.results])
    assert plots.training_plots(other) == [] and 'id="training"' not in render_html(other)


def test_an_evaluation_gets_its_scores_per_tool_and_failures() -> None:
    report = evaluation_report(call_accuracy=85.0)
    html = render_html(report)
    assert report.status is Status.FAIL
    evaluation = section(html, "evaluation")
    # The metrics in one chart, the per-tool rows (one name, many subjects) in another.
    assert plot_keys(evaluation) == ["evaluation.scores", "evaluation.eval.tool"]
    assert '<td class="check">get_weather</td><td class="num">42</td><td class="num">41</td>' in evaluation
    assert "eval.overall: per tool" in evaluation
    assert "failures (1)" in evaluation and "get_weather(city=&#x27;Paris&#x27;)" in evaluation
    assert "expected a call to get_weather, found no call" in evaluation
    # Tool names come from data: escaped like every other text.
    assert "&lt;b&gt;book&lt;/b&gt;" in html and "<b>book</b>" not in html
    problems = section(html, "problems")
    assert "eval.call_accuracy" in problems and "expected &gt;= 90 %" in problems
    assert 'id="training"' not in html and 'id="plots"' not in html


def test_evaluation_plots_need_scores_in_percent() -> None:
    report = evaluation_report()
    assert [p.key for p in plots.evaluation_plots(report)] == ["evaluation.scores", "evaluation.eval.tool"]
    loss_only = with_results(report, [r for r in report.results if r.unit != "%"])
    assert plots.evaluation_plots(loss_only) == []
    png = plots.plot_evaluation([(report.results[0], 91.0)], "scores")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert plots.plot_evaluation([], "scores") is None


def test_a_report_file_gets_its_own_page_and_a_run_directory_its_report_html(tmp_path: Path) -> None:
    """`gpucert report X.json --html` wrote report.html beside X.json whatever X was: rendering the examples in
    one directory wrote one page six times over."""
    import shutil

    from gpucert.cli import main

    for name in ("h100-health.json", "h200x4-health.json"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
        main(["report", str(tmp_path / name), "--html"])
    assert sorted(p.name for p in tmp_path.glob("*.html")) == ["h100-health.html", "h200x4-health.html"]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(EXAMPLES / "h100-health.json", run / "report.json")
    main(["report", str(run / "report.json"), "--html"])
    main(["report", str(run), "--html"])
    assert sorted(p.name for p in run.iterdir()) == ["report.html", "report.json"]


def test_a_runs_line_on_a_plot_never_reads_a_small_figure_as_0() -> None:
    """The tiny model's MFU, 0.008 %, was labelled "run (timed steps): 0.0" at one decimal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        mfu = Result(name="train.mfu", subject="run", status=Status.INFO, value=0.008264, unit="%", message="m")
        plots._run_line(ax, mfu, "run (timed steps):")
        assert ax.get_lines()[0].get_label() == "run (timed steps): 0.00826"
    finally:
        plt.close(fig)
