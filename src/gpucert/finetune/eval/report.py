"""`gpucert evaluate`'s verdict as a gpucert report (gpucert.report.schema), so `gpucert report DIR [--html]`
renders it and `gpucert report A B` compares two evaluations like any other runs.

Results, all in category "evaluation" (docs/evaluation.md has the table):
- one per metric of EvalScores, in % of the turns it counts (its denominator is in the message):
  eval.call_accuracy, eval.relevance, eval.irrelevance, eval.name_accuracy, eval.args_valid_json,
  eval.args_match, eval.overall; details hold the counts and up to three failing turns with their reasons, and
  eval.overall's also the first failures in full and the tally of every tool;
- eval.loss: mean cross-entropy per supervised held-out token;
- eval.tool, one per function the references call (subject "tool <name>", the most frequent first), INFO: the
  share of its turns fully right.

How each is judged: against `eval.thresholds` of the finetune config (a floor in %, a ceiling for the loss).
With no threshold a metric is INFO (shown, not judged), never PASS. A metric whose turns do not occur is SKIP
with the reason, unless the recipe set a threshold on it: then a model that never called where it should have
is FAIL, and data that cannot exercise the metric (no tool calls at all) is ERROR. No scorable turn at all is
ERROR for every metric. eval.call_accuracy and eval.overall over data where no turn expects a call count only
that no call was made (eval.irrelevance): INFO that says so, or ERROR where a threshold asks for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import gpucert
from gpucert.finetune.config import EvalThresholds
from gpucert.finetune.eval.evaluate import SCORING_VERSION, EvalScores, Rate, TurnScore
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.status import Status

VERB = "evaluate"
CATEGORY = "evaluation"
SUBJECT = "held-out turns"
LOSS_UNIT = "nats/token"
# Tools beyond these many get one summary row; eval.overall's details keep every tool.
MAX_TOOL_RESULTS = 20
MAX_EXAMPLES = 3
EXAMPLE_CHARS = 240


@dataclass(frozen=True)
class Metric:
    """One eval.* rate: `key` names the EvalScores field, the result (eval.<key>) and the threshold
    (eval.thresholds.<key>_min_pct); `failed` says whether a turn counts against it, for the examples; `needs`
    which turns it is computed over ("call": turns expecting a call, "no_call": turns expecting none, "made":
    turns that emitted a block, "any": all)."""

    key: str
    what: str
    over: str
    failed: Callable[[TurnScore], bool]
    needs: str


METRICS = (
    Metric("call_accuracy", "right call / no-call decision", "all turns", lambda t: not t.decision_ok, "any"),
    Metric(
        "relevance",
        "a call made where one was expected",
        "turns that expected a call",
        lambda t: t.expected_call and not t.made_call,
        "call",
    ),
    Metric(
        "irrelevance",
        "no call made where none was expected",
        "turns that expected no call",
        lambda t: t.made_call and not t.expected_call,
        "no_call",
    ),
    Metric(
        "name_accuracy",
        "right functions called",
        "turns that expected a call and got one",
        lambda t: t.names_ok is False,
        "call",
    ),
    Metric(
        "args_valid_json",
        "every <tool_call> block and its arguments valid JSON",
        "turns that emitted a <tool_call>",
        lambda t: t.args_valid_json is False,
        "made",
    ),
    Metric(
        "args_match",
        "calls match the reference (names and type-aware arguments)",
        "turns that expected a call and got one",
        lambda t: t.args_match is False,
        "call",
    ),
    Metric("overall", "turn fully right", "all turns", lambda t: not t.correct, "any"),
)

FAIL_REMEDIATION = (
    "read the failing turns (details.examples here, eval.overall's details.failures); a model that never calls "
    "or writes malformed blocks usually means the prompt template differs from training's"
)


@dataclass(frozen=True)
class ThresholdSources:
    """Where each eval.thresholds key came from: the config file, or a --set that named it (the whole
    `eval.thresholds` mapping, or the key itself). A judged result's threshold_source names that one place."""

    config: str
    overrides: tuple[str, ...] = ()  # the --set options that touch eval.thresholds, as given

    def of(self, key: str) -> str:
        """'--set KEY=VALUE' where a --set named `key` (the last one wins, as in the config), else 'KEY in FILE'."""
        for option in reversed(self.overrides):
            named = option.split("=", 1)[0].strip()
            if key == named or key.startswith(named + "."):
                return f"--set {option}"
        return f"{key} in {self.config}"


def threshold_text(source: str | ThresholdSources, key: str) -> str:
    """A result's threshold_source for the eval.thresholds `key` (a plain `source`: where all of them came from)."""
    return source.of(key) if isinstance(source, ThresholdSources) else f"{key} in {source}"


def evaluation_results(
    scores: EvalScores,
    loss: float | None,
    thresholds: EvalThresholds | None = None,
    source: str | ThresholdSources = "defaults",
) -> list[Result]:
    """Every result of an evaluation: the metrics, the loss, the per-tool rows. `source` says where the
    thresholds came from (the config file, or per key: ThresholdSources), for threshold_source."""
    thresholds = thresholds or EvalThresholds()
    results = [
        *scores_to_results(scores, thresholds, source),
        loss_result(loss, thresholds, source),
        *tool_results(scores),
    ]
    # Data without tool calls can exercise the no-call turns alone: that is the floor worth suggesting there.
    no_calls = scores.counts.get("turns", 0) and not scores.counts.get("expected_call", 0)
    example = "irrelevance_min_pct" if no_calls else "overall_min_pct"
    return [*results, verdict_result(results, example_key=example, elsewhere=other_suites_floors(thresholds, False))]


# Where a BFCL evaluation's failing entries are (it has no eval.overall row).
BFCL_FAIL_REMEDIATION = (
    "read the failing entries (details.examples of each bfcl.<category> row below its floor); a model that never "
    "calls or writes malformed blocks usually means the prompt template differs from training's"
)


def other_suites_floors(thresholds: EvalThresholds, bfcl: bool) -> list[str]:
    """The eval.thresholds keys set for the other suite (bfcl_* for the held-out one, the rest for BFCL): a verdict
    with none of its own says they were set, and not for it, rather than that none was."""
    return [
        f"eval.thresholds.{f.name}"
        for f in dataclasses.fields(thresholds)
        if getattr(thresholds, f.name) is not None and f.name.startswith("bfcl_") != bfcl
    ]


def verdict_result(
    results: Sequence[Result],
    subject: str = "the evaluation",
    example_key: str = "overall_min_pct",
    fail_hint: str = FAIL_REMEDIATION,
    elsewhere: Sequence[str] = (),
) -> Result:
    """eval.verdict: whether the result is good, in one sentence. Judged against the thresholds the recipe sets
    (the worst of the judged results, and any result that could not be computed); where it sets none, INFO that
    says so plainly: the scores are shown, not held to anything, and `example_key` is the floor to set. A
    threshold on something this evaluation did not run (a SKIP row with a floor: a BFCL category left out of
    --bfcl-categories) is counted and named as not judged, never as met."""
    thresholded = [r for r in results if r.expected is not None]
    unjudged = [r for r in thresholded if r.status is Status.SKIP]
    judged = [r for r in thresholded if r.status is not Status.SKIP]
    short = [r for r in judged if Status.WARN <= r.status < Status.ERROR]
    broken = [r for r in results if r.status == Status.ERROR]

    def verdict(status: Status, message: str, remediation: str | None = None) -> Result:
        details = {
            "thresholds": [r.name for r in judged],
            "not_met": [r.name for r in short],
            "not_computed": [r.name for r in broken],
            "not_judged": [r.name for r in unjudged],
        }
        return Result(
            name="eval.verdict",
            subject=subject,
            status=status,
            message=message + _not_judged(unjudged, results),
            remediation=remediation,
            # Held to the results it sums up: each of theirs names its own floor and where it came from.
            expected="every threshold met" if judged else None,
            threshold_source="eval.thresholds, each result's own" if judged else None,
            category=CATEGORY,
            details=details,
        )

    def listed(found: Sequence[Result]) -> str:
        shown = "; ".join(f"{r.name} {_found(r)}{f' (expected {r.expected})' if r.expected else ''}" for r in found[:4])
        return shown + (f" and {len(found) - 4} more" if len(found) > 4 else "")

    count = f"{len(judged)} thresholds judged" if unjudged else f"{len(judged)} thresholds"
    if broken:
        message = f"could not be judged: {len(broken)} results could not be computed ({listed(broken)})"
        if short:
            message += f"; {len(short)} of {count} not met: {listed(short)}"
        return verdict(Status.ERROR, message, broken[0].remediation)
    if short:
        return verdict(
            max(r.status for r in short),
            f"not good enough: {len(short)} of {count} not met: {listed(short)}",
            fail_hint,
        )
    if judged:
        names = ", ".join(r.name for r in judged)
        return verdict(Status.PASS, f"good: all {count} met ({names})", unjudged[0].remediation if unjudged else None)
    if unjudged:
        return verdict(
            Status.INFO,
            "not judged: none of the thresholds set applies to what this evaluation ran, so nothing says whether "
            "these scores are good",
            unjudged[0].remediation,
        )
    if elsewhere:
        suite = "--suite bfcl" if elsewhere[0].startswith("eval.thresholds.bfcl_") else "the held-out suite"
        return verdict(
            Status.INFO,
            f"not judged: the thresholds set ({', '.join(elsewhere)}) are for {suite}, none for this one, so nothing "
            f"says whether these scores are good. Set floors for it too, e.g. eval.thresholds.{example_key} "
            "(docs/evaluation.md)",
        )
    return verdict(
        Status.INFO,
        "not judged: the recipe sets no eval.thresholds, so nothing says whether these scores are good; they are "
        f"shown to compare runs (gpucert report A B). Set floors in the recipe, e.g. eval.thresholds.{example_key} "
        "(docs/evaluation.md)",
    )


def _not_judged(unjudged: Sequence[Result], results: Sequence[Result]) -> str:
    """The verdict's word on thresholds set but not judged, each with its SKIP row's reason."""
    if not unjudged:
        return ""
    total = sum(r.expected is not None for r in results)
    reasons = "; ".join(f"{r.name} ({r.details.get('why', r.message)})" for r in unjudged)
    return f"; {len(unjudged)} of the {total} thresholds set not judged: {reasons}"


def _found(result: Result) -> str:
    if not isinstance(result.value, int | float):
        return result.status.value
    return f"{result.value:g} {result.unit or ''}".rstrip()


def scores_to_results(
    scores: EvalScores, thresholds: EvalThresholds | None = None, source: str | ThresholdSources = "defaults"
) -> list[Result]:
    """One result per metric, in %, judged as the module docstring says."""
    thresholds = thresholds or EvalThresholds()
    return [_metric_result(metric, scores, thresholds, source) for metric in METRICS]


def _metric_result(
    metric: Metric, scores: EvalScores, thresholds: EvalThresholds, source: str | ThresholdSources
) -> Result:
    rate: Rate = getattr(scores, metric.key)
    floor: float | None = getattr(thresholds, f"{metric.key}_min_pct")
    key = f"eval.thresholds.{metric.key}_min_pct"
    failing = [t for t in scores.turns if metric.failed(t)]
    details: dict[str, Any] = {
        "correct": rate.correct,
        "total": rate.total,
        "examples": [{"turn": t.turn_id, "reasons": t.reasons} for t in failing[:MAX_EXAMPLES]],
    }
    if metric.key == "overall":
        details["summary"] = counts_sentence(scores.counts)
        details["counts"] = dict(scores.counts)
        details["failures"] = [dataclasses.asdict(f) for f in scores.failures]
        details["per_tool"] = tool_tallies(scores.turns)

    def result(status: Status, message: str, value: float | None = None, remediation: str | None = None) -> Result:
        return Result(
            name=f"eval.{metric.key}",
            subject=SUBJECT,
            status=status,
            message=message,
            value=None if value is None else round(value, 2),
            unit="%",
            expected=None if floor is None else f">= {floor:g} %",
            threshold_source=None if floor is None else threshold_text(source, key),
            remediation=remediation,
            category=CATEGORY,
            details=details,
        )

    pct = rate.percent
    if pct is None:
        if scores.counts.get("turns", 0) == 0:
            return result(
                Status.ERROR,
                f"expected at least one scorable turn ({metric.over}), found no held-out turn",
                remediation="check the held-out split has assistant turns (data.eval_fraction, eval.max_examples)",
            )
        why, model_fault = _not_applicable(metric, scores)
        if floor is None:
            return result(Status.SKIP, f"nothing to score over {metric.over}: {why}")
        if model_fault:
            return result(
                Status.FAIL,
                f"expected >= {floor:g} % ({metric.what}), found no turn to score over {metric.over}: {why}",
                remediation=FAIL_REMEDIATION,
            )
        return result(
            Status.ERROR,
            f"{key} is set, but this data has no turn to score it over ({metric.over}): {why}",
            remediation=f"evaluate on held-out data that has such turns, or set {key} to null for this data",
        )

    found = f"{rate.correct} of {rate.total} ({pct:.1f} %), over {metric.over}"
    if metric.key == "args_valid_json":
        found += f"; {scores.counts.get('malformed_blocks', 0)} malformed blocks"
    found += _example(failing)
    if metric.needs == "any" and not scores.counts.get("expected_call", 0):
        # Every turn expects no call, and such a turn is right whenever it makes none (its text is not scored):
        # 100 % here says only that the model made no stray call, which is eval.irrelevance, not that it calls
        # functions right. A data set without tool calls (alpaca) would otherwise pass a function-calling floor.
        why = (
            "no held-out turn expects a tool call, so a turn counts as right whenever it makes no call (its text is "
            "not scored): the same count as eval.irrelevance, not a function-calling score"
        )
        if floor is None:
            return result(Status.INFO, f"{metric.what}: {found}; {why}", pct)
        return result(
            Status.ERROR,
            f"{key} is set, but this data cannot exercise it: {why}; found {found}",
            remediation=f"evaluate on held-out data with tool calls, or set {key} to null for this data "
            "(eval.thresholds.irrelevance_min_pct judges the no-call turns)",
        )
    if floor is None:
        return result(Status.INFO, f"{metric.what}: {found}", pct)
    if 100 * rate.correct >= floor * rate.total:  # exact, not on the rounded percentage
        return result(Status.PASS, f"expected >= {floor:g} % ({metric.what}), found {found}", pct)
    return result(Status.FAIL, f"expected >= {floor:g} % ({metric.what}), found {found}", pct, FAIL_REMEDIATION)


def counts_sentence(counts: Mapping[str, int], unit: tuple[str, str] = ("held-out turn", "held-out turns")) -> str:
    """eval.overall's counts as a sentence a reader takes in at once (the report shows it; `counts` keeps the
    numbers). `unit`: what one turn and several are called (a BFCL entry)."""

    def n(key: str, one: str, many: str) -> str:
        value = counts.get(key, 0)
        return f"{value} {one if value == 1 else many}"

    parallel = counts.get("expected_parallel", 0)
    expected = f"{counts.get('expected_call', 0)} expected a call" + (
        f" ({parallel} of them parallel)" if parallel else ""
    )
    blocks = n("calls_parsed", "call", "calls") + " parsed"
    if counts.get("malformed_blocks"):
        blocks += ", " + n("malformed_blocks", "block", "blocks") + " malformed"
    return (
        f"{n('turns', *unit)}: {expected}, {counts.get('expected_no_call', 0)} expected none; the model called in "
        f"{counts.get('made_call', 0)} ({blocks}); {counts.get('correct', 0)} fully right."
    )


def _not_applicable(metric: Metric, scores: EvalScores) -> tuple[str, bool]:
    """Why a metric has no turn to count, and whether the model is to blame (it never called where it should
    have) rather than the data (no turn of the kind the metric needs)."""
    expected_calls = scores.counts.get("expected_call", 0)
    if metric.needs == "no_call":
        return "every held-out turn expects a tool call", False
    if not expected_calls:
        return "no held-out turn expects a tool call", False
    return "the model made no call where one was expected (see eval.relevance)", True


def _example(failing: Sequence[TurnScore]) -> str:
    for turn in failing:
        if turn.reasons:
            text = f"; e.g. {turn.turn_id}: {turn.reasons[0]}"
            return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"
    return ""


def loss_result(
    loss: float | None, thresholds: EvalThresholds | None = None, source: str | ThresholdSources = "defaults"
) -> Result:
    """eval.loss: INFO, or judged against eval.thresholds.loss_max; ERROR when nothing was supervised."""
    ceiling = (thresholds or EvalThresholds()).loss_max

    def result(status: Status, message: str, remediation: str | None = None) -> Result:
        return Result(
            name="eval.loss",
            subject=SUBJECT,
            status=status,
            message=message,
            value=None if loss is None else round(loss, 4),
            unit=LOSS_UNIT,
            expected=None if ceiling is None else f"<= {ceiling:g} {LOSS_UNIT}",
            threshold_source=None if ceiling is None else threshold_text(source, "eval.thresholds.loss_max"),
            remediation=remediation,
            category=CATEGORY,
        )

    if loss is None:
        return result(
            Status.ERROR,
            "expected a held-out loss, found no supervised token in the held-out split",
            "check the held-out split has assistant turns (data.eval_fraction) and that the template labels them",
        )
    what = f"mean cross-entropy per supervised held-out token: {loss:.4f} {LOSS_UNIT}"
    if ceiling is None:
        return result(Status.INFO, what)
    if loss <= ceiling:
        return result(Status.PASS, f"expected <= {ceiling:g} {LOSS_UNIT}, found {what}")
    return result(
        Status.FAIL,
        f"expected <= {ceiling:g} {LOSS_UNIT}, found {what}",
        "train longer, or check the held-out split is drawn like the training data",
    )


def tool_tallies(turns: Sequence[TurnScore]) -> dict[str, dict[str, int]]:
    """Per function the references call: turns that expect it, and of those, how many made a call, named the
    right functions, matched the arguments, were fully right. Most frequent first."""
    tallies: dict[str, dict[str, int]] = {}
    for turn in turns:
        for name in dict.fromkeys(turn.functions):
            tally = tallies.setdefault(name, {"turns": 0, "called": 0, "names_ok": 0, "args_match": 0, "correct": 0})
            tally["turns"] += 1
            tally["called"] += turn.made_call
            tally["names_ok"] += bool(turn.names_ok)
            tally["args_match"] += bool(turn.args_match)
            tally["correct"] += turn.correct
    return dict(sorted(tallies.items(), key=lambda kv: (-kv[1]["turns"], kv[0])))


def tool_results(scores: EvalScores) -> list[Result]:
    """INFO rows per tool, the MAX_TOOL_RESULTS most frequent, then one row for the rest."""
    tallies = list(tool_tallies(scores.turns).items())
    results = []
    for name, t in tallies[:MAX_TOOL_RESULTS]:
        results.append(
            Result(
                name="eval.tool",
                subject=f"tool {name}",
                status=Status.INFO,
                category=CATEGORY,
                value=round(100 * t["correct"] / t["turns"], 2),
                unit="%",
                message=f"{t['correct']} of {t['turns']} turns that expect {name} fully right; called in "
                f"{t['called']}, right functions in {t['names_ok']}, arguments matched in {t['args_match']}",
                details=t,
            )
        )
    rest = tallies[MAX_TOOL_RESULTS:]
    if rest:
        turns = sum(t["turns"] for _, t in rest)
        correct = sum(t["correct"] for _, t in rest)
        results.append(
            Result(
                name="eval.tool",
                subject="other tools",
                status=Status.INFO,
                category=CATEGORY,
                value=round(100 * correct / turns, 2),
                unit="%",
                message=f"{len(rest)} more tools over {turns} turns: {correct} fully right; eval.overall's "
                "details.per_tool lists every tool",
                details={"tools": len(rest), "turns": turns, "correct": correct},
            )
        )
    return results


def evaluation_report(
    results: list[Result],
    *,
    command: list[str],
    config: dict[str, Any],
    started_at: datetime,
    finished_at: datetime,
    inventory: dict[str, Any],
) -> Report:
    """The report: the results, this node's inventory, the resolved config (with the adapter and data it
    evaluated). No hardware profile applies: thresholds come from the finetune config."""
    host = str(inventory.get("hostname", ""))
    meta = RunMeta(
        tool_version=gpucert.__version__,
        # The scorer's own version rides along: a change of scoring rules must not read as a change of model.
        method_version=f"{gpucert.METHOD_VERSION}, scoring {SCORING_VERSION}",
        verb=VERB,
        command=command,
        host=host,
        started_at=started_at.isoformat(),
        finished_at=finished_at.isoformat(),
        duration_s=round(max((finished_at - started_at).total_seconds(), 0.0), 3),
        profile="none",
        config=config,
        software=dict(inventory.get("software") or {}),
        nodes=[host],
    )
    return Report(meta=meta, inventory=inventory, results=results)
