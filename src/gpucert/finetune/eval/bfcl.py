"""BFCL's single-turn AST categories as a `gpucert evaluate` suite: `gpucert evaluate --suite bfcl`.

    gpucert evaluate --adapter runs/<id> --suite bfcl [--bfcl-data DIR] [--compare-base]

Collect: BFCL's data files (Berkeley Function Calling Leaderboard, ShishirPatil/gorilla, Apache-2.0), read from
`--bfcl-data DIR` or from the data/ folder of an installed `bfcl_eval` package, which is found, never imported
(it pins an old numpy and some 30 heavy dependencies). A category is two JSON Lines files, as BFCL ships them:
`BFCL_v4_<category>.json` (id, question, function) and `possible_answer/BFCL_v4_<category>.json` (id,
ground_truth); the irrelevance categories have no answer file (no call is right). Each entry becomes one
evaluate.Turn: its question, its functions as tools (described as BFCL's Python handlers describe them), BFCL's
possible answer as the reference. The model answers through the chat template training used (evaluate.generate)
and evaluate.score judges each answer by BFCL's AST rules (docs/evaluation.md lists where it differs, and why).

Judge: a category's accuracy is the share of its entries fully right; `bfcl_results` holds each to
eval.thresholds.bfcl_<category>_min_pct and their unweighted mean (BFCL's summaries are unweighted means of
categories) to eval.thresholds.bfcl_overall_min_pct. No threshold: INFO, shown and never PASS; a threshold on a
category not run: a SKIP row naming it, which the verdict counts as not judged.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucert.finetune.config import EvalConfig, EvalThresholds
from gpucert.finetune.eval.checker import possible_answer_calls
from gpucert.finetune.eval.evaluate import EvalScores, Progress, Turn, generate, say_progress, score
from gpucert.finetune.eval.report import ThresholdSources, counts_sentence, threshold_text
from gpucert.report.schema import Result
from gpucert.status import Status

# BFCL v4's single-turn categories scored by AST, in its leaderboard's order. live_relevance is left out: it has
# no possible answer (BFCL counts any call as right), so our checker has nothing to compare.
CATEGORIES = (
    "simple",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
)
NO_CALL_CATEGORIES = ("irrelevance", "live_irrelevance")
# v4 splits "simple" by language; Java's and JavaScript's entries are typed in those languages, not JSON.
FILE_STEMS = {"simple": "simple_python"}
# What BFCL appends to every function description of a Python category (bfcl_eval/utils.py).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# BFCL's type names as JSON Schema writes them, for the prompt ("any": no type at all).
SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
SUBJECT = "BFCL {category}"
CATEGORY = "evaluation"
MAX_EXAMPLES = 3
MAX_FAILURES = 20
ENTRY = ("BFCL entry", "BFCL entries")


class BfclDataError(ValueError):
    """BFCL data that cannot be found or read: the file (and line), what was expected, what to do (exit 3)."""


@dataclass(frozen=True)
class CategoryRun:
    """One category's entries scored: the adapter's scores and, when asked, the base model's."""

    category: str
    scores: EvalScores
    time_s: float
    base: EvalScores | None = None
    base_time_s: float | None = None


# ---------------------------------------------------------------------------------------------------- collect


def find_data_dir(given: str | Path | None) -> Path:
    """The directory of BFCL's data files: `given`, else the data/ of an installed bfcl_eval package."""
    if given is not None:
        path = Path(given).expanduser()
        if not path.is_dir():
            raise BfclDataError(f"--bfcl-data {given}: no such directory; expected BFCL's data/ folder")
        return path
    spec = importlib.util.find_spec("bfcl_eval")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise BfclDataError(
            "no BFCL data: expected --bfcl-data DIR (BFCL's bfcl_eval/data folder, from a clone of "
            "ShishirPatil/gorilla, berkeley-function-call-leaderboard/) or an installed bfcl_eval package, whose "
            "data files alone are read"
        )
    return Path(locations[0]) / "data"


def data_file(directory: Path, category: str, answers: bool = False) -> Path:
    """The category's question file (or possible-answer file), of the newest BFCL version present."""
    stem = FILE_STEMS.get(category, category)
    folder = directory / "possible_answer" if answers else directory
    # BFCL_v*_multiple.json would match parallel_multiple too: the version is digits, the stem exact.
    pattern = re.compile(rf"BFCL_v(\d+)_{re.escape(stem)}\.json")
    versions = {p: m for p in folder.glob("BFCL_v*.json") if (m := pattern.fullmatch(p.name))}
    found = sorted(versions, key=lambda p: int(versions[p].group(1)))
    if not found:
        what = "possible answers" if answers else "questions"
        raise BfclDataError(
            f"BFCL category {category}: no {folder / f'BFCL_v4_{stem}.json'} ({what}); expected BFCL's data folder "
            f"(--bfcl-data), or leave {category} out (--bfcl-categories)"
        )
    return found[-1]


def read_entries(path: Path) -> list[dict[str, Any]]:
    """A BFCL data file: one JSON object per line (the .json files are JSON Lines)."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BfclDataError(f"{path}:{number}: not JSON ({exc.msg}); expected one BFCL entry a line") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise BfclDataError(f"{path}:{number}: expected an object with a string 'id'")
            entries.append(entry)
    return entries


def bfcl_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function description as an OpenAI-style tool, as BFCL's handlers present it: the Python hint
    appended to the description, its types in JSON Schema's names."""
    fn = copy.deepcopy(dict(function))
    fn["description"] = str(fn.get("description", "")) + PYTHON_HINT
    if isinstance(fn.get("parameters"), dict):
        fn["parameters"] = _schema_types(fn["parameters"])
    return {"type": "function", "function": fn}


def _schema_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_schema_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _schema_types(value) for key, value in schema.items() if not (key == "type" and value == "any")}
    if isinstance(out.get("type"), str):
        out["type"] = SCHEMA_TYPES.get(out["type"], out["type"])
    return out


def load_category(directory: Path, category: str, limit: int | None = None) -> list[Turn]:
    """The category's first `limit` entries (all by default) as Turns named by their BFCL id."""
    questions_path = data_file(directory, category)
    entries = read_entries(questions_path)[:limit]
    answers: dict[str, Any] = {}
    answers_path = None
    if category not in NO_CALL_CATEGORIES:
        answers_path = data_file(directory, category, answers=True)
        answers = {e["id"]: e.get("ground_truth") for e in read_entries(answers_path)}
    turns = []
    for n, entry in enumerate(entries):
        where = f"{questions_path.name}, {entry['id']}"
        question, functions = entry.get("question"), entry.get("function")
        if not (isinstance(question, list) and len(question) == 1 and isinstance(question[0], list) and question[0]):
            raise BfclDataError(f"{where}: expected 'question' to hold one turn (a list of messages)")
        if not isinstance(functions, list):
            raise BfclDataError(f"{where}: expected 'function' to be a list of function descriptions")
        expected = []
        if answers_path is not None:
            if entry["id"] not in answers:
                raise BfclDataError(f"{where}: no possible answer for it in {answers_path}")
            try:
                expected = possible_answer_calls(answers[entry["id"]], f"{answers_path.name}, {entry['id']}")
            except ValueError as exc:
                raise BfclDataError(str(exc)) from None
        messages = [dict(m) for m in question[0]]
        tools = [bfcl_tool(f) for f in functions]
        turns.append(Turn(messages, tools, expected, conversation=n, message=len(messages), label=entry["id"]))
    return turns


def load_suite(
    directory: Path, categories: Sequence[str] = CATEGORIES, limit: int | None = None
) -> dict[str, list[Turn]]:
    if limit is not None and limit < 1:
        raise BfclDataError(f"--bfcl-limit {limit}: expected at least 1 entry per category")
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise BfclDataError(
            f"--bfcl-categories: unknown {', '.join(unknown)}; expected some of {', '.join(CATEGORIES)}"
        )
    return {category: load_category(directory, category, limit) for category in categories}


def run_suite(
    model: Any,
    tokenizer: Any,
    suite: Mapping[str, Sequence[Turn]],
    eval_cfg: EvalConfig,
    compare_base: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> list[CategoryRun]:
    """Generate and score every category with the adapter, then (compare_base) with it disabled. `say` hears
    each category's start and result and, in a long one, how far it has got (a Progress)."""

    def answer(turns: Sequence[Turn], what: str) -> tuple[EvalScores, float]:
        started = time.perf_counter()
        prompts = [(t.messages, t.tools) for t in turns]
        progress = Progress(what, len(turns), say)
        outputs = generate(model, tokenizer, prompts, eval_cfg.batch_size, eval_cfg.max_new_tokens, progress)
        return score(turns, outputs, MAX_FAILURES), time.perf_counter() - started

    runs = []
    for n, (category, turns) in enumerate(suite.items(), 1):
        say(f"BFCL {category} ({n} of {len(suite)} categories): answering {len(turns)} entries")
        scores, elapsed = answer(turns, f"BFCL {category}")
        say(f"BFCL {category}: {scores.overall} fully right in {elapsed:.1f} s")
        base, base_time = None, None
        if compare_base:
            with model.disable_adapter():  # PEFT: the base model's own weights, nothing reloaded
                base, base_time = answer(turns, f"BFCL {category}, base model")
            say(f"BFCL {category}, base model: {base.overall} fully right in {base_time:.1f} s")
        runs.append(
            CategoryRun(category, scores, round(elapsed, 3), base, None if base_time is None else round(base_time, 3))
        )
    return runs


# ------------------------------------------------------------------------------------------------------ judge


def bfcl_results(
    runs: Sequence[CategoryRun],
    thresholds: EvalThresholds | None = None,
    source: str | ThresholdSources = "defaults",
    limit: int | None = None,
) -> list[Result]:
    """One result per category (`bfcl.<category>`, % of its entries fully right) and `bfcl.overall`, their
    unweighted mean; each judged against its eval.thresholds.bfcl_* floor, INFO without one. A floor set on a
    category that was not run is a SKIP row naming it: dropped, it would let the verdict count fewer thresholds
    than were set without a word. `limit` (--bfcl-limit) is said in bfcl.overall's message."""
    thresholds = thresholds or EvalThresholds()
    results = [_category_result(run, thresholds, source) for run in runs]
    run_names = [run.category for run in runs]
    results += [
        _not_run_result(category, floor, run_names, source)
        for category in CATEGORIES
        if category not in run_names and (floor := _floor(thresholds, category)) is not None
    ]
    scored = [run for run in runs if run.scores.overall.total]
    mean = sum(run.scores.overall.percent or 0.0 for run in scored) / len(scored) if scored else None
    base_runs = [run.base for run in scored if run.base is not None]
    base_mean = (
        sum(b.overall.percent or 0.0 for b in base_runs) / len(base_runs)
        if len(base_runs) == len(scored) and scored
        else None
    )
    details: dict[str, Any] = {
        "categories": {r.category: _summary(r) for r in runs},
        "not_run": [c for c in CATEGORIES if c not in run_names],
        "limit": limit,
    }
    found = f"{_mean_over([r.category for r in scored], limit)}: {mean:.1f} %" if mean is not None else ""
    if base_mean is not None:
        found += f" (base model {base_mean:.1f} %)"
        details["base_pct"] = round(base_mean, 2)
    results.append(
        _judged(
            "bfcl.overall",
            "overall",
            mean,
            found,
            _floor(thresholds, "overall"),
            source,
            details,
            "no category had an entry",
        )
    )
    return results


def _mean_over(categories: Sequence[str], limit: int | None) -> str:
    """What bfcl.overall averages, in words: a mean over some categories, or over the first entries of each, is
    not the overall score BFCL publishes, and a reader comparing it with one must be told."""
    some = len(categories) < len(CATEGORIES)
    what = f"unweighted mean over BFCL's {len(CATEGORIES)} categories"
    if some:
        names = ", ".join(categories)
        what = f"unweighted mean over {len(categories)} of BFCL's {len(CATEGORIES)} categories ({names})"
    if limit is not None:
        what += f", at most the first {limit} entries of each (--bfcl-limit)"
    return what + (", not BFCL's overall score" if some or limit is not None else "")


def _not_run_result(category: str, floor: float, run: Sequence[str], source: str | ThresholdSources) -> Result:
    key = f"eval.thresholds.bfcl_{category}_min_pct"
    return Result(
        name=f"bfcl.{category}",
        subject=SUBJECT.format(category=category),
        status=Status.SKIP,
        message=f"{key} is set (>= {floor:g} %), but BFCL {category} was not run (--bfcl-categories "
        f"{','.join(run)}): not judged",
        unit="%",
        expected=f">= {floor:g} %",
        threshold_source=threshold_text(source, key),
        remediation=f"add {category} to --bfcl-categories to judge it, or leave --bfcl-categories out to run every "
        "category",
        category=CATEGORY,
        details={"why": f"BFCL {category} not run: --bfcl-categories left it out", "threshold_key": key},
    )


def _summary(run: CategoryRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "correct": run.scores.overall.correct,
        "entries": run.scores.overall.total,
        "time_s": run.time_s,
    }
    if run.base is not None:
        out["base_correct"] = run.base.overall.correct
    return out


def _floor(thresholds: EvalThresholds, key: str) -> float | None:
    value = getattr(thresholds, f"bfcl_{key}_min_pct", None)
    return None if value is None else float(value)


def _category_result(run: CategoryRun, thresholds: EvalThresholds, source: str | ThresholdSources) -> Result:
    rate = run.scores.overall
    what = "no call made" if run.category in NO_CALL_CATEGORIES else "the right calls, arguments matched"
    found = f"{rate.correct} of {rate.total} entries right ({what})"
    if rate.percent is not None:
        found += f", {rate.percent:.1f} %"
    details: dict[str, Any] = {
        "correct": rate.correct,
        "total": rate.total,
        "time_s": run.time_s,
        "summary": f"{counts_sentence(run.scores.counts, ENTRY)} Answered in {run.time_s:g} s.",
        "counts": dict(run.scores.counts),
        "examples": [{"entry": f.turn_id, "reasons": f.reasons} for f in run.scores.failures[:MAX_EXAMPLES]],
        "failures": [
            {"entry": f.turn_id, "expected": f.expected, "output": f.output, "reasons": f.reasons}
            for f in run.scores.failures
        ],
    }
    if run.base is not None:
        found += f"; base model {run.base.overall}"
        details["base"] = {
            "correct": run.base.overall.correct,
            "total": run.base.overall.total,
            "time_s": run.base_time_s,
        }
    if run.scores.failures and run.scores.failures[0].reasons:
        found += f"; e.g. {run.scores.failures[0].turn_id}: {run.scores.failures[0].reasons[0]}"[:240]
    return _judged(
        f"bfcl.{run.category}",
        run.category,
        rate.percent,
        found,
        _floor(thresholds, run.category),
        source,
        details,
        "the category's data file has no entry",
    )


def _judged(
    name: str,
    key: str,
    pct: float | None,
    found: str,
    floor: float | None,
    source: str | ThresholdSources,
    details: dict[str, Any],
    empty: str,
) -> Result:
    def result(status: Status, message: str, remediation: str | None = None) -> Result:
        return Result(
            name=name,
            subject=SUBJECT.format(category=key),
            status=status,
            message=message,
            value=None if pct is None else round(pct, 2),
            unit="%",
            expected=None if floor is None else f">= {floor:g} %",
            threshold_source=None if floor is None else threshold_text(source, f"eval.thresholds.bfcl_{key}_min_pct"),
            remediation=remediation,
            category=CATEGORY,
            details=details,
        )

    if pct is None:
        return result(Status.ERROR, f"expected entries to score, found none: {empty}", "check the BFCL data folder")
    if floor is None:
        return result(Status.INFO, f"{found}; not judged: no eval.thresholds.bfcl_{key}_min_pct in the recipe")
    if pct >= floor:
        return result(Status.PASS, f"expected >= {floor:g} %, found {found}")
    return result(
        Status.FAIL,
        f"expected >= {floor:g} %, found {found}",
        "read the failing entries (details.failures); a model that never calls or writes malformed blocks usually "
        "means the prompt template differs from training's",
    )


# ---------------------------------------------------------------------------------------------------- command


def add_suite_arguments(parser: Any) -> None:
    """`gpucert evaluate`'s options for choosing the suite (cli.py's evaluate subparser)."""
    parser.add_argument(
        "--suite",
        choices=("held-out", "bfcl"),
        default="held-out",
        help="held-out: the recipe's held-out turns (default); bfcl: BFCL's single-turn AST categories, report in "
        "evaluation-bfcl/ beside the adapter",
    )
    parser.add_argument("--bfcl-data", help="BFCL's data folder (default: that of an installed bfcl_eval package)")
    parser.add_argument(
        "--bfcl-categories", help=f"comma-separated BFCL categories (default: all of {', '.join(CATEGORIES)})"
    )
    parser.add_argument("--bfcl-limit", type=int, help="the first N entries of each category (default: all)")
    parser.add_argument(
        "--compare-base", action="store_true", help="--suite bfcl: score the base model too (adapter disabled)"
    )


def evaluate_bfcl(args: Any, cfg: Any, adapter: Path, out: Path, thresholds_from: str | ThresholdSources) -> int:
    """`gpucert evaluate --suite bfcl`: find and read the data, then load the model, answer, score, and write the
    report (report.json, report.md) to `out` (checked by the caller: by default evaluation-bfcl/ beside the
    adapter), each judged result naming `thresholds_from`. The exit code is the report's verdict; missing data
    exits 3 before any model is loaded."""
    import dataclasses
    import sys
    from datetime import datetime, timezone

    directory = find_data_dir(args.bfcl_data)
    categories = [c.strip() for c in args.bfcl_categories.split(",")] if args.bfcl_categories else list(CATEGORIES)
    suite = load_suite(directory, categories, args.bfcl_limit)
    started = datetime.now(timezone.utc)

    import torch
    from rich.console import Console

    from gpucert.finetune.data.tokenizer import load_tokenizer
    from gpucert.finetune.eval.report import (
        BFCL_FAIL_REMEDIATION,
        evaluation_report,
        other_suites_floors,
        verdict_result,
    )
    from gpucert.finetune.model.lora import adapter_for_generation
    from gpucert.hardware.inventory import collect_inventory, live_sources
    from gpucert.report.store import clear_earlier_run, write_report
    from gpucert.report.terminal import print_report

    tokenizer = load_tokenizer(cfg.model, cfg.data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    say_progress(f"loading {cfg.model.name} with the adapter {adapter} on {device}")
    model, _ = adapter_for_generation(cfg.model, tokenizer, adapter, device)
    with torch.no_grad():
        runs = run_suite(model, tokenizer, suite, cfg.eval, args.compare_base, say_progress)
    results = bfcl_results(runs, cfg.eval.thresholds, thresholds_from, args.bfcl_limit)
    other = other_suites_floors(cfg.eval.thresholds, True)
    hint = BFCL_FAIL_REMEDIATION
    results.append(verdict_result(results, example_key="bfcl_overall_min_pct", fail_hint=hint, elsewhere=other))
    report = evaluation_report(
        results,
        command=["gpucert", *sys.argv[1:]],
        config={
            **dataclasses.asdict(cfg),
            "evaluate": {
                "suite": "bfcl",
                "adapter": str(adapter),
                "bfcl_data": str(directory),
                "categories": categories,
                "limit": args.bfcl_limit,
                "compare_base": args.compare_base,
                "output": str(out),
            },
        },
        started_at=started,
        finished_at=datetime.now(timezone.utc),
        inventory=collect_inventory(live_sources()).to_dict(),
    )
    # A re-run in place (check_evaluation_output let only this suite's report be there): the earlier run's
    # report.html, if drawn, would show its scores beside these.
    clear_earlier_run(out)
    path = write_report(report, out)
    print_report(report, Console(highlight=False, markup=False), show_inventory=False, report_path=str(path))
    return report.status.exit_code
