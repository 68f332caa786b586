"""Glaive v2 rows -> OpenAI-style conversations, with every quirk of the format (reference §5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucert.finetune.data.glaive import (
    MAX_EXAMPLES,
    Conversation,
    GlaiveFormatError,
    parse_arguments,
    parse_call,
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
        (row("USER: hi\n\n\nASSISTANT: <functioncall> no json here <|endoftext|>"), "without a name"),
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


# Rows in Glaive v2's exact textual format (original content), one per data-quality case, with the rule that
# applies to it (docs/finetune-data.md): {"case", "expect": kept | repaired | dropped, "system", "chat"}.
QUIRKS = [json.loads(line) for line in (FIXTURES / "glaive_quirks.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("quirk", QUIRKS, ids=[f"{i}-{q['case']}-{q['expect']}" for i, q in enumerate(QUIRKS)])
def test_each_data_quality_case_is_repaired_dropped_or_kept_and_counted(quirk: dict) -> None:
    conversations, report = parse_rows([quirk])
    case = quirk["case"]
    if quirk["expect"] == "dropped":
        assert conversations == [] and report.unparsable == 1
        assert set(report.dropped) == {case}, report.dropped
        assert report.dropped[case].examples[0].row == 0
    else:
        assert len(conversations) == 1 and report.unparsable == 0
        expected = set() if quirk["expect"] == "kept" else {case}
        # A JSON escape is repaired in a Python literal, itself a repair of the arguments.
        assert set(report.repaired) - ({"python_literal_arguments"} - expected) == expected
        assert all(t.count == 1 for t in report.repaired.values())
    if quirk["expect"] != "dropped":
        # What training sees: every call names a declared function with a finite JSON object of arguments.
        conv = conversations[0]
        declared = [t["function"]["name"] for t in conv.tools]
        assert len(declared) == len(set(declared))
        for message in conv.messages:
            for call in message.get("tool_calls", []):
                assert call["function"]["name"] in declared
                json.dumps(call["function"]["arguments"], allow_nan=False)
            for marker in ("\nUSER:", "\nASSISTANT:", "\nFUNCTION RESPONSE:"):
                assert marker not in str(message["content"])


def test_arguments_under_another_key_are_moved_to_arguments() -> None:
    for text in (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        """{"name": "get_weather", "parameters": '{"city": "Paris"}'}""",
        """{"name": "get_weather", 'args': '{"city": "Paris"}'}""",
    ):
        repairs: list = []
        call = parse_call(text, repairs)
        assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}, text
        assert [r.case for r in repairs] == ["arguments_key"]
    # A call with no arguments at all is a call without arguments, not a repair.
    repairs = []
    assert parse_call('{"name": "get_time"}', repairs)["function"]["arguments"] == {} and repairs == []


def test_a_call_with_several_candidate_argument_keys_is_dropped() -> None:
    with pytest.raises(GlaiveFormatError, match="keys") as caught:
        parse_call('{"name": "f", "parameters": {"a": 1}, "options": {"b": 2}}')
    assert caught.value.case == "bad_call"


@pytest.mark.parametrize(
    "text", ['{"x": NaN}', '{"x": Infinity}', '{"x": [1, -Infinity]}', '{"x": 1e999}', "{'x': 1e999, 'y': True}"]
)
def test_non_finite_numbers_in_arguments_are_refused(text: str) -> None:
    with pytest.raises(GlaiveFormatError, match="not finite") as caught:
        parse_arguments(text)
    assert caught.value.case == "non_finite_number"


def test_python_literal_fallback_decodes_json_escapes() -> None:
    repairs: list = []
    value = parse_arguments("""{'path': "a\\/b", 'emoji': "\\ud83d\\ude00", 'ok': True}""", repairs)
    assert value == {"path": "a/b", "emoji": "\U0001f600", "ok": True}
    assert [r.case for r in repairs] == ["python_literal_arguments", "json_escape_in_literal"]
    # An escaped backslash before a slash is a backslash and a slash, in JSON and in Python alike.
    assert parse_arguments("""{'path': "a\\\\/b", 'ok': True}""") == {"path": "a\\/b", "ok": True}
    # Plain JSON is not a repair.
    repairs = []
    assert parse_arguments('{"path": "a\\/b"}', repairs) == {"path": "a/b"} and repairs == []


def test_an_unpaired_surrogate_drops_the_row() -> None:
    with pytest.raises(GlaiveFormatError, match="surrogate"):
        parse_arguments("""{'text': "\\ud83d alone", 'ok': True}""")


def test_stray_role_marker_inside_any_turn_drops_the_row() -> None:
    call = """<functioncall> {"name": "translate_text", "arguments": '{"text": "a"}'} <|endoftext|>"""
    for chat in (
        "USER: hi\nASSISTANT: hello\n\n\nASSISTANT: ok <|endoftext|>",
        f'USER: hi\n\n\nASSISTANT: {call}\n\n\nFUNCTION RESPONSE: {{"t": "b"}}\nASSISTANT: b'
        "\n\n\nASSISTANT: b <|endoftext|>",
        "USER: hi\n\n\nASSISTANT: hello\nUSER: and you? <|endoftext|>",
    ):
        conversations, report = parse_rows([row(chat)])
        assert conversations == [] and list(report.dropped) == ["stray_role_marker"], chat
        assert "ASSISTANT:" in report.dropped["stray_role_marker"].examples[0].excerpt or "USER:" in (
            report.dropped["stray_role_marker"].examples[0].excerpt
        )


def test_a_role_word_inside_text_is_not_a_marker() -> None:
    conv = parse_row(row("USER: Label the line 'USER: x' please\n\n\nASSISTANT: Done: the USER: prefix. <|endoftext|>"))
    assert conv.messages[-1]["content"] == "Done: the USER: prefix."


def test_a_call_to_an_undeclared_function_drops_the_row() -> None:
    chat = """USER: x\n\n\nASSISTANT: <functioncall> {"name": "book_taxi", "arguments": '{}'} <|endoftext|>"""
    conversations, report = parse_rows([row(chat)])
    assert conversations == [] and list(report.dropped) == ["undeclared_function"]
    assert "book_taxi" in report.dropped["undeclared_function"].examples[0].excerpt


def test_a_function_declared_twice_is_deduplicated_when_identical_and_dropped_when_not() -> None:
    same = TOOLS_SYSTEM + "\n\n" + TOOLS_SYSTEM.split("-\n", 1)[1]
    conversations, report = parse_rows([row("USER: a\n\n\nASSISTANT: b <|endoftext|>", system=same)])
    assert [t["function"]["name"] for t in conversations[0].tools] == ["translate_text"]
    assert report.repaired["duplicate_function"].count == 1
    other = json.dumps({"name": "translate_text", "parameters": {"type": "object", "properties": {"x": {}}}}, indent=4)
    conversations, report = parse_rows([row("USER: a\n\n\nASSISTANT: b <|endoftext|>", system=same + "\n\n" + other)])
    assert conversations == [] and list(report.dropped) == ["conflicting_function"]


def test_a_truncated_final_turn_is_cut_and_the_complete_turns_kept() -> None:
    chat = "USER: a\n\n\nASSISTANT: b <|endoftext|>\n\n\nUSER: c\n\n\nASSISTANT: half a sent"
    conversations, report = parse_rows([row(chat)])
    assert [m["role"] for m in conversations[0].messages] == ["system", "user", "assistant"]
    assert conversations[0].messages[-1]["content"] == "b"
    assert report.repaired["truncated_final_turn"].count == 1
    # Nothing complete left: dropped, under the same case.
    conversations, report = parse_rows([row("USER: a\n\n\nASSISTANT: half a sent")])
    assert conversations == [] and list(report.dropped) == ["truncated_final_turn"]


def test_report_counts_every_case_with_row_and_excerpt() -> None:
    conversations, report = parse_rows(QUIRKS)
    assert report.total == len(QUIRKS) and report.parsed == len(conversations)
    expected_drops = sum(q["expect"] == "dropped" for q in QUIRKS)
    assert report.unparsable == expected_drops == sum(t.count for t in report.dropped.values())
    summary = report.as_dict()
    assert json.loads(json.dumps(summary)) == summary
    for kind in ("dropped", "repaired"):
        for case, tally in summary[kind].items():
            assert tally["count"] >= 1 and tally["examples"], case
            example = tally["examples"][0]
            if case != "python_literal_arguments":
                assert QUIRKS[example["row"]]["case"] == case
            assert 0 < len(example["excerpt"]) <= 160


def test_rows_of_the_report_can_be_named_by_their_source_line() -> None:
    _, report = parse_rows([row("nonsense")], locations=["data.jsonl:7"])
    assert report.dropped["no_leading_turn"].examples[0].at == "data.jsonl:7"


# A call written in another syntax: read as a call when nothing else can be meant, else the row is dropped.
TAGGED = '<tool_call>\n{"name": "translate_text", "arguments": {"text": "hola"}}\n</tool_call>'
RESPONSE_CUT = '\n\n\nFUNCTION RESPONSE: {"translation": "hello"}'


@pytest.mark.parametrize(
    ("written", "prose"),
    [
        (TAGGED, ""),
        (f"Let me translate that. {TAGGED}", "Let me translate that."),
        ("""<function_call> {"name": "translate_text", "arguments": '{"text": "hola"}'}""", ""),
        ('{"name": "translate_text", "arguments": {"text": "hola"}}', ""),
        ("""<FunctionCall> {"name": "translate_text", "parameters": {"text": "hola"}} </FunctionCall>""", ""),
        ("translate_text(text='hola')", ""),
        ("[translate_text(text='hola')]", ""),
    ],
)
def test_a_call_in_another_syntax_is_read_as_a_call_when_unambiguous(written: str, prose: str) -> None:
    # The tail (the call's response) is cut: nothing but the call's syntax tells it is one.
    chat = f"USER: Translate hola\n\n\nASSISTANT: {written} <|endoftext|>{RESPONSE_CUT}"
    conversations, report = parse_rows([row(chat)])
    assert len(conversations) == 1, report.dropped
    message = conversations[0].messages[-1]
    assert message["content"] == prose
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "translate_text", "arguments": {"text": "hola"}}}
    ]
    assert report.repaired["foreign_call_syntax"].count == 1
    assert "translate_text" in report.repaired["foreign_call_syntax"].examples[0].excerpt


@pytest.mark.parametrize(
    "written",
    [
        f"{TAGGED} Anything else?",  # prose after the call
        "<tool_call> translate hola please </tool_call>",  # no call inside the tags
        f"{TAGGED}\n{TAGGED.replace('</tool_call>', '')} {TAGGED}",  # a tag opened twice
        '[TOOL_CALLS] [{"name": "translate_text", "arguments": {"text": "hola"}}]',
        'I would call {"name": "translate_text", "arguments": {"text": "hola"}} now.',
        "You could run translate_text(text='hola') yourself.",
        "translate_text(text=hola)",  # not a literal
        f'{TAGGED}\n<functioncall> {{"name": "translate_text", "arguments": \'{{}}\'}}',  # two syntaxes
    ],
)
def test_a_call_in_another_syntax_that_is_ambiguous_drops_the_row(written: str) -> None:
    chat = f"USER: Translate hola\n\n\nASSISTANT: {written} <|endoftext|>{RESPONSE_CUT}"
    conversations, report = parse_rows([row(chat)], locations=["rows.jsonl:3"])
    assert conversations == [] and list(report.dropped) == ["foreign_call_syntax"], report.dropped
    example = report.dropped["foreign_call_syntax"].examples[0]
    assert example.at == "rows.jsonl:3" and "<functioncall>" in example.excerpt


def test_call_syntax_in_input_turns_and_plain_prose_is_not_a_call() -> None:
    chat = (
        f"USER: What does {TAGGED} mean?\n\n\n"
        "ASSISTANT: It is a tool call tag; translate_text takes a text. The name field names it. <|endoftext|>"
    )
    conversations, report = parse_rows([row(chat)])
    assert len(conversations) == 1 and not report.repaired and not report.dropped
    assert "tool_calls" not in conversations[0].messages[-1]


def test_every_stray_end_of_text_marker_is_removed_and_counted() -> None:
    chat = (
        "USER: Hi <|endoftext|>\n\n\n"
        "ASSISTANT: Hello! <|endoftext|> How can I help? <|endoftext|> <|endoftext|>\n\n\n"
        "USER: Nothing.\n\n\nASSISTANT: Bye. <|endoftext|>"
    )
    conversations, report = parse_rows([row(chat)])
    assert [m["content"] for m in conversations[0].messages[1:]] == ["Hi", "Hello! How can I help?", "Nothing.", "Bye."]
    # Three markers inside turns; the closing marker of each assistant turn is the format, not a repair.
    assert report.repaired["stray_end_of_text"].count == 3
    assert "user turn" in report.repaired["stray_end_of_text"].examples[0].excerpt
    _, clean = parse_rows([row("USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>")])
    assert not clean.repaired
