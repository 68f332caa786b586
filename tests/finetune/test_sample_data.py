"""The bundled Glaive-format sample: reproducible from its generator, realistic, and exercising the parser."""

from __future__ import annotations

import json
from collections import Counter

from tools.sample_data import (
    CATALOGUE,
    SAMPLE_PATH,
    SAMPLE_ROWS,
    SAMPLE_SEED,
    expected_unparsable,
    generate_rows,
    to_jsonl,
)

from gpucert.finetune.data.glaive import parse_rows


def test_shipped_file_is_the_generator_output() -> None:
    assert SAMPLE_PATH.read_text(encoding="utf-8") == to_jsonl(generate_rows(SAMPLE_ROWS, SAMPLE_SEED))
    assert SAMPLE_PATH.stat().st_size < 1_000_000


def test_generation_is_deterministic_and_seeded() -> None:
    assert generate_rows(30, 7) == generate_rows(30, 7)
    assert generate_rows(30, 7) != generate_rows(30, 8)


def test_rows_are_in_glaive_textual_format() -> None:
    for row in generate_rows(60, 1):
        assert set(row) == {"system", "chat"}
        assert row["system"].startswith("SYSTEM: You are a helpful assistant")
        assert row["chat"].startswith("USER: ")
        for turn in row["chat"].split("\n\n\n"):
            assert turn.startswith(("USER: ", "ASSISTANT: ", "FUNCTION RESPONSE: "))
            assert turn.endswith(" <|endoftext|>") == turn.startswith("ASSISTANT: ")
        for call in row["chat"].split("<functioncall> ")[1:]:
            assert '"arguments": \'' in call  # the single-quoted arguments of Glaive


def test_shipped_sample_parses_with_the_expected_failures() -> None:
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text(encoding="utf-8").splitlines()]
    conversations, report = parse_rows(rows)
    assert report.total == SAMPLE_ROWS == 400
    assert report.unparsable == expected_unparsable(SAMPLE_ROWS) == 10
    reasons = Counter(reason.split(":")[0] for _, reason in report.examples)
    assert reasons == {"arguments are neither JSON nor a Python literal": 5, "consecutive duplicate assistant turns": 5}

    called = Counter(
        call["function"]["name"] for conv in conversations for m in conv.messages for call in m.get("tool_calls", [])
    )
    assert set(called) == {tool.schema["name"] for tool in CATALOGUE}
    assert len(CATALOGUE) == 15
    kinds = Counter()
    for conv in conversations:
        roles = [m["role"] for m in conv.messages]
        texts = " ".join(str(m.get("content")) for m in conv.messages if m["role"] == "assistant")
        kinds["no_tools"] += not conv.tools
        kinds["tools_no_call"] += bool(conv.tools) and "tool" not in roles
        kinds["refusal"] += "I'm sorry" in texts
        kinds["multi_turn"] += roles.count("user") > 1
        kinds["prose_and_call"] += any(m.get("tool_calls") and m["content"] for m in conv.messages)
        kinds["clarify"] += any(m["role"] == "assistant" and m["content"].endswith("?") for m in conv.messages)
    assert all(kinds[k] >= 10 for k in kinds), kinds


def test_python_literal_arguments_appear_and_parse() -> None:
    rows = [r for r in generate_rows() if "'{'" in r["chat"]]
    assert rows
    conversations, report = parse_rows(rows)
    assert report.unparsable == 0 and len(conversations) == len(rows)
