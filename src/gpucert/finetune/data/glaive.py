"""Parse Glaive function-calling v2 rows (`system`, `chat` strings) into OpenAI-style messages and tools.

The textual format and its quirks are described in docs (shared reference `fine-tuning.md` §5):
function objects pretty-printed in the system prompt, turns prefixed `USER: `, `ASSISTANT: ` and
`FUNCTION RESPONSE: `, assistant turns ending in ` <|endoftext|>`, and calls written as
`<functioncall> {"name": "...", "arguments": '{...}'}` with the arguments object single-quoted (not JSON).

Each data-quality case is repaired, dropped or kept by the rules in docs/finetune-data.md. A row that cannot
be converted faithfully is dropped and counted under its case, never raised and never half-converted; a row
that was repaired is counted under each repair's case. Both keep a few examples (row, source line, excerpt).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SYSTEM_PREFIX = "SYSTEM: "
TOOLS_PREAMBLE = "You are a helpful assistant with access to the following functions. Use them if required -"
NO_TOOLS_PREAMBLE = "You are a helpful assistant, with no access to external functions."
END_OF_TURN = "<|endoftext|>"
CALL_TAG = "<functioncall>"
ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
# A role prefix opens a turn at the very start of the chat or after a blank line (Glaive separates turns with
# two blank lines; one is tolerated). Content never starts a line with these prefixes after a blank line.
_TURN_START = re.compile(r"(?:\A|\n{2,})(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
# The same prefix at the start of a line inside a turn: a turn boundary written with one newline, or a
# transcript pasted into a turn. Either way the turn holds text of another speaker.
_STRAY_ROLE = re.compile(r"(?:\A|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):")
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
# The key whose value opens with a single quote: `"arguments": '`, or another name for it.
_ARGS_OPEN = re.compile(r"""["'](\w+)["']\s*:\s*'""")
# `\/` after an odd run of backslashes: JSON's escaped slash, which a Python literal keeps as two characters.
_JSON_SLASH = re.compile(r"(?<!\\)((?:\\\\)*)\\/")
# Call syntaxes of other formats, which Glaive's own `<functioncall>` never is: tags (Hermes / Qwen
# `<tool_call>`, `<function_call>`, `<functioncall>` spelled otherwise, their closing tags), Mistral's
# `[TOOL_CALLS]`, Llama 3's `<|python_tag|>`; and a bare call object `{"name": ..., "arguments": ...}`.
_FOREIGN_TAG = re.compile(r"<\|?\s*/?\s*(?:tool|function)[ _-]?calls?\s*\|?>|\[TOOL_CALLS\]|<\|python_tag\|>", re.I)
_BARE_CALL = re.compile(r"""\{\s*["']name["']\s*:\s*["'][^"'\n]*["']\s*,\s*["'](?:arguments|parameters)["']\s*:""")
FOREIGN_CALL = "foreign_call_syntax"
STRAY_END = "stray_end_of_text"
# A marker found anywhere but at the end of an assistant turn, with the spaces before it.
_STRAY_END_RE = re.compile(r"[ \t]*" + re.escape(END_OF_TURN))
MAX_EXAMPLES = 10
# Examples kept per case in the report, and the longest excerpt of a row shown in one.
CASE_EXAMPLES = 3
EXCERPT_CHARS = 160


@dataclass
class Conversation:
    """One training conversation, OpenAI style: `tools` holds {"type": "function", "function": {...}} entries;
    assistant calls carry `arguments` as a dict (the template renders it with `tojson`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.messages, "tools": self.tools}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Conversation:
        return cls(messages=list(obj["messages"]), tools=list(obj.get("tools") or []))


@dataclass(frozen=True)
class Repair:
    """One repair made to a row that was kept: its case (docs/finetune-data.md) and what changed."""

    case: str
    detail: str


@dataclass
class Example:
    row: int  # index of the row in the source, 0-based
    excerpt: str
    at: str | None = None  # "file.jsonl:18" where the source is a local file

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, **({"at": self.at} if self.at else {}), "excerpt": self.excerpt}


@dataclass
class Tally:
    count: int = 0
    examples: list[Example] = field(default_factory=list)

    def add(self, example: Example) -> None:
        self.count += 1
        if len(self.examples) < CASE_EXAMPLES:
            self.examples.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "examples": [e.as_dict() for e in self.examples]}


@dataclass
class ParseReport:
    total: int = 0
    parsed: int = 0
    unparsable: int = 0
    # (row index, reason) of the first MAX_EXAMPLES unparsable rows, whatever their case.
    examples: list[tuple[int, str]] = field(default_factory=list)
    # Rows dropped and rows repaired, by case.
    dropped: dict[str, Tally] = field(default_factory=dict)
    repaired: dict[str, Tally] = field(default_factory=dict)
    # Of a local file (formats.read_source): records read, and those that were not a JSON object ("file:line:
    # reason" for the first few); such lines never become rows, so `total` leaves them out.
    lines: int = 0
    bad_lines: int = 0
    bad_line_examples: list[str] = field(default_factory=list)

    def add_failure(self, index: int, reason: str, case: str = "unparsable", at: str | None = None) -> None:
        self.unparsable += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((index, reason))
        self.dropped.setdefault(case, Tally()).add(Example(index, _clip(reason), at))

    def add_repair(self, index: int, repair: Repair, at: str | None = None) -> None:
        self.repaired.setdefault(repair.case, Tally()).add(Example(index, _clip(repair.detail), at))

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.total,
            "parsed": self.parsed,
            "unparsable": self.unparsable,
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "bad_line_examples": list(self.bad_line_examples),
            "dropped": {case: tally.as_dict() for case, tally in sorted(self.dropped.items())},
            "repaired": {case: tally.as_dict() for case, tally in sorted(self.repaired.items())},
        }


class GlaiveFormatError(ValueError):
    """A row that does not follow Glaive's textual format; the message is the reason counted in the report and
    `case` the data-quality case it is counted under."""

    def __init__(self, message: str, case: str = "unparsable") -> None:
        super().__init__(message)
        self.case = case


def _clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _snippet(text: str, at: int = 0, width: int = 60) -> str:
    """A short repr of text around position `at`, for reasons and examples."""
    start = max(at - width // 2, 0)
    return ("..." if start else "") + repr(text[start : start + width])


def _note(repairs: list[Repair] | None, case: str, detail: str) -> None:
    if repairs is not None:
        repairs.append(Repair(case, detail))


def parse_tools(system: str, repairs: list[Repair] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Split a Glaive system prompt into the system message text and its function list (OpenAI tool entries).
    A function listed twice is kept once when both copies are equal; two different definitions of one name
    leave no way to tell which one a call was written against, and the row is dropped."""
    text = system.strip()
    if text.startswith(SYSTEM_PREFIX):
        text = text[len(SYSTEM_PREFIX) :]
    brace = text.find("{")
    if brace < 0:
        return text.strip(), []
    preamble, listing = text[:brace].strip(), text[brace:]
    decoder = json.JSONDecoder()
    tools: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    pos = 0
    while pos < len(listing):
        # The function objects are separated by blank lines; raw_decode reads one object at a time, so a blank
        # line inside a description (escaped in JSON) cannot split an object.
        while pos < len(listing) and listing[pos].isspace():
            pos += 1
        if pos >= len(listing):
            break
        try:
            obj, pos = decoder.raw_decode(listing, pos)
        except json.JSONDecodeError as exc:
            raise GlaiveFormatError(
                f"function list: invalid JSON at character {pos}: {exc.msg}", "bad_function_list"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise GlaiveFormatError(
                "function list: an entry is not an object with a string 'name'", "bad_function_list"
            )
        name = obj["name"]
        if name in seen:
            if seen[name] != obj:
                raise GlaiveFormatError(
                    f"function {name!r} is declared twice with different definitions", "conflicting_function"
                )
            _note(repairs, "duplicate_function", f"function {name!r} declared twice, identically: kept once")
            continue
        seen[name] = obj
        tools.append({"type": "function", "function": obj})
    # "... Use them if required -" introduces the listing, which now lives in `tools`.
    if preamble.endswith("-"):
        preamble = preamble[:-1].rstrip() + "."
    return preamble, tools


def _refuse_constant(name: str) -> Any:
    raise GlaiveFormatError(f"arguments hold {name}, a number that is not finite (not valid JSON)", "non_finite_number")


def json_value(value: Any, from_literal: bool) -> tuple[Any, bool]:
    """`value` as JSON would give it, and whether a string changed on the way. Numbers must be finite: json
    reads 1e999 as inf, and `tojson` would train the model to write `Infinity`. A Python literal's strings get
    their UTF-16 surrogate pairs (JSON's `\\ud83d\\ude00`) joined into one character, as json.loads does."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        changed = False
        for key, item in value.items():
            if not isinstance(key, str):
                raise GlaiveFormatError(f"arguments have a {type(key).__name__} key {key!r}", "bad_arguments")
            out[key], item_changed = json_value(item, from_literal)
            changed |= item_changed
        return out, changed
    if isinstance(value, (list, tuple)):
        pairs = [json_value(item, from_literal) for item in value]
        return [item for item, _ in pairs], any(c for _, c in pairs)
    if isinstance(value, str):
        text = value
        if from_literal:
            try:
                text = value.encode("utf-16", "surrogatepass").decode("utf-16")
            except UnicodeDecodeError:
                text = value  # an unpaired surrogate: refused below
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise GlaiveFormatError(
                f"arguments hold an unpaired surrogate in {_snippet(text)}", "bad_arguments"
            ) from None
        return text, text != value
    if isinstance(value, float) and not math.isfinite(value):
        _refuse_constant(repr(value))
    if value is None or isinstance(value, (bool, int, float)):
        return value, False
    raise GlaiveFormatError(f"arguments hold a {type(value).__name__}, which JSON cannot express", "bad_arguments")


def parse_arguments(text: str, repairs: list[Repair] | None = None) -> dict[str, Any]:
    """The arguments of a call as a dict: JSON first, then a Python literal (Glaive has True/None and
    single-quoted keys in places). A global quote swap would break on apostrophes inside values. The literal
    fallback reads JSON escapes the way JSON does (`\\/`, surrogate pairs); NaN and Infinity are refused."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
        from_literal = False
    except json.JSONDecodeError:
        source = _JSON_SLASH.sub(r"\1/", text)
        try:
            value = ast.literal_eval(source)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise GlaiveFormatError(
                f"arguments are neither JSON nor a Python literal: {text[:80]!r}", "bad_arguments"
            ) from None
        from_literal = True
    if isinstance(value, str):
        # Arguments given as a JSON string holding the object.
        return parse_arguments(value, repairs)
    if not isinstance(value, dict):
        raise GlaiveFormatError(f"arguments are a {type(value).__name__}, not an object", "bad_arguments")
    arguments, changed = json_value(value, from_literal)
    if from_literal:
        _note(repairs, "python_literal_arguments", f"arguments read as a Python literal: {_snippet(text)}")
        if changed or source != text:
            _note(repairs, "json_escape_in_literal", f"JSON escapes decoded in {_snippet(text)}")
    return arguments


def parse_call(text: str, repairs: list[Repair] | None = None) -> dict[str, Any]:
    """`{"name": "f", "arguments": '{...}'}` (text after `<functioncall>`) -> an OpenAI tool call. Arguments
    under another key (`"parameters"`) are moved to `arguments`: a call has a name and one arguments object."""
    body = text.strip()
    try:
        whole = json.loads(body, parse_constant=_refuse_constant)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("name"), str):
        name = whole["name"]
        others = [key for key in whole if key != "name"]
        if len(others) > 1:
            raise GlaiveFormatError(
                f"function call {name!r} has keys {others}; expected only name and arguments", "bad_call"
            )
        key = others[0] if others else "arguments"
        if key != "arguments":
            _note(repairs, "arguments_key", f"{name}: arguments under {key!r} moved to 'arguments'")
        args = whole.get(key, {})
        if isinstance(args, str):
            return _tool_call(name, parse_arguments(args, repairs))
        if not isinstance(args, dict):
            raise GlaiveFormatError(f"function call {name!r}: arguments are not an object", "bad_call")
        return _tool_call(name, json_value(args, from_literal=False)[0])
    name = _NAME.search(body)
    if name is None:
        raise GlaiveFormatError(f"function call without a name: {body[:80]!r}", "bad_call")
    opening = next((m for m in _ARGS_OPEN.finditer(body) if m.group(1) != "name"), None)
    closing = body.rfind("'}")
    if opening is None or closing < opening.end():
        raise GlaiveFormatError(f"function call arguments not quoted as '...': {body[:80]!r}", "bad_call")
    if body[closing + 2 :].strip():
        raise GlaiveFormatError(f"text after the function call: {body[closing + 2 :][:40]!r}", "bad_call")
    if opening.group(1) != "arguments":
        _note(repairs, "arguments_key", f"{name.group(1)}: arguments under {opening.group(1)!r} moved to 'arguments'")
    return _tool_call(name.group(1), parse_arguments(body[opening.end() : closing], repairs))


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _turns(chat: str) -> list[tuple[str, str, bool]]:
    """`USER: ...\\n\\n\\nASSISTANT: ...` -> [(role, text, ended)]: an assistant turn's closing ` <|endoftext|>`
    stripped, `ended` when it closed with one. Any other marker stays in the text, for `_remove_stray_ends`."""
    text = chat.strip()
    matches = list(_TURN_START.finditer(text))
    if not matches or matches[0].start() != 0:
        raise GlaiveFormatError(
            f"chat does not start with a USER/ASSISTANT/FUNCTION RESPONSE turn: {_snippet(text)}", "no_leading_turn"
        )
    turns = []
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        role = ROLES[match.group(1)]
        raw = text[match.end() : end].rstrip()
        ended = role == "assistant" and raw.endswith(END_OF_TURN)
        turns.append((role, (raw[: -len(END_OF_TURN)] if ended else raw).strip(), ended))
    return turns


def _remove_stray_ends(turns: list[tuple[str, str, bool]], repairs: list[Repair] | None) -> None:
    """Remove every end-of-text marker left inside a turn (not an assistant turn's closing one), each counted:
    the tokenizer reads the literal text as its end token, so training on it would teach the model to stop
    mid-turn."""
    for i, (role, body, ended) in enumerate(turns):
        for stray in _STRAY_END_RE.finditer(body):
            _note(repairs, STRAY_END, f"{END_OF_TURN} inside a {role} turn removed: {_snippet(body, stray.end())}")
        turns[i] = (role, _STRAY_END_RE.sub("", body).strip(), ended)


def split_turns(chat: str) -> list[tuple[str, str]]:
    """`USER: ...\\n\\n\\nASSISTANT: ...` -> [(role, text)], with every ` <|endoftext|>` removed."""
    turns = _turns(chat)
    _remove_stray_ends(turns, None)
    return [(role, body) for role, body, _ in turns]


def _check_stray_roles(turns: Sequence[tuple[str, str, bool]]) -> None:
    for role, body, _ in turns:
        stray = _STRAY_ROLE.search(body)
        if stray is not None:
            raise GlaiveFormatError(
                f"stray {stray.group(1)}: inside a {role} turn: {_snippet(body, stray.end())}", "stray_role_marker"
            )


def _cut_truncated_tail(turns: list[tuple[str, str, bool]], repairs: list[Repair] | None) -> None:
    """Cut an unterminated final assistant turn (the row was cut mid-reply: training on it would teach the model
    to stop mid-sentence) and the input turns left without a reply after the last complete one."""
    cut = []
    if turns and turns[-1][0] == "assistant" and not turns[-1][2]:
        cut.append(turns.pop())
    while turns and turns[-1][0] != "assistant":
        cut.append(turns.pop())
    if not cut:
        return
    had_assistant = any(role == "assistant" for role, _, _ in cut)
    if not turns and had_assistant:
        raise GlaiveFormatError(
            f"no complete ASSISTANT turn: the final turn lacks {END_OF_TURN}: {_snippet(cut[0][1], len(cut[0][1]))}",
            "truncated_final_turn",
        )
    if turns:
        last = cut[0]
        _note(repairs, "truncated_final_turn", f"cut {len(cut)} final turn(s), last {last[0]}: {_snippet(last[1])}")


def parse_chat(chat: str, repairs: list[Repair] | None = None, declared: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The chat's turns as messages. `declared`: the functions of the system prompt, whose calls written as
    Python (`f(x=1)`) are a call in another syntax too."""
    messages: list[dict[str, Any]] = []
    last_calls: list[str] = []
    turns = _turns(chat)
    _check_stray_roles(turns)
    _cut_truncated_tail(turns, repairs)
    _remove_stray_ends(turns, repairs)
    for role, text, _ in turns:
        if role == "user":
            if not text:
                raise GlaiveFormatError("empty USER turn", "empty_turn")
            messages.append({"role": "user", "content": text})
        elif role == "tool":
            if not last_calls:
                raise GlaiveFormatError(
                    f"FUNCTION RESPONSE without a preceding function call: {_snippet(text)}", "orphan_function_response"
                )
            messages.append({"role": "tool", "name": last_calls.pop(0), "content": text})
        else:
            message = _assistant_message(text, repairs, declared)
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant":
                if previous == message:
                    raise GlaiveFormatError("consecutive duplicate assistant turns", "duplicate_assistant_turns")
                if previous.get("tool_calls") or not message.get("tool_calls") or message["content"]:
                    raise GlaiveFormatError(
                        "consecutive assistant turns that are not prose followed by a call",
                        "consecutive_assistant_turns",
                    )
                # Prose, then a second `ASSISTANT: <functioncall>`: one message with text and call.
                previous["tool_calls"] = message["tool_calls"]
                _note(repairs, "merged_assistant_turns", f"prose then a call merged: {_snippet(previous['content'])}")
            elif not message["content"] and not message.get("tool_calls"):
                raise GlaiveFormatError("empty ASSISTANT turn", "empty_turn")
            else:
                messages.append(message)
            last_calls = [call["function"]["name"] for call in messages[-1].get("tool_calls", [])]
    if not any(m["role"] == "assistant" for m in messages):
        raise GlaiveFormatError("no ASSISTANT turn", "no_assistant_turn")
    return messages


def _assistant_message(text: str, repairs: list[Repair] | None, declared: Sequence[str] = ()) -> dict[str, Any]:
    prose, *calls = text.split(CALL_TAG)
    prose, foreign = read_foreign_calls(prose, repairs, declared, CALL_TAG)
    if foreign and calls:
        raise GlaiveFormatError(f"calls in two syntaxes, {CALL_TAG} and another: {_snippet(text)}", FOREIGN_CALL)
    message: dict[str, Any] = {"role": "assistant", "content": prose.strip()}
    if calls or foreign:
        message["tool_calls"] = foreign or [parse_call(call, repairs) for call in calls]
    return message


def _foreign_start(text: str, declared: Sequence[str]) -> re.Match[str] | None:
    """The first call written in another syntax in `text` (a tag, a bare call object, or a call of a declared
    function written as Python with keyword arguments), or None."""
    patterns = [_FOREIGN_TAG, _BARE_CALL]
    if declared:
        names = "|".join(re.escape(name) for name in sorted(declared, key=len, reverse=True))
        patterns.append(re.compile(rf"\[?\s*\b(?:{names})\s*\(\s*[A-Za-z_]\w*\s*="))
    found = [m for m in (p.search(text) for p in patterns) if m is not None]
    return min(found, key=lambda m: m.start()) if found else None


def read_foreign_calls(
    text: str, repairs: list[Repair] | None, declared: Sequence[str] = (), syntax: str = CALL_TAG
) -> tuple[str, list[dict[str, Any]]]:
    """Supervised text holding a call written in a syntax other than the format's own (`syntax`, named in
    messages): (the text before it, the calls read from it) when the rest of the text is nothing but such
    calls and each reads as one, a repair counted under foreign_call_syntax; (text, []) when there is none.
    Anything else (prose after the call, a call that does not read) drops the row under foreign_call_syntax:
    kept as text, it would teach the model to write a call no parser of this format reads."""
    start = _foreign_start(text, declared)
    if start is None:
        return text, []
    prose, tail = text[: start.start()].rstrip(), text[start.start() :].strip()
    try:
        calls = _read_tagged(tail, repairs) if _FOREIGN_TAG.match(tail) else None
        if calls is None:
            calls = _read_python(tail, declared) if not tail.startswith("{") else [parse_call(tail, repairs)]
    except GlaiveFormatError as exc:
        raise GlaiveFormatError(
            f"a call written as {start.group(0).strip()[:30]!r}, not as {syntax}, that does not read as "
            f"one ({exc}): {_snippet(tail)}",
            FOREIGN_CALL,
        ) from None
    _note(
        repairs, FOREIGN_CALL, f"a call written as {start.group(0).strip()[:30]!r} read as {syntax}: {_snippet(tail)}"
    )
    return prose, calls


def _read_tagged(tail: str, repairs: list[Repair] | None) -> list[dict[str, Any]]:
    """`<tag> call </tag>`, one or more, and nothing else; the closing tag may be left off the last."""
    calls, pos = [], 0
    while pos < len(tail):
        opening = _FOREIGN_TAG.match(tail, pos)
        if opening is None or "/" in opening.group(0):
            raise GlaiveFormatError(f"text beside the calls: {_snippet(tail, pos)}", "bad_call")
        closing = _FOREIGN_TAG.search(tail, opening.end())
        if closing is not None and "/" not in closing.group(0):
            raise GlaiveFormatError(f"a call tag opened twice: {_snippet(tail, closing.start())}", "bad_call")
        end = closing.start() if closing is not None else len(tail)
        calls.append(parse_call(tail[opening.end() : end], repairs))
        pos = closing.end() if closing is not None else len(tail)
        while pos < len(tail) and tail[pos].isspace():
            pos += 1
    return calls


def _read_python(tail: str, declared: Sequence[str]) -> list[dict[str, Any]]:
    """`f(a=1, b="x")`, or a list of such calls as BFCL writes them: keyword arguments with literal values."""
    try:
        tree = ast.parse(tail, mode="eval").body
    except SyntaxError:
        raise GlaiveFormatError("not a Python call", "bad_call") from None
    calls = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in declared):
            raise GlaiveFormatError("not a call of a declared function", "bad_call")
        if node.args or any(k.arg is None for k in node.keywords):
            raise GlaiveFormatError("positional arguments, whose names the call does not give", "bad_call")
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        except (ValueError, SyntaxError, TypeError, RecursionError):
            raise GlaiveFormatError("an argument that is not a literal", "bad_call") from None
        calls.append(_tool_call(node.func.id, json_value(arguments, from_literal=True)[0]))
    return calls


def _check_declared(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> None:
    """Every call names a function of the system prompt: a call to any other teaches the model to invent one."""
    declared = [tool["function"]["name"] for tool in tools]
    for message in messages:
        for call in message.get("tool_calls", []):
            name = call["function"]["name"]
            if name not in declared:
                listed = ", ".join(declared) if declared else "no functions"
                raise GlaiveFormatError(
                    f"call to {name!r}, which the system prompt does not declare (it declares {listed})",
                    "undeclared_function",
                )


def parse_row(row: Mapping[str, Any], repairs: list[Repair] | None = None) -> Conversation:
    """One Glaive row -> Conversation; raises GlaiveFormatError with the reason and its case. Repairs made to
    the row are appended to `repairs` when given."""
    system, chat = row.get("system"), row.get("chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise GlaiveFormatError("row lacks the string columns 'system' and 'chat'", "missing_columns")
    system_text, tools = parse_tools(system, repairs)
    messages = parse_chat(chat, repairs, [tool["function"]["name"] for tool in tools])
    _check_declared(messages, tools)
    if system_text:
        messages.insert(0, {"role": "system", "content": system_text})
    return Conversation(messages=messages, tools=tools)


Converter = Callable[[Mapping[str, Any], list[Repair]], Conversation]


def convert_rows(
    rows: Iterable[Mapping[str, Any]],
    convert: Converter,
    errors: tuple[type[BaseException], ...] = (GlaiveFormatError, RecursionError),
    locations: Sequence[str] | None = None,
) -> tuple[list[Conversation], ParseReport]:
    """Convert every row; a row raising one of `errors` is counted in the report under its case (the
    exception's `case`, else "unparsable") with its index, `locations[index]` (a source line) and reason, and
    the repairs of every converted row under theirs."""
    conversations: list[Conversation] = []
    report = ParseReport()
    for index, row in enumerate(rows):
        report.total += 1
        at = locations[index] if locations is not None else None
        repairs: list[Repair] = []
        try:
            conversations.append(convert(row, repairs))
        except errors as exc:
            report.add_failure(index, str(exc), getattr(exc, "case", "unparsable"), at)
            continue
        report.parsed += 1
        for repair in repairs:
            report.add_repair(index, repair, at)
    return conversations, report


def parse_rows(
    rows: Iterable[Mapping[str, Any]], locations: Sequence[str] | None = None
) -> tuple[list[Conversation], ParseReport]:
    """Parse every Glaive row; bad rows are counted in the report with their index and reason, never raised."""
    return convert_rows(rows, parse_row, locations=locations)
