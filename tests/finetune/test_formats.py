"""Alpaca and OpenAI-messages rows, and loading sources with `datasets` (local files only: no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tools.sample_data import expected_unparsable

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import DataConfig, load_finetune_config
from gpucert.finetune.data.formats import (
    DataError,
    alpaca_to_conversation,
    load_conversations,
    load_rows,
    messages_to_conversation,
    parse_alpaca_rows,
    parse_messages_rows,
    read_json_rows,
)

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


GOOD_LINE = json.dumps({"instruction": "Say hi.", "output": "Hi!"})


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def alpaca_cfg(path: Path, tmp_path: Path, **data: object) -> DataConfig:
    return DataConfig(source=str(path), format="alpaca", cache_dir=str(tmp_path / "cache"), **data)  # type: ignore[arg-type]


def test_a_broken_line_is_skipped_and_counted_with_its_file_and_line(tmp_path: Path) -> None:
    lines = [GOOD_LINE] * 150
    lines[6] = '{"instruction": "Say hi.", "output": '  # cut short
    lines[40] = ""  # blank lines are not rows and not errors
    source = write_lines(tmp_path / "rows.jsonl", lines)
    conversations, report = load_conversations(alpaca_cfg(source, tmp_path))
    assert len(conversations) == report.total == 148
    assert report.bad_lines == 1 and report.lines == 149
    assert report.bad_line_examples[0].startswith("rows.jsonl:7: ")
    # Rows keep their own source line in the examples of the parser's report.
    lines[100] = json.dumps({"instruction": "", "output": "x"})
    conversations, report = load_conversations(alpaca_cfg(write_lines(tmp_path / "rows.jsonl", lines), tmp_path))
    assert report.dropped["missing_field"].examples[0].at == "rows.jsonl:101"


def test_bad_lines_above_the_share_stop_the_run_naming_file_share_and_threshold(tmp_path: Path) -> None:
    lines = [GOOD_LINE] * 10
    lines[2] = lines[5] = "{broken"
    source = write_lines(tmp_path / "rows.jsonl", lines)
    with pytest.raises(DataError) as caught:
        load_conversations(alpaca_cfg(source, tmp_path))
    message = str(caught.value)
    assert str(source) in message and "2 of 10" in message and "20.0%" in message
    assert "data.max_bad_row_share=0.01" in message and "rows.jsonl:3" in message and "rows.jsonl:6" in message
    assert "Fix or delete those lines" in message
    # Raising the threshold skips them.
    conversations, report = load_conversations(alpaca_cfg(source, tmp_path, max_bad_row_share=0.25))
    assert len(conversations) == 8 and report.bad_lines == 2


def test_an_empty_file_is_refused_clearly(tmp_path: Path) -> None:
    for text in ("", "\n\n  \n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        with pytest.raises(DataError, match=r"empty\.jsonl is empty: no rows"):
            load_conversations(alpaca_cfg(empty, tmp_path))


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("table.json", "instruction,output\nSay hi.,Hi!\n"),
        ("binary.jsonl", "\x00\x01\x02 not json at all\n\x03\n"),
        ("array.json", '[{"instruction": "a", "output": "b"}, {"instruction": '),
    ],
)
def test_a_file_that_is_not_json_is_refused_naming_the_file(tmp_path: Path, name: str, content: str) -> None:
    source = tmp_path / name
    source.write_text(content)
    with pytest.raises(DataError) as caught:
        load_conversations(alpaca_cfg(source, tmp_path))
    assert str(source) in str(caught.value)


def test_undecodable_bytes_are_refused_naming_the_file(tmp_path: Path) -> None:
    source = tmp_path / "latin1.jsonl"
    source.write_bytes(GOOD_LINE.encode() + b"\n" + b'{"instruction": "caf\xe9", "output": "x"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl.*UTF-8"):
        load_conversations(alpaca_cfg(source, tmp_path))


def test_a_json_array_file_is_read_and_its_non_object_items_counted(tmp_path: Path) -> None:
    source = tmp_path / "rows.json"
    items: list = [json.loads(GOOD_LINE)] * 120 + [[1, 2]]
    source.write_text(json.dumps(items))
    conversations, report = load_conversations(alpaca_cfg(source, tmp_path))
    assert len(conversations) == 120 and report.bad_lines == 1
    assert report.bad_line_examples[0].startswith("rows.json[120]: ")


def test_a_corrupt_parquet_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    source = tmp_path / "rows.parquet"
    source.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"rows\.parquet"):
        load_conversations(alpaca_cfg(source, tmp_path))


def test_max_bad_row_share_is_checked_with_the_config() -> None:
    assert DataConfig().max_bad_row_share == 0.01
    assert DataConfig(max_bad_row_share=0.0).problems() == []
    assert DataConfig(max_bad_row_share=1.0).problems() == []
    for bad in (-0.1, 1.5, float("nan")):
        assert DataConfig(max_bad_row_share=bad).problems() == [
            f"data.max_bad_row_share must be in [0, 1], found {bad!r}"
        ]
    with pytest.raises(
        ConfigError, match=r"--set data.max_bad_row_share=2: data.max_bad_row_share must be in \[0, 1\]"
    ):
        load_finetune_config(None, ["data.max_bad_row_share=2"])


def test_messages_with_non_finite_arguments_are_dropped() -> None:
    row = {
        "messages": [
            {"role": "user", "content": "mean?"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "mean", "arguments": '{"x": [1, NaN]}'}}]},
        ]
    }
    conversations, report = parse_messages_rows(
        [
            row,
            {
                **row,
                "messages": [
                    row["messages"][0],
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "mean", "arguments": {"x": float("inf")}}}],
                    },
                ],
            },
        ]
    )
    assert conversations == [] and report.dropped["non_finite_number"].count == 2


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_a_call_written_in_message_content_is_read_into_tool_calls_or_drops_the_row() -> None:
    written = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    user = {"role": "user", "content": "Weather in Oslo?"}
    rows = [
        {"messages": [user, {"role": "assistant", "content": f"Checking. {written}"}], "tools": [WEATHER]},
        {"messages": [user, {"role": "assistant", "content": f"{written} Done."}], "tools": [WEATHER]},
        {
            "messages": [
                user,
                {
                    "role": "assistant",
                    "content": written,
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
                },
            ],
            "tools": [WEATHER],
        },
    ]
    conversations, report = parse_messages_rows(rows)
    assert conversations[0].messages[-1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
    }
    assert report.repaired["foreign_call_syntax"].count == 1
    assert report.dropped["foreign_call_syntax"].count == 2 and len(conversations) == 1


def test_an_alpaca_output_holding_a_call_is_dropped() -> None:
    rows = [
        {"instruction": "Weather in Oslo?", "output": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
        {"instruction": "Weather in Oslo?", "output": "<tool_call> get the weather </tool_call>"},
        {"instruction": "Name a JSON key.", "output": 'The key "name" names a thing.'},
    ]
    conversations, report = parse_alpaca_rows(rows)
    assert len(conversations) == 1 and report.dropped["foreign_call_syntax"].count == 2


def test_a_line_that_is_not_json_is_described_in_plain_words(tmp_path: Path) -> None:
    """json's message for a control character ends in "at": it once read "Invalid control character at at"."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"instruction": "ok"}\n{"instruction": "a\x01b"}\n')  # a raw control character
    bad = read_json_rows(rows, None).bad_line_examples
    assert len(bad) == 1 and bad[0].startswith("rows.jsonl:2: Invalid control character at column "), bad
