"""`gpucert evaluate --suite bfcl`: BFCL's data read from its own file layout (a committed subset,
tests/fixtures/bfcl), scored by our checker, judged per category, and run end to end on the tiny model."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucert.cli import main
from gpucert.finetune.config import EvalThresholds
from gpucert.finetune.eval.bfcl import (
    CATEGORIES,
    NO_CALL_CATEGORIES,
    PYTHON_HINT,
    BfclDataError,
    CategoryRun,
    bfcl_results,
    find_data_dir,
    load_category,
    load_suite,
)
from gpucert.finetune.eval.evaluate import Turn, score
from gpucert.finetune.eval.report import verdict_result
from gpucert.report.store import load_report
from gpucert.status import Status

DATA = Path(__file__).parents[1] / "fixtures" / "bfcl"


def right_answer(turn: Turn) -> str:
    """The answer BFCL's possible answer describes, as the model writes it: each parameter its first accepted
    value, one left out where it may be."""
    blocks = []
    for call in turn.expected:
        assert call.arguments is not None
        arguments = {key: _pick(values[0]) for key, values in call.arguments.items() if values[0] != ""}
        blocks.append(f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': arguments})}\n</tool_call>")
    return "\n".join(blocks) or "I cannot help with that using these functions."


def _pick(value: Any) -> Any:
    # An object in a possible answer lists its keys' accepted values too: take the first of each.
    if isinstance(value, dict):
        return {k: _pick(v[0]) for k, v in value.items() if v[0] != ""}
    if isinstance(value, list):
        return [_pick(v) for v in value]
    return value


def test_every_category_is_read_from_bfcls_own_file_layout() -> None:
    suite = load_suite(DATA)
    assert list(suite) == list(CATEGORIES)
    assert {category: len(turns) for category, turns in suite.items()} == dict.fromkeys(CATEGORIES, 3)
    simple = suite["simple"][0]
    assert simple.id == "simple_python_1"
    assert simple.messages == [{"role": "user", "content": "Calculate the factorial of 5 using math functions."}]
    (tool,) = simple.tools or []
    # As BFCL's Python handlers describe a function: the hint appended, JSON Schema's type names.
    assert tool["type"] == "function" and tool["function"]["name"] == "math.factorial"
    assert tool["function"]["description"].endswith(PYTHON_HINT)
    assert tool["function"]["parameters"]["type"] == "object"
    assert [c.name for c in simple.expected] == ["math.factorial"]
    assert all(not t.expected for c in NO_CALL_CATEGORIES for t in suite[c])
    assert [len(t.expected) for t in suite["parallel"]] == [3, 3, 3]
    assert load_category(DATA, "multiple", limit=1)[0].id == "multiple_2"


def test_the_right_answer_scores_every_entry_and_no_answer_only_the_irrelevance_ones() -> None:
    for category, turns in load_suite(DATA).items():
        right = score(turns, [right_answer(t) for t in turns])
        assert right.overall.correct == 3, (category, [f.reasons for f in right.failures])
        silent = score(turns, ["I don't know."] * len(turns))
        assert silent.overall.correct == (3 if category in NO_CALL_CATEGORIES else 0), category


def test_a_model_answering_with_string_arguments_fails_like_bfcl() -> None:
    (turn,) = load_category(DATA, "simple", limit=1)
    good = right_answer(turn)
    as_string = good.replace('"arguments": {"number": 5}', '"arguments": "{\\"number\\": 5}"')
    assert as_string != good
    scores = score([turn], [as_string])
    assert scores.overall.correct == 0
    assert scores.failures[0].reasons == [
        'math.factorial: arguments are not a JSON object: a JSON string, "{\\"number\\": 5}"'
    ]


def test_the_data_of_an_installed_bfcl_eval_package_is_found_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "bfcl_eval"
    shutil.copytree(DATA, package / "data")
    # Importing it would fail, as the real one does without its ~30 pinned dependencies.
    (package / "__init__.py").write_text("raise ImportError('bfcl_eval must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert find_data_dir(None) == package / "data"
    assert "bfcl_eval" not in sys.modules
    assert len(load_suite(find_data_dir(None), ["live_simple"])["live_simple"]) == 3


def test_missing_or_broken_data_is_named_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "bfcl_eval").exists()])
    with pytest.raises(BfclDataError, match="no BFCL data: expected --bfcl-data DIR"):
        find_data_dir(None)
    with pytest.raises(BfclDataError, match="--bfcl-data /nowhere: no such directory"):
        find_data_dir("/nowhere")
    with pytest.raises(BfclDataError, match=r"BFCL category simple: no .*BFCL_v4_simple_python\.json \(questions\)"):
        load_category(tmp_path, "simple")
    shutil.copytree(DATA, tmp_path / "data")
    (tmp_path / "data" / "BFCL_v4_multiple.json").write_text('{"id": "multiple_0", "question": [[]]\n')
    with pytest.raises(BfclDataError, match=r"BFCL_v4_multiple\.json:1: not JSON"):
        load_category(tmp_path / "data", "multiple")
    with pytest.raises(BfclDataError, match="unknown simple_java"):
        load_suite(DATA, ["simple_java"])
    with pytest.raises(BfclDataError, match="--bfcl-limit 0: expected at least 1"):
        load_suite(DATA, limit=0)


def _runs(outputs: dict[str, list[str]], base: dict[str, list[str]] | None = None) -> list[CategoryRun]:
    suite = load_suite(DATA, list(outputs))
    return [
        CategoryRun(
            category,
            score(turns, outputs[category]),
            1.5,
            None if base is None else score(turns, base[category]),
            None if base is None else 1.2,
        )
        for category, turns in suite.items()
    ]


def test_each_category_is_judged_against_its_threshold_with_the_base_model_beside() -> None:
    suite = load_suite(DATA, ["simple", "irrelevance"])
    answers = {c: [right_answer(t) for t in turns] for c, turns in suite.items()}
    answers["simple"][2] = "no idea"  # 2 of 3 right
    runs = _runs(answers, base={"simple": ["no idea"] * 3, "irrelevance": ["no idea"] * 3})

    unjudged = bfcl_results(runs)
    assert [(r.name, r.value, r.status) for r in unjudged] == [
        ("bfcl.simple", 66.67, Status.INFO),
        ("bfcl.irrelevance", 100.0, Status.INFO),
        ("bfcl.overall", 83.33, Status.INFO),
    ]
    assert unjudged[0].message.startswith(
        "2 of 3 entries right (the right calls, arguments matched), 66.7 %; base model 0/3 (0.0 %); "
        "e.g. simple_python_97: expected a call to math.factorial, found none"
    )
    assert unjudged[0].message.endswith("not judged: no eval.thresholds.bfcl_simple_min_pct in the recipe")
    assert unjudged[0].details["base"] == {"correct": 0, "total": 3, "time_s": 1.2}
    assert unjudged[0].details["summary"] == (
        "3 BFCL entries: 3 expected a call, 0 expected none; the model called in 2 (2 calls parsed); 2 fully right. "
        "Answered in 1.5 s."
    )
    assert unjudged[2].details["base_pct"] == 50.0
    assert verdict_result(unjudged).message.startswith("not judged: the recipe sets no eval.thresholds")

    thresholds = EvalThresholds(bfcl_simple_min_pct=70, bfcl_irrelevance_min_pct=90)
    judged = bfcl_results(runs, thresholds, "recipe.yaml")
    assert [(r.status, r.expected) for r in judged] == [
        (Status.FAIL, ">= 70 %"),
        (Status.PASS, ">= 90 %"),
        (Status.INFO, None),
    ]
    assert judged[0].threshold_source == "eval.thresholds.bfcl_simple_min_pct in recipe.yaml"
    verdict = verdict_result(judged)
    assert verdict.status is Status.FAIL
    assert verdict.message.startswith("not good enough: 1 of 2 thresholds not met: bfcl.simple 66.67 %")


def test_a_threshold_on_a_category_not_run_is_a_skip_row_the_verdict_counts() -> None:
    """--bfcl-categories simple,irrelevance with a floor on parallel: before 2026-11-29 the floor was dropped
    without a word and the verdict read "all 1 thresholds met"."""
    suite = load_suite(DATA, ["simple", "irrelevance"])
    runs = _runs({c: [right_answer(t) for t in turns] for c, turns in suite.items()})
    thresholds = EvalThresholds(bfcl_parallel_min_pct=50, bfcl_overall_min_pct=5)
    results = bfcl_results(runs, thresholds, "recipe.yaml", limit=50)
    assert [(r.name, r.status, r.expected) for r in results] == [
        ("bfcl.simple", Status.INFO, None),
        ("bfcl.irrelevance", Status.INFO, None),
        ("bfcl.parallel", Status.SKIP, ">= 50 %"),
        ("bfcl.overall", Status.PASS, ">= 5 %"),
    ]
    skipped = results[2]
    assert skipped.message == (
        "eval.thresholds.bfcl_parallel_min_pct is set (>= 50 %), but BFCL parallel was not run "
        "(--bfcl-categories simple,irrelevance): not judged"
    )
    assert skipped.threshold_source == "eval.thresholds.bfcl_parallel_min_pct in recipe.yaml"
    assert skipped.remediation and "--bfcl-categories" in skipped.remediation
    # A mean over two categories, and over the first entries of each, is not BFCL's overall score: said so.
    assert results[3].message == (
        "expected >= 5 %, found unweighted mean over 2 of BFCL's 10 categories (simple, irrelevance), at most the "
        "first 50 entries of each (--bfcl-limit), not BFCL's overall score: 100.0 %"
    )
    assert results[3].details["not_run"] == [c for c in CATEGORIES if c not in ("simple", "irrelevance")]
    verdict = verdict_result(results)
    assert verdict.status is Status.PASS
    assert verdict.message == (
        "good: all 1 thresholds judged met (bfcl.overall); 1 of the 2 thresholds set not judged: bfcl.parallel "
        "(BFCL parallel not run: --bfcl-categories left it out)"
    )
    assert verdict.details["not_judged"] == ["bfcl.parallel"]

    # Only floors on categories not run: nothing judged, and the verdict does not claim the recipe set none.
    alone = verdict_result(bfcl_results(runs, EvalThresholds(bfcl_parallel_min_pct=50)))
    assert alone.status is Status.INFO
    assert alone.message.startswith("not judged: none of the thresholds set applies to what this evaluation ran")
    assert alone.message.endswith(
        "1 of the 1 thresholds set not judged: bfcl.parallel (BFCL parallel not run: --bfcl-categories left it out)"
    )

    # Every category, every entry: the mean is BFCL's overall and says nothing more.
    every = _runs({c: [right_answer(t) for t in turns] for c, turns in load_suite(DATA).items()})
    assert bfcl_results(every)[-1].message.startswith("unweighted mean over BFCL's 10 categories: 100.0 %; not")


def test_a_category_without_entries_is_an_error() -> None:
    run = CategoryRun("simple", score([], []), 0.0)
    assert [r.status for r in bfcl_results([run])] == [Status.ERROR, Status.ERROR]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter of the tiny model as training saves one, its B matrices non-zero so it changes the answers."""
    import torch

    from gpucert.finetune.config import DataConfig, LoraConfig, ModelConfig
    from gpucert.finetune.data.tokenizer import load_tokenizer
    from gpucert.finetune.model.lora import load_model

    torch.manual_seed(0)
    model_cfg = ModelConfig(name="tiny", dtype="fp32")
    model, _ = load_model(
        model_cfg, LoraConfig(r=8, alpha=16, dropout=0.0), load_tokenizer(model_cfg, DataConfig()), torch.device("cpu")
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("run") / "adapter"
    model.save_pretrained(str(path))
    return path


@pytest.mark.slow  # two model loads and 21 greedy answers of the tiny model on the CPU
def test_evaluate_suite_bfcl_end_to_end_on_the_tiny_model(adapter: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bfcl"
    argv = ["evaluate", "--adapter", str(adapter), "--suite", "bfcl", "--bfcl-data", str(DATA), "--bfcl-limit", "1"]
    argv += ["--set", "eval.max_new_tokens=4", "--output", str(out), "--compare-base"]
    assert main(argv) == 0
    report = load_report(out)
    assert report.meta.verb == "evaluate" and report.meta.config["evaluate"]["suite"] == "bfcl"
    names = [r.name for r in report.results]
    assert names == [*(f"bfcl.{c}" for c in CATEGORIES), "bfcl.overall", "eval.verdict"]
    # The tiny model's scores mean nothing; the pipeline is real: every category scored, timed, and the base
    # model beside it.
    for result in report.results[: len(CATEGORIES)]:
        assert result.status is Status.INFO and result.details["total"] == 1, result
        assert result.details["time_s"] > 0 and result.details["base"]["total"] == 1
    assert report.results[-1].status is Status.INFO
    assert "bfcl.overall" in capsys.readouterr().out

    # A threshold a recipe sets judges its category (a floor of 0 % always passes). The re-run in place
    # replaces the earlier report, and drops its page, which would show the earlier scores.
    (out / "report.html").write_text("<html>the earlier run</html>")
    argv.remove("--compare-base")
    argv += ["--bfcl-categories", "irrelevance", "--set", "eval.thresholds.bfcl_irrelevance_min_pct=0"]
    assert main(argv) == 0
    assert not (out / "report.html").exists()
    report = load_report(out)
    assert [(r.name, r.status) for r in report.results] == [
        ("bfcl.irrelevance", Status.PASS),
        ("bfcl.overall", Status.INFO),
        ("eval.verdict", Status.PASS),
    ]


def test_evaluate_suite_bfcl_without_data_exits_3_before_loading_a_model(tmp_path: Path, capsys) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")  # never read: the data is looked for first
    argv = ["evaluate", "--adapter", str(adapter), "--suite", "bfcl", "--bfcl-data", str(tmp_path / "none")]
    assert main(argv) == 3
    assert f"--bfcl-data {tmp_path / 'none'}: no such directory" in capsys.readouterr().err
