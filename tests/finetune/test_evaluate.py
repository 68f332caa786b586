"""The evaluation scorer on hand-written outputs, and greedy batched generation with a tiny random Qwen2."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from gpucert.finetune.config import EvalConfig
from gpucert.finetune.eval.checker import Call, compare_call, possible_answer_calls
from gpucert.finetune.eval.evaluate import (
    EvalScores,
    Progress,
    Rate,
    Turn,
    eval_loss,
    evaluate,
    expected_turns,
    generate,
    parse_output,
    score,
    score_turn,
)

CASES_FILE = Path(__file__).parent.parent / "fixtures" / "finetune_eval" / "cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines()]
BFCL_FILE = CASES_FILE.parent / "bfcl_cases.jsonl"
BFCL_CASES = [json.loads(line) for line in BFCL_FILE.read_text().splitlines()]
EVALUATION_DOC = Path(__file__).parent.parent.parent / "docs" / "evaluation.md"


# ------------------------------------------------------------------------------------------------ scoring


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_each_case_scores_exactly_as_written(case: dict[str, Any]) -> None:
    (turn,) = expected_turns(case["conversation"])
    prediction = parse_output(case["output"])
    verdict = score_turn(turn, prediction)
    expect = case["expect"]

    assert len(prediction.calls) == expect["parsed_calls"]
    assert len(prediction.malformed) == expect["malformed"]
    assert verdict.expected_call is expect["expected_call"]
    assert verdict.made_call is expect["made_call"]
    assert verdict.names_ok is expect["names_ok"]
    assert verdict.args_valid_json is expect["args_valid_json"]
    assert verdict.args_match is expect["args_match"]
    assert verdict.correct is expect["correct"]
    assert verdict.reasons == expect["reasons"]
    if "content" in expect:
        assert prediction.content == expect["content"]


def test_aggregates_over_the_fixture_file() -> None:
    turns = [t for i, c in enumerate(CASES) for t in expected_turns(c["conversation"], index=i)]
    scores = score(turns, [c["output"] for c in CASES])

    # Counted from the `expect` fields of cases.jsonl (32 cases: 29 expect a call, 3 do not).
    assert scores.call_accuracy == Rate(30, 32)
    assert scores.relevance == Rate(28, 29)
    assert scores.irrelevance == Rate(2, 3)
    assert scores.name_accuracy == Rate(24, 28)
    assert scores.args_valid_json == Rate(25, 29)
    assert scores.args_match == Rate(12, 28)
    assert scores.overall == Rate(14, 32)
    assert [
        round(r.percent or 0.0, 2)
        for r in (
            scores.call_accuracy,
            scores.name_accuracy,
            scores.args_valid_json,
            scores.args_match,
            scores.overall,
        )
    ] == [93.75, 85.71, 86.21, 42.86, 43.75]
    assert scores.counts == {
        "turns": 32,
        "expected_call": 29,
        "expected_no_call": 3,
        "expected_parallel": 2,
        "made_call": 29,
        "calls_expected": 31,
        "calls_parsed": 28,
        "malformed_blocks": 2,
        "correct": 14,
    }
    assert [f.turn_id for f in scores.failures] == [
        f"conversation {i}, message 2" for i, c in enumerate(CASES) if not c["expect"]["correct"]
    ]
    first = scores.failures[0]
    assert (first.expected, first.reasons) == (
        'get_weather({"location": "Paris"})',
        ["function: expected get_weather, found get_stock_price"],
    )
    assert len(score(turns, [c["output"] for c in CASES], max_failures=3).failures) == 3


def test_score_wants_one_output_per_turn() -> None:
    with pytest.raises(ValueError, match="expected one output per turn, found 0 outputs for 1 turns"):
        score(expected_turns(CASES[0]["conversation"]), [])


def test_compare_without_a_schema_uses_the_reference_types_and_keys() -> None:
    expected = Call("f", {"n": 5, "x": 2.5, "flag": True, "tags": ["A b"], "opt": None})
    assert compare_call(expected, Call("f", {"n": 5.0, "x": 2.5, "flag": True, "tags": ["a-B"], "opt": None})).ok
    match = compare_call(expected, Call("f", {"n": "5", "x": 2.5, "flag": 1, "tags": ["A b"], "extra": 1}))
    assert (match.name_ok, match.args_valid_json, match.args_match) == (True, True, False)
    assert match.reasons == [
        "f(opt): missing, expected null",
        "f(extra): not in the reference call",
        'f(n): expected integer 5, found string "5"',
        "f(flag): expected boolean true, found integer 1",
    ]


def test_schema_types_json_schema_style() -> None:
    schema = {
        "type": "object",
        "properties": {
            "maybe": {"type": ["string", "null"]},
            "n": {"type": "integer"},
            "anything": {"type": "any"},
            "loose": {"description": "no type"},
        },
        "required": ["n"],
    }
    ref = Call("f", {"maybe": None, "n": 3, "anything": "x", "loose": 7})
    assert compare_call(ref, Call("f", {"maybe": None, "n": 3.0, "anything": "x", "loose": 7.0}), schema).ok
    bad = compare_call(ref, Call("f", {"maybe": 1, "n": True, "anything": 3, "loose": "7"}), schema)
    assert bad.reasons == [
        "f(maybe): expected null or string, found integer 1",
        "f(n): expected integer, found boolean true",
        'f(anything): expected string "x", found integer 3',  # "any" constrains nothing: the reference decides
        'f(loose): expected integer 7, found string "7"',
    ]
    # A fractional number is not an integer.
    assert compare_call(Call("f", {"n": 3}), Call("f", {"n": 3.5}), schema).reasons == [
        "f(n): expected integer, found number 3.5"
    ]


def test_parse_output_edges() -> None:
    # "arguments" missing: the call parses, its arguments are invalid.
    (call,) = parse_output('<tool_call>{"name": "f"}</tool_call>').calls
    assert call == Call("f", None, raw_arguments="(no arguments key)")
    # JSON that is not a {"name": ...} object is malformed.
    assert parse_output('<tool_call>["f", {}]</tool_call>').malformed == ['["f", {}]']
    assert parse_output('<tool_call>{"arguments": {}}</tool_call>').malformed == ['{"arguments": {}}']
    # Nothing after the first end marker belongs to the turn.
    after_end = parse_output('Done.<|im_end|>\n<|im_start|>assistant\n<tool_call>{"name": "f", "arguments": {}}')
    assert (after_end.content, after_end.calls, after_end.malformed) == ("Done.", [], [])
    # The QwenFCHandler spacing (newlines) and none at all both parse.
    tight = parse_output('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert tight.calls == [Call("f", {"a": 1})]


def test_expected_turns_of_a_multi_turn_conversation() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    conversation = {
        "messages": [
            {"role": "user", "content": "call f"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "name": "f", "content": "{}"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "again"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 2}}}],
            },
        ],
        "tools": json.dumps(tools),  # Arrow may hold it as a string
    }
    turns = expected_turns(conversation, index=7)
    assert [(len(t.messages), t.expected, t.id) for t in turns] == [
        (1, [Call("f", {"a": 1})], "conversation 7, message 1"),
        (3, [], "conversation 7, message 3"),
        (5, [Call("f", {"a": 2})], "conversation 7, message 5"),
    ]
    assert all(t.tools == tools for t in turns)
    # The earlier call's JSON-string arguments are an object in the prompt (the template applies tojson).
    assert turns[2].messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert conversation["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert (
        expected_turns({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})[
            0
        ].tools
        is None
    )


# --------------------------------------------------------------------------------------------- generation

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<tool_call>\n{{ tc.function | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([json.dumps(c) for c in CASES], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tiny_model(tokenizer: Any) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        # Wider than the default 0.02, so the random model answers varied text rather than one repeated token.
        initializer_range=0.2,
    )
    # float64: batching changes reduction shapes, and fp32 rounding could flip a near-tie of a random model.
    return Qwen2ForCausalLM(config).to(torch.float64).eval()


def _prompts() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    ids = ["exact_match", "nested_wrong_value", "no_tools_plain_chat", "parallel_swapped", "irrelevance_no_call"]
    turns = [expected_turns(c["conversation"])[0] for c in CASES if c["id"] in ids]
    multi = {
        "messages": [
            *CASES[0]["conversation"]["messages"],
            {"role": "tool", "name": "get_weather", "content": '{"temp_c": 18}'},
            {"role": "assistant", "content": "18 °C."},
        ],
        "tools": CASES[0]["conversation"]["tools"],
    }
    turns.append(expected_turns(multi)[-1])
    return [(t.messages, t.tools) for t in turns]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_batched_left_padded_greedy_generation_matches_one_by_one(tokenizer: Any, tiny_model: Any) -> None:
    prompts = _prompts()
    lengths = {len(_render(tokenizer, m, t)) for m, t in prompts}
    assert len(lengths) > 1  # the batches really are padded

    one_by_one = generate(tiny_model, tokenizer, prompts, batch_size=1, max_new_tokens=12)
    batched = generate(tiny_model, tokenizer, prompts, batch_size=4, max_new_tokens=12)

    assert len(batched) == len(prompts) == 6
    assert batched == one_by_one
    assert all(isinstance(text, str) and "<|im_end|>" not in text and "<|endoftext|>" not in text for text in batched)
    assert len(set(batched)) == len(batched)  # varied answers, so the comparison means something


class _ScriptedModel(torch.nn.Module):
    """Answers every row with the same scripted tokens; records what generate() was given."""

    def __init__(self, answer: list[int]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.answer = answer
        self.calls: list[dict[str, Any]] = []
        self.generation_config = type("GenerationConfig", (), {"eos_token_id": None})()

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append({"input_ids": input_ids, "attention_mask": attention_mask, **kwargs})
        new = torch.tensor([self.answer] * input_ids.shape[0])
        return torch.cat([input_ids, new], dim=1)


def test_generate_pads_left_decodes_only_new_tokens_and_cuts_at_the_end_marker(tokenizer: Any) -> None:
    answer = tokenizer.encode('<tool_call>\n{"name": "get_weather"}\n</tool_call><|im_end|><|endoftext|><|endoftext|>')
    model = _ScriptedModel(answer)
    prompts = _prompts()[:2]
    texts = generate(model, tokenizer, prompts, batch_size=2, max_new_tokens=5)

    assert texts == ['<tool_call>\n{"name": "get_weather"}\n</tool_call>'] * 2
    (call,) = model.calls
    mask = call["attention_mask"]
    assert mask[:, -1].tolist() == [1, 1]  # every row ends at the last column: padding is on the left
    assert mask[1, 0].item() == 0 and mask[0].all()  # longest first, the shorter row padded
    assert (call["do_sample"], call["num_beams"], call["repetition_penalty"], call["max_new_tokens"]) == (
        False,
        1,
        1.0,
        5,
    )
    vocab = tokenizer.get_vocab()
    assert call["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    short, long = (_render(tokenizer, *p) for p in prompts)
    assert len(short) < len(long)  # so the second prompt is row 0, the first row 1, left-padded
    assert call["input_ids"][0].tolist() == long
    assert call["input_ids"][1].tolist() == [tokenizer.pad_token_id] * (len(long) - len(short)) + short


def test_progress_says_done_rate_and_time_left_at_most_every_interval() -> None:
    """Before 2026-11-29 `gpucert evaluate` said nothing between loading and the result: 26 s for 64 turns of
    the tiny model on two cores, minutes for a 7B's 200."""
    now = [100.0]
    said: list[str] = []
    progress = Progress("held-out turns", 64, said.append, every_s=10, clock=lambda: now[0])
    now[0] = 104.0
    progress(8)  # 4 s in: too soon to say anything
    now[0] = 112.0
    progress(16)
    now[0] = 115.0
    progress(24)  # 3 s after the last line: quiet
    now[0] = 122.0
    progress(32)
    now[0] = 130.0
    progress(64)  # done: the caller says so, once
    assert said == [
        "held-out turns: 16 of 64 answered in 12 s (1.3/s), about 36 s left",
        "held-out turns: 32 of 64 answered in 22 s (1.5/s), about 22 s left",
    ]


def test_generate_reports_every_batch_and_the_bfcl_suite_says_each_category(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucert.finetune.eval import evaluate as evaluate_module
    from gpucert.finetune.eval.bfcl import load_suite, run_suite

    model = _ScriptedModel(tokenizer.encode("No idea.<|im_end|>"))
    done: list[int] = []
    generate(model, tokenizer, _prompts(), batch_size=4, max_new_tokens=3, progress=done.append)
    assert done == [4, 6]

    monkeypatch.setattr(evaluate_module, "PROGRESS_EVERY_S", 0.0)  # a line after every batch
    suite = load_suite(Path(__file__).parents[1] / "fixtures" / "bfcl", ["simple", "irrelevance"])
    said: list[str] = []
    run_suite(model, tokenizer, suite, EvalConfig(batch_size=2, max_new_tokens=3), say=said.append)
    shape = [re.sub(r"\d+(\.\d+)? s|\([\d.e+]+/s\)", "#", line) for line in said]
    assert shape == [
        "BFCL simple (1 of 2 categories): answering 3 entries",
        "BFCL simple: 2 of 3 answered in # #, about # left",
        "BFCL simple: 0/3 (0.0 %) fully right in #",
        "BFCL irrelevance (2 of 2 categories): answering 3 entries",
        "BFCL irrelevance: 2 of 3 answered in # #, about # left",
        "BFCL irrelevance: 3/3 (100.0 %) fully right in #",
    ]


def test_evaluate_end_to_end_with_loss(tokenizer: Any, tiny_model: Any) -> None:
    conversations = [c["conversation"] for c in CASES[:6]]
    text = tokenizer.apply_chat_template(conversations[0]["messages"], tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    labels = ids.clone()
    labels[:, : ids.shape[1] // 2] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    said: list[str] = []
    scores, loss = evaluate(
        tiny_model,
        tokenizer,
        conversations,
        EvalConfig(max_examples=4, batch_size=3, max_new_tokens=6),
        loss_batches=[batch, batch],
        say=said.append,
    )
    # What it is doing, said before each wait (a fast one has no progress line between).
    assert said[0] == "answering 4 held-out turns greedily, 3 at a time, at most 6 new tokens each"
    assert re.fullmatch(r"answered 4 held-out turns in \d+\.\d s", said[1])
    assert said[2:] == ["held-out loss over 2 batches"]

    assert isinstance(scores, EvalScores)
    assert scores.counts["turns"] == 4
    assert scores.call_accuracy.total == 4
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0, :-1]
    manual = torch.nn.functional.cross_entropy(logits, labels[0, 1:], ignore_index=-100).item()
    assert loss == pytest.approx(manual, rel=1e-9)
    assert eval_loss(tiny_model, [{"input_ids": ids, "labels": torch.full_like(ids, -100)}]) is None
    assert evaluate(tiny_model, tokenizer, [], EvalConfig())[1] is None


# ------------------------------------------------------------------------- BFCL agreement (regressions)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["location"],
}


def test_an_omitted_optional_passes_only_where_the_reference_gives_the_schema_default() -> None:
    # BFCL fails an optional parameter the answer sets and the model leaves out, unless "" is listed.
    paris = Call("get_weather", {"location": "Paris"})
    assert compare_call(Call("get_weather", {"location": "Paris", "unit": "celsius"}), paris, WEATHER_SCHEMA).ok
    match = compare_call(Call("get_weather", {"location": "Paris", "unit": "fahrenheit"}), paris, WEATHER_SCHEMA)
    assert not match.ok
    assert match.reasons == ['get_weather(unit): missing, expected "fahrenheit"']
    # No default in the schema: the reference's value is the only one accepted, and leaving it out is not.
    no_default = {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}}}
    assert not compare_call(Call("get_weather", {"location": "Paris", "unit": "celsius"}), paris, no_default).ok


def test_a_nested_key_without_a_required_list_must_still_be_given() -> None:
    # BFCL's dict_checker: every key of the answer's object must be there unless its list holds "".
    schema = {
        "type": "object",
        "properties": {
            "conditions": {
                "type": "object",
                "properties": {"department": {"type": "string"}, "school": {"type": "string"}},
            }
        },
        "required": ["conditions"],
    }
    reference = Call("db_fetch_records", {"conditions": {"department": "Science", "school": "Bluebird"}})
    match = compare_call(reference, Call("db_fetch_records", {"conditions": {"department": "Science"}}), schema)
    assert not match.ok
    assert match.reasons == ['db_fetch_records(conditions.school): missing, expected "Bluebird"']


# ------------------------------------------------------------------------------- BFCL agreement (table)

# Where we score differently from BFCL on purpose; docs/evaluation.md gives each one's reason under this name.
DELIBERATE = {
    "json_schema_numbers": "10.0 is an integer and 1 a float, at every depth, as in JSON Schema",
    "parallel_maximum_matching": "parallel calls paired by maximum matching, not greedily in the answer's order",
    "tool_call_whitespace": "any whitespace inside <tool_call> tags, not exactly one newline",
    "malformed_block_is_a_call": "a <tool_call> block that does not decode is a malformed call, not no call",
    "nested_values_normalised": "values inside an object or list parameter compared by the same rules as top level",
    "answer_type_over_schema": "a value's type judged by the schema, not by the possible answer's own type",
}


@pytest.mark.parametrize("case", BFCL_CASES, ids=[c["id"] for c in BFCL_CASES])
def test_agrees_with_bfcl_except_where_documented(case: dict[str, Any]) -> None:
    """tests/fixtures/finetune_eval/bfcl_cases.jsonl: BFCL v4 entries (function, possible answer) with a model
    output each and BFCL's own verdict on it (`bfcl`); `ours` and `why` only where we differ on purpose."""
    turn = Turn(
        messages=[{"role": "user", "content": case.get("question", "")}],
        tools=case["function"],
        expected=possible_answer_calls(case["possible_answer"]),
    )
    verdict = score_turn(turn, parse_output(case["output"]))
    if "ours" in case:
        assert case["why"] in DELIBERATE and case["ours"] is not case["bfcl"]
    assert verdict.correct is case.get("ours", case["bfcl"]), verdict.reasons


def test_the_table_covers_each_category_and_every_difference_is_documented() -> None:
    assert len(BFCL_CASES) >= 30
    assert {c["category"] for c in BFCL_CASES} == {"simple", "multiple", "parallel", "irrelevance"}
    assert {c["why"] for c in BFCL_CASES if "why" in c} == set(DELIBERATE)
    doc = EVALUATION_DOC.read_text()
    assert all(f"`{name}`" in doc for name in DELIBERATE)


def test_possible_answer_reasons_name_the_accepted_values() -> None:
    schema = {
        "type": "dict",
        "properties": {
            "function": {"type": "string"},
            "method": {"type": "string"},
            "conditions": {"type": "dict", "properties": {"school": {"type": "string"}}},
        },
        "required": ["function"],
    }
    (reference,) = possible_answer_calls(
        [{"f": {"function": ["x**2", "y=x**2"], "method": ["", "trapezoidal"], "conditions": [{"school": ["A", "B"]}]}}]
    )
    match = compare_call(reference, Call("f", {"function": "x^3", "method": "simpson", "conditions": {}}), schema)
    assert match.reasons == [
        'f(function): expected one of "x**2", "y=x**2", found "x^3"',
        'f(method): expected "trapezoidal", found "simpson"',
        'f(conditions.school): missing, expected "A" or "B"',
    ]
    assert compare_call(reference, Call("f", {"function": "Y = X**2", "conditions": {"school": "b"}}), schema).ok


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ({"f": {}}, "possible answer: expected a list of {function: {parameter: [values]}}"),
        ([{"f": {}, "g": {}}], "possible answer, call 0: expected one {function: {parameter: [values]}}"),
        ([{"f": {"a": 1}}], "possible answer, call 0: f(a): expected a list of accepted values, found 1"),
        ([{"f": {"a": [{"b": "x"}]}}], 'call 0: f(a).b: expected a list of accepted values, found "x"'),
        ([{"f": {"a": [[{"b": 2}]]}}], "call 0: f(a).b: expected a list of accepted values, found 2"),
    ],
)
def test_a_possible_answer_of_the_wrong_shape_is_refused(ground_truth: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        possible_answer_calls(ground_truth)


def test_an_assistant_message_with_a_possible_answer_is_scored_against_it() -> None:
    conversation = {
        "messages": [
            {"role": "user", "content": "Weather in NYC?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "NYC"}}}
                ],
                "possible_answer": [{"get_weather": {"location": ["New York", "NYC"], "unit": ["", "celsius"]}}],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}],
    }
    (turn,) = expected_turns(conversation, index=3)
    assert turn.expected == [
        Call("get_weather", {"location": ["New York", "NYC"], "unit": ["", "celsius"]}, possible_answer=True)
    ]
    ok = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "new york", "unit": "celsius"}}\n</tool_call>'
    assert score_turn(turn, parse_output(ok)).correct
    with pytest.raises(ValueError, match="conversation 3, message 1, call 0: get_weather"):
        expected_turns(
            {
                **conversation,
                "messages": [
                    conversation["messages"][0],
                    {"role": "assistant", "possible_answer": [{"get_weather": {"location": "NYC"}}]},
                ],
            },
            index=3,
        )
