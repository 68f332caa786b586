"""In-domain function-calling evaluation: generate on held-out turns, parse the Hermes `<tool_call>` blocks, score.

`gpucert evaluate` runs `evaluate`: every assistant turn of the held-out conversations becomes a prompt (the
messages before it, and the tools), the model answers greedily through the same chat template it was trained
with, and `score` compares each answer with the reference turn. The split is collect (`generate`), parse
(`parse_output`) and judge (`score`, `compare_call`): the last two are pure and are tested on hand-written
outputs in tests/fixtures/finetune_eval/cases.jsonl and on BFCL's own entries in bfcl_cases.jsonl beside it.
gpucert.finetune.eval.report turns the scores into a report judged against the recipe's eval.thresholds.

The rates (EvalScores; each None-flagged turn is left out of that rate's denominator):
- call_accuracy: the call / no-call decision is right, over all turns; relevance (a call expected and made)
  and irrelevance (no call expected, none made) split it;
- name_accuracy: the called functions are the expected ones, over turns that expected a call and got one;
- args_valid_json: every `<tool_call>` block decodes and its arguments are a JSON object, over turns that
  emitted at least one block;
- args_match: the calls match the reference, names and arguments, over turns that expected a call and got one
  (so it is at most name_accuracy);
- overall: the turn is fully right: the decision, and where a call was expected, names and arguments.

Scoring rules (after BFCL's AST checker; the argument rules are gpucert.finetune.eval.checker's):
- Parsing. Blocks are `<tool_call>\\s*(.*?)\\s*</tool_call>`, each `json.loads`-ed into {"name", "arguments"};
  `arguments` must be an object: a JSON string holding one is a call with invalid arguments, as in BFCL (a
  client would receive a string). A block that does not decode, or has no string "name", is recorded as
  malformed, never dropped (BFCL's Qwen handler drops it and reads "no call"), and so is a `<tool_call>` left
  open (usually generation cut at max_new_tokens). The output is cut at the first `<|im_end|>` /
  `<|endoftext|>`: a server stops there, and what follows is padding.
- Decision. A turn "made a call" when it emitted any `<tool_call>` block, parsed or malformed: a malformed block
  is a formatting error (eval.args_valid_json), not a wrong decision.
- References. A turn may carry BFCL's possible answer (`possible_answer` on the assistant message) instead of
  its `tool_calls` as the reference.
- Calls are compared by `checker.compare_call`; parallel calls are paired by maximum matching, order-free, and
  the counts must be equal.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucert.finetune.config import EvalConfig
from gpucert.finetune.eval.checker import Call, compare_call, possible_answer_calls, show_json, tool_schemas

END_MARKERS = ("<|im_end|>", "<|endoftext|>")
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"
MAX_FAILURES = 20
# At most one progress line this often: a 7B model answers 200 turns in minutes, and a wait that long must say how
# far it has got; a run of a few seconds stays quiet.
PROGRESS_EVERY_S = 10.0
# Changes whenever a verdict of the scorer changes, so scores from different rules are not compared as equal
# (2: BFCL possible answers; an omitted optional passes only for the schema default, at every depth; 3: a model's
# arguments written as a JSON string are invalid, not decoded).
SCORING_VERSION = "3"


@dataclass(frozen=True)
class Prediction:
    """A parsed model answer: the text outside the `<tool_call>` blocks, the calls, and the blocks that did not
    parse (their inner text)."""

    content: str
    calls: list[Call]
    malformed: list[str]

    @property
    def made_call(self) -> bool:
        return bool(self.calls or self.malformed)


@dataclass(frozen=True)
class Turn:
    """One assistant turn of a held-out conversation: the prompt before it and the calls it made (none: a text
    answer). `conversation` and `message` locate it in the input, for failure messages."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    expected: list[Call]
    conversation: int = 0
    message: int = 0
    # A name of the turn's own (a BFCL entry id), used instead of its place in the input.
    label: str | None = None

    @property
    def id(self) -> str:
        return self.label or f"conversation {self.conversation}, message {self.message}"


@dataclass(frozen=True)
class TurnScore:
    """The verdict on one turn. A None field does not apply to this turn (and is left out of that rate)."""

    turn_id: str
    expected_call: bool
    made_call: bool
    names_ok: bool | None
    args_valid_json: bool | None
    args_match: bool | None
    correct: bool
    reasons: list[str]
    # The functions the reference calls (none for a no-call turn), for the per-tool breakdown.
    functions: tuple[str, ...] = ()

    @property
    def decision_ok(self) -> bool:
        return self.expected_call == self.made_call


@dataclass(frozen=True)
class Rate:
    correct: int
    total: int

    @property
    def percent(self) -> float | None:
        return None if self.total == 0 else 100.0 * self.correct / self.total

    def __str__(self) -> str:
        pct = self.percent
        return f"{self.correct}/{self.total}" + ("" if pct is None else f" ({pct:.1f} %)")


@dataclass(frozen=True)
class Failure:
    turn_id: str
    expected: str
    output: str
    reasons: list[str]


@dataclass(frozen=True)
class EvalScores:
    call_accuracy: Rate
    relevance: Rate
    irrelevance: Rate
    name_accuracy: Rate
    args_valid_json: Rate
    args_match: Rate
    overall: Rate
    counts: dict[str, int]
    failures: list[Failure]
    turns: list[TurnScore] = field(repr=False)


# ---------------------------------------------------------------------------------------------------- parse


def parse_output(text: str) -> Prediction:
    """Split a Hermes-format answer into its text and its `<tool_call>` blocks (rules in the module docstring)."""
    text = _cut_at_end(text)
    calls: list[Call] = []
    malformed: list[str] = []
    outside: list[str] = []
    pos = 0
    for match in TOOL_CALL_RE.finditer(text):
        outside.append(text[pos : match.start()])
        pos = match.end()
        call = _parse_block(match.group(1))
        if call is None:
            malformed.append(match.group(1))
        else:
            calls.append(call)
    rest = text[pos:]
    open_at = rest.find(OPEN_TAG)
    if open_at >= 0:
        malformed.append(rest[open_at + len(OPEN_TAG) :].strip())
        rest = rest[:open_at]
    outside.append(rest)
    return Prediction(content="".join(outside).strip(), calls=calls, malformed=malformed)


def _cut_at_end(text: str) -> str:
    cuts = [i for i in (text.find(m) for m in END_MARKERS) if i >= 0]
    return text[: min(cuts)] if cuts else text


def _parse_block(block: str) -> Call | None:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return _make_call(obj["name"], obj.get("arguments"), present="arguments" in obj, decode_string=False)


def _make_call(name: str, arguments: Any, present: bool = True, decode_string: bool = True) -> Call:
    """A Call from its arguments. A reference's arguments may be a JSON string holding the object (Arrow and the
    OpenAI API store them so); a model's (`decode_string` False) may not: inside `<tool_call>` the arguments are
    an object, and a server (vLLM's hermes parser) hands a string on as a string, as BFCL's checker reads it."""
    if isinstance(arguments, dict):
        return Call(name, arguments)
    if isinstance(arguments, str) and not decode_string:
        return Call(name, None, raw_arguments=f"a JSON string, {json.dumps(arguments, ensure_ascii=False)}")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            return Call(name, decoded)
        return Call(name, None, raw_arguments=arguments)
    return Call(name, None, raw_arguments=json.dumps(arguments) if present else "(no arguments key)")


# ---------------------------------------------------------------------------------------- reference turns


def expected_turns(conversation: Mapping[str, Any], index: int = 0) -> list[Turn]:
    """One Turn per assistant message of an OpenAI-style conversation ({"messages", "tools"}).

    An assistant message may carry `possible_answer`, BFCL's ground truth for that turn (a list of
    {function: {parameter: [accepted values]}}, [] for "no call"): it is then the reference instead of
    `tool_calls`, which stay what later prompts show.

    Tool-call arguments stored as JSON strings (Arrow keeps them so) are decoded to objects in the prompt too:
    the chat template applies `tojson`, and a string would be rendered double-encoded.
    """
    tools = conversation.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools)
    messages = [_decode_message(m) for m in conversation["messages"]]
    turns = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        if "possible_answer" in message:
            where = f"conversation {index}, message {i}"
            expected = possible_answer_calls(message["possible_answer"], where)
        else:
            expected = [
                _make_call(tc["function"]["name"], tc["function"].get("arguments"))
                for tc in message.get("tool_calls") or []
            ]
        turns.append(Turn(messages=messages[:i], tools=tools or None, expected=expected, conversation=index, message=i))
    return turns


def _decode_message(message: Mapping[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    decoded = []
    for tc in calls:
        args = tc["function"].get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        decoded.append({**tc, "function": {**tc["function"], "arguments": args}})
    return {**message, "tool_calls": decoded}


def score_turn(turn: Turn, prediction: Prediction) -> TurnScore:
    """The verdict on one turn; rates and their denominators are defined in the module docstring."""
    expected_call = bool(turn.expected)
    functions = tuple(c.name for c in turn.expected)
    made_call = prediction.made_call
    reasons = [f"malformed <tool_call> block: {block[:120]}" for block in prediction.malformed]
    valid = None
    if made_call:
        valid = not prediction.malformed and all(c.arguments is not None for c in prediction.calls)

    if not expected_call:
        if made_call:
            names = ", ".join(c.name for c in prediction.calls)
            found = f"a call to {names}" if names else "a malformed <tool_call> block"
            reasons.insert(0, f"expected no call, found {found}")
        return TurnScore(turn.id, False, made_call, None, valid, None, not made_call, reasons, functions)
    if not made_call:
        names = ", ".join(c.name for c in turn.expected)
        return TurnScore(
            turn.id, True, False, None, None, None, False, [f"expected a call to {names}, found none"], functions
        )

    names_ok = not prediction.malformed and Counter(c.name for c in turn.expected) == Counter(
        c.name for c in prediction.calls
    )
    all_matched, call_reasons = _match_calls(turn.expected, prediction.calls, tool_schemas(turn.tools))
    args_match = all_matched and not prediction.malformed
    reasons += call_reasons
    correct = bool(names_ok and args_match and valid)
    return TurnScore(turn.id, True, True, names_ok, valid, args_match, correct, reasons, functions)


def _match_calls(
    expected: list[Call], predicted: list[Call], schemas: Mapping[str, Mapping[str, Any]]
) -> tuple[bool, list[str]]:
    """Order-free matching of parallel calls: True when every call pairs with one that matches and the counts
    are equal; otherwise the reasons, from the closest pairing (same name first)."""
    matches = [[compare_call(e, p, schemas.get(e.name)) for p in predicted] for e in expected]
    pair = _maximum_matching([[m.ok for m in row] for row in matches])
    if len(pair) == len(expected) == len(predicted):
        return True, []
    reasons: list[str] = []
    free_e = [i for i in range(len(expected)) if i not in pair]
    free_p = [j for j in range(len(predicted)) if j not in pair.values()]
    for i in list(free_e):
        same = next((j for j in free_p if predicted[j].name == expected[i].name), None)
        if same is not None:
            reasons += matches[i][same].reasons
            free_e.remove(i)
            free_p.remove(same)
    while free_e and free_p:
        i, j = free_e.pop(0), free_p.pop(0)
        reasons.append(f"function: expected {expected[i].name}, found {predicted[j].name}")
    reasons += [f"expected a call to {expected[i].name}, found none" for i in free_e]
    reasons += [f"expected no further call, found a call to {predicted[j].name}" for j in free_p]
    return False, reasons


def _maximum_matching(ok: list[list[bool]]) -> dict[int, int]:
    """Row -> column of a maximum bipartite matching on `ok` (Kuhn's augmenting paths; a turn has few calls)."""
    owner: dict[int, int] = {}  # column -> row

    def augment(row: int, seen: set[int]) -> bool:
        for col, good in enumerate(ok[row]):
            if good and col not in seen:
                seen.add(col)
                if col not in owner or augment(owner[col], seen):
                    owner[col] = row
                    return True
        return False

    for row in range(len(ok)):
        augment(row, set())
    return {row: col for col, row in owner.items()}


def score(turns: Sequence[Turn], outputs: Sequence[str], max_failures: int = MAX_FAILURES) -> EvalScores:
    """Score raw model outputs (one per turn, as `generate` returns them) against the reference turns."""
    if len(turns) != len(outputs):
        raise ValueError(f"expected one output per turn, found {len(outputs)} outputs for {len(turns)} turns")
    predictions = [parse_output(o) for o in outputs]
    scored = [score_turn(t, p) for t, p in zip(turns, predictions, strict=True)]

    def rate(flags: Iterable[bool | None]) -> Rate:
        known = [f for f in flags if f is not None]
        return Rate(sum(known), len(known))

    failures = [
        Failure(s.turn_id, _describe(t.expected), o[:500], s.reasons)
        for t, o, s in zip(turns, outputs, scored, strict=True)
        if not s.correct
    ][:max_failures]
    counts = {
        "turns": len(scored),
        "expected_call": sum(s.expected_call for s in scored),
        "expected_no_call": sum(not s.expected_call for s in scored),
        "expected_parallel": sum(len(t.expected) > 1 for t in turns),
        "made_call": sum(s.made_call for s in scored),
        "calls_expected": sum(len(t.expected) for t in turns),
        "calls_parsed": sum(len(p.calls) for p in predictions),
        "malformed_blocks": sum(len(p.malformed) for p in predictions),
        "correct": sum(s.correct for s in scored),
    }
    return EvalScores(
        call_accuracy=rate(s.decision_ok for s in scored),
        relevance=rate(s.made_call for s in scored if s.expected_call),
        irrelevance=rate(not s.made_call for s in scored if not s.expected_call),
        name_accuracy=rate(s.names_ok for s in scored),
        args_valid_json=rate(s.args_valid_json for s in scored),
        args_match=rate(s.args_match for s in scored),
        overall=rate(s.correct for s in scored),
        counts=counts,
        failures=failures,
        turns=scored,
    )


def _describe(calls: list[Call]) -> str:
    if not calls:
        return "no call"
    return "; ".join(f"{c.name}({show_json(c.arguments)})" for c in calls)


# -------------------------------------------------------------------------------------------------- collect


def say_progress(line: str) -> None:
    """`gpucert evaluate`'s progress: one line on stderr, flushed, as `[finetune]`'s are (stdout is the report)."""
    print(f"[evaluate] {line}", file=sys.stderr, flush=True)


class Progress:
    """How far a long loop has got, as a line for `say` at most every `every_s` seconds (PROGRESS_EVERY_S unless
    given): `what`, done of total (`unit`), the rate so far and the time left at that rate. generate() answers the
    longest prompts first, so the early estimate errs long. Nothing is said at the end: the caller says what was
    done, once."""

    def __init__(
        self,
        what: str,
        total: int,
        say: Callable[[str], None],
        unit: str = "answered",
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.say, self.unit, self.clock = what, total, say, unit, clock
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.started = self.last = clock()

    def __call__(self, done: int) -> None:
        now = self.clock()
        elapsed = now - self.started
        if done >= self.total or done <= 0 or now - self.last < self.every_s or elapsed <= 0:
            return
        self.last = now
        rate = done / elapsed
        self.say(
            f"{self.what}: {done} of {self.total} {self.unit} in {elapsed:.0f} s ({rate:.2g}/s), "
            f"about {(self.total - done) / rate:.0f} s left"
        )


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
    batch_size: int,
    max_new_tokens: int,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Greedy answers to (messages, tools) prompts, one string per prompt, in order; `progress` is told how many
    are answered after each batch (a Progress).

    Prompts are rendered by the tokenizer's chat template (the one training used) with the generation prompt,
    batched longest first to waste little padding, and padded on the left so every row's new tokens start at
    the same column. Only new tokens are decoded, special tokens kept, then cut at the first end marker.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"expected batch_size >= 1, found {batch_size}")
    encoded = [
        tokenizer(
            tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,  # the template already wrote every special token (no second BOS)
        )["input_ids"]
        for messages, tools in prompts
    ]
    stop_ids = _stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    device = next(model.parameters()).device
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    outputs: list[str] = [""] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in rows)
            ids = [[pad_id] * (width - len(encoded[i])) + list(encoded[i]) for i in rows]
            mask = [[0] * (width - len(encoded[i])) + [1] * len(encoded[i]) for i in rows]
            with torch.inference_mode():
                out = model.generate(
                    input_ids=torch.tensor(ids, device=device),
                    attention_mask=torch.tensor(mask, device=device),
                    max_new_tokens=max_new_tokens,
                    # Greedy whatever the checkpoint's generation_config asks (Qwen2-Instruct: sampling and
                    # repetition_penalty 1.05).
                    do_sample=False,
                    num_beams=1,
                    repetition_penalty=1.0,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    eos_token_id=stop_ids,
                    pad_token_id=pad_id,
                )
            for row, i in enumerate(rows):
                text = tokenizer.decode(out[row, width:].tolist(), skip_special_tokens=False)
                outputs[i] = _cut_at_end(text)
            if progress is not None:
                progress(start + len(rows))
    finally:
        model.train(was_training)
    return outputs


def _stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that end a turn: `<|im_end|>` where the vocabulary has it, the tokenizer's and the model's EOS."""
    ids: list[int] = []
    for token in (*END_MARKERS, tokenizer.eos_token):
        if token and token in tokenizer.get_vocab():
            ids.append(tokenizer.convert_tokens_to_ids(token))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += [configured] if isinstance(configured, int) else list(configured or [])
    unique = list(dict.fromkeys(ids))
    if not unique:
        raise ValueError("the tokenizer has no end-of-turn token (<|im_end|>, eos_token): generation would not stop")
    return unique


def eval_loss(
    model: Any,
    batches: Iterable[Mapping[str, Any]],
    attn_impl: str = "sdpa",
    progress: Callable[[int], None] | None = None,
) -> float | None:
    """Mean cross-entropy per supervised token over collated held-out batches, computed by the training loss
    (`model.forward_loss`: packed rows stay document-masked). Token-weighted over all batches, not a mean of
    batch means; None when nothing is supervised. `progress` is told how many batches are done after each."""
    import torch

    from gpucert.finetune.model.lora import forward_loss

    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for done, batch in enumerate(batches, 1):
                loss_sum, count = forward_loss(model, {k: v.to(device) for k, v in batch.items()}, attn_impl)
                total += float(loss_sum)
                tokens += int(count)
                if progress is not None:
                    progress(done)
    finally:
        model.train(was_training)
    return total / tokens if tokens else None


def evaluate(
    model: Any,
    tokenizer: Any,
    conversations: Iterable[Mapping[str, Any]],
    eval_cfg: EvalConfig,
    loss_batches: Sequence[Mapping[str, Any]] | None = None,
    attn_impl: str = "sdpa",
    say: Callable[[str], None] | None = None,
) -> tuple[EvalScores, float | None]:
    """Score the first `eval_cfg.max_examples` assistant turns of the held-out conversations, and the loss on
    `loss_batches` when given (None otherwise). `say` (a line on stderr, for the CLI) hears what is being done
    and, in a long wait, how far it has got."""
    turns = [t for i, conv in enumerate(conversations) for t in expected_turns(conv, index=i)]
    turns = turns[: eval_cfg.max_examples]
    progress = None
    if say is not None:
        say(
            f"answering {len(turns)} held-out turns greedily, {eval_cfg.batch_size} at a time, at most "
            f"{eval_cfg.max_new_tokens} new tokens each"
        )
        progress = Progress("held-out turns", len(turns), say)
    started = time.monotonic()
    outputs = generate(
        model,
        tokenizer,
        [(t.messages, t.tools) for t in turns],
        batch_size=eval_cfg.batch_size,
        max_new_tokens=eval_cfg.max_new_tokens,
        progress=progress,
    )
    loss = None
    if say is not None:
        say(f"answered {len(turns)} held-out turns in {time.monotonic() - started:.1f} s")
    if loss_batches is not None:
        loss_progress = None
        if say is not None:
            say(f"held-out loss over {len(loss_batches)} batches")
            loss_progress = Progress("held-out loss", len(loss_batches), say, unit="batches")
        loss = eval_loss(model, loss_batches, attn_impl, loss_progress)
    return score(turns, outputs), loss
