"""Glaive v2 rows -> OpenAI-style conversations, with every quirk of the format (reference §5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucert.finetune.glaive import (
    MAX_EXAMPLES,
    Conversation,
    GlaiveFormatError,
    parse_arguments,
    parse_row,
    parse_rows,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "finetune"
TOOLS_SYSTEM = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
    + json.dumps({"name": "translate_text", "parameters": {"type": "object", "properties": {}}}, indent=4)
)
NO_TOOLS_SYSTEM = "SYSTEM: You are a helpful assistant, with no access to external functions."


def row(chat: str, system: str = TOOLS_SYSTEM) -> dict[str, str]:
    return {"system": system, "chat": chat}


def test_reference_example_maps_to_messages_and_tools() -> None:
    conv = parse_row(json.loads((FIXTURES / "glaive_example.json").read_text()))
    assert [t["function"]["name"] for t in conv.tools] == ["convert_temperature", "get_tide_times"]
    assert conv.tools[0]["type"] == "function"
    assert conv.tools[0]["function"]["parameters"]["required"] == ["value", "to_unit"]
    assert conv.messages == [
        {
            "role": "system",
            "content": "You are a helpful assistant with access to the following functions. Use them if required.",
        },
        {"role": "user", "content": "It is 31 degrees Celsius in Seville. What is that in Fahrenheit?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "convert_temperature", "arguments": {"value": 31, "to_unit": "F"}},
                }
            ],
        },
        {"role": "tool", "name": "convert_temperature", "content": '{"value": 87.8, "unit": "F"}'},
        {"role": "assistant", "content": "31 °C is 87.8 °F."},
        {"role": "user", "content": "Could you also book me a taxi to the airport?"},
        # A refusal of what the tools cannot do is kept: it teaches irrelevance.
        {
            "role": "assistant",
            "content": "I'm sorry, I can't book taxis. I can only convert temperatures and look up tide times.",
        },
    ]


def test_end_of_text_is_stripped_everywhere() -> None:
    conv = parse_row(row("USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>"))
    assert conv.messages[-1] == {"role": "assistant", "content": "Hello!"}
    assert "<|endoftext|>" not in json.dumps(conv.to_json())


def test_apostrophes_inside_argument_values_survive() -> None:
    chat = (
        "USER: Translate it\n\n\nASSISTANT: <functioncall> "
        """{"name": "translate_text", "arguments": '{"text": "I'm here, it's late", "to": "fr"}'} <|endoftext|>"""
    )
    call = parse_row(row(chat)).messages[-1]["tool_calls"][0]["function"]
    assert call == {"name": "translate_text", "arguments": {"text": "I'm here, it's late", "to": "fr"}}


def test_python_literal_arguments_are_repaired_with_literal_eval() -> None:
    chat = (
        "USER: go\n\n\nASSISTANT: <functioncall> "
        """{"name": "translate_text", "arguments": '{'text': 'hola', 'formal': True, 'hint': None}'} <|endoftext|>"""
    )
    arguments = parse_row(row(chat)).messages[-1]["tool_calls"][0]["function"]["arguments"]
    assert arguments == {"text": "hola", "formal": True, "hint": None}


def test_arguments_already_json_are_accepted() -> None:
    chat = (
        'USER: go\n\n\nASSISTANT: <functioncall> {"name": "translate_text", "arguments": {"text": "x"}} <|endoftext|>'
    )
    assert parse_row(row(chat)).messages[-1]["tool_calls"][0]["function"]["arguments"] == {"text": "x"}


@pytest.mark.parametrize("bad", ['{"text": "x"', "[1, 2]", "{text: x}"])
def test_unrepairable_arguments_make_the_row_unparsable(bad: str) -> None:
    with pytest.raises(GlaiveFormatError, match="arguments"):
        parse_arguments(bad)
    chat = (
        f"""USER: go\n\n\nASSISTANT: <functioncall> {{"name": "translate_text", "arguments": '{bad}'}} <|endoftext|>"""
    )
    conversations, report = parse_rows([row(chat)])
    assert conversations == []
    assert report.unparsable == 1 and "arguments" in report.examples[0][1]


def test_prose_then_second_assistant_call_is_merged() -> None:
    chat = (
        "USER: Translate hola\n\n\n"
        "ASSISTANT: Sure, one moment. <|endoftext|>\n\n\n"
        """ASSISTANT: <functioncall> {"name": "translate_text", "arguments": '{"text": "hola"}'} <|endoftext|>\n\n\n"""
        'FUNCTION RESPONSE: {"translation": "hello"}\n\n\n'
        "ASSISTANT: It means hello. <|endoftext|>"
    )
    messages = parse_row(row(chat)).messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "Sure, one moment."
    assert messages[2]["tool_calls"][0]["function"]["name"] == "translate_text"
    assert messages[3]["name"] == "translate_text"


def test_prose_and_call_in_one_turn() -> None:
    chat = (
        "USER: x\n\n\nASSISTANT: Let me check. "
        """<functioncall> {"name": "translate_text", "arguments": '{}'} <|endoftext|>"""
    )
    message = parse_row(row(chat)).messages[-1]
    assert message["content"] == "Let me check."
    assert message["tool_calls"][0]["function"] == {"name": "translate_text", "arguments": {}}


def test_consecutive_duplicate_assistant_turns_drop_the_row() -> None:
    call = """<functioncall> {"name": "translate_text", "arguments": '{"text": "a"}'} <|endoftext|>"""
    chat = f"USER: x\n\n\nASSISTANT: {call}\n\n\nASSISTANT: {call}"
    conversations, report = parse_rows([row(chat)])
    assert conversations == [] and report.examples == [(0, "consecutive duplicate assistant turns")]


def test_rows_without_tools_are_kept() -> None:
    conv = parse_row(row("USER: What is 2+2?\n\n\nASSISTANT: 4. <|endoftext|>", system=NO_TOOLS_SYSTEM))
    assert conv.tools == []
    assert conv.messages[0] == {
        "role": "system",
        "content": "You are a helpful assistant, with no access to external functions.",
    }


def test_blank_lines_inside_a_description_do_not_split_the_function_list() -> None:
    schema = {"name": "f", "description": "line one\n\nline two", "parameters": {}}
    system = TOOLS_SYSTEM + "\n\n" + json.dumps(schema, indent=4)
    conv = parse_row(row("USER: a\n\n\nASSISTANT: b <|endoftext|>", system=system))
    assert [t["function"]["name"] for t in conv.tools] == ["translate_text", "f"]
    assert conv.tools[1]["function"]["description"] == "line one\n\nline two"


@pytest.mark.parametrize(
    ("bad_row", "reason"),
    [
        ({"system": NO_TOOLS_SYSTEM}, "string columns"),
        ({"system": None, "chat": 3}, "string columns"),
        (row("hello there"), "does not start"),
        (row("USER: hi"), "no ASSISTANT turn"),
        (row('USER: hi\n\n\nFUNCTION RESPONSE: {"a": 1}\n\n\nASSISTANT: ok <|endoftext|>'), "without a preceding"),
        (row("USER: hi\n\n\nASSISTANT: <|endoftext|>"), "empty ASSISTANT"),
        (row("USER: hi\n\n\nASSISTANT: ok", system=TOOLS_SYSTEM + "\n\n{broken"), "function list"),
        (row("USER: hi\n\n\nASSISTANT: <functioncall> no json here"), "without a name"),
    ],
)
def test_bad_rows_are_counted_with_a_reason_never_raised(bad_row: dict, reason: str) -> None:
    good = row("USER: hi\n\n\nASSISTANT: hello <|endoftext|>")
    conversations, report = parse_rows([good, bad_row, good])
    assert len(conversations) == 2
    assert (report.total, report.parsed, report.unparsable) == (3, 2, 1)
    assert report.examples[0][0] == 1 and reason in report.examples[0][1]


def test_report_keeps_at_most_ten_examples() -> None:
    _, report = parse_rows([{"chat": None}] * 25)
    assert report.unparsable == 25 and len(report.examples) == MAX_EXAMPLES


def test_conversation_json_round_trip() -> None:
    conv = parse_row(json.loads((FIXTURES / "glaive_example.json").read_text()))
    assert Conversation.from_json(json.loads(json.dumps(conv.to_json()))) == conv
