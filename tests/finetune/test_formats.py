"""Alpaca and OpenAI-messages rows, and loading sources with `datasets` (local files only: no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucert.finetune.config import DataConfig
from gpucert.finetune.formats import (
    alpaca_to_conversation,
    load_conversations,
    load_rows,
    messages_to_conversation,
    parse_alpaca_rows,
    parse_messages_rows,
)
from gpucert.finetune.sample_data import expected_unparsable

FIXTURES = Path(__file__).parents[1] / "fixtures" / "finetune"


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines()]


def test_alpaca_rows_become_one_user_and_one_assistant_turn() -> None:
    conversations, report = parse_alpaca_rows(read_jsonl("alpaca.jsonl"))
    assert (report.total, report.parsed, report.unparsable) == (4, 2, 2)
    assert [reason for _, reason in report.examples] == [
        "'instruction' is missing or empty",
        "'output' is missing or empty",
    ]
    assert conversations[0].messages == [
        {"role": "user", "content": "Give three tips for staying healthy."},
        {"role": "assistant", "content": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep well."},
    ]
    assert (
        conversations[1].messages[0]["content"] == "Translate the sentence into French.\n\n### Input:\nThe cat sleeps."
    )
    assert all(c.tools == [] for c in conversations)


def test_messages_rows_are_validated_and_normalised() -> None:
    conversations, report = parse_messages_rows(read_jsonl("messages.jsonl"))
    assert (report.total, report.parsed, report.unparsable) == (5, 2, 3)
    reasons = [reason for _, reason in report.examples]
    assert reasons[0].startswith("messages[1].role is 'wizard'")
    assert reasons[1] == "no assistant message"
    assert reasons[2] == "messages[1].tool_calls[0].arguments is not an object"
    weather = conversations[0]
    # JSON-string arguments become a dict (the template applies tojson); content None becomes "".
    assert weather.messages[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
    }
    assert weather.messages[3] == {"role": "tool", "content": '{"temp_c": 4}', "name": "get_weather"}
    assert weather.tools[0]["function"]["name"] == "get_weather"


def test_messages_accept_json_strings_bare_functions_and_arrow_nulls() -> None:
    row = {
        "messages": json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
        "tools": json.dumps([{"name": "f", "description": None, "parameters": {"type": "object"}}]),
    }
    conv = messages_to_conversation(row)
    assert conv.tools == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]


def test_alpaca_conversion_rejects_a_non_string_input() -> None:
    with pytest.raises(ValueError, match="'input'"):
        alpaca_to_conversation({"instruction": "a", "input": 3, "output": "b"})


def test_load_rows_from_local_json_and_parquet(tmp_path: Path) -> None:
    from datasets import Dataset

    rows = load_rows(DataConfig(source=str(FIXTURES / "alpaca.jsonl"), format="alpaca", cache_dir=str(tmp_path)))
    assert rows == read_jsonl("alpaca.jsonl")
    parquet = tmp_path / "alpaca.parquet"
    Dataset.from_list(rows).to_parquet(str(parquet))
    cfg = DataConfig(source=str(parquet), format="alpaca", max_rows=3, cache_dir=str(tmp_path))
    assert load_rows(cfg) == rows[:3]


def test_messages_survive_the_arrow_round_trip(tmp_path: Path) -> None:
    cfg = DataConfig(source=str(FIXTURES / "messages.jsonl"), format="messages", cache_dir=str(tmp_path))
    conversations, report = load_conversations(cfg)
    direct, _ = parse_messages_rows(read_jsonl("messages.jsonl"))
    assert conversations == direct and report.unparsable == 3


def test_sample_source_is_the_bundled_glaive_file(tmp_path: Path) -> None:
    conversations, report = load_conversations(DataConfig(source="sample", format="glaive", cache_dir=str(tmp_path)))
    assert report.total == 400 and report.unparsable == expected_unparsable(400)
    assert len(conversations) == report.parsed
    _, small = load_conversations(DataConfig(source="sample", max_rows=50, cache_dir=str(tmp_path)))
    assert small.total == 50


def test_errors_name_the_file_or_the_field(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"data.source: file .*nope.jsonl not found"):
        load_rows(DataConfig(source=str(missing)))
    text = tmp_path / "rows.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match=r"suffix '.txt'"):
        load_rows(DataConfig(source=str(text)))
    with pytest.raises(ValueError, match=r"data.format: unknown format 'sharegpt'"):
        load_conversations(DataConfig(format="sharegpt"))
    with pytest.raises(ValueError, match=r"format 'glaive' needs 'system', 'chat'"):
        load_conversations(DataConfig(source=str(FIXTURES / "alpaca.jsonl"), format="glaive", cache_dir=str(tmp_path)))
