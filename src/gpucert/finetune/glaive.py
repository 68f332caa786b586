"""Parse Glaive function-calling v2 rows (`system`, `chat` strings) into OpenAI-style messages and tools.

The textual format and its quirks are described in docs (shared reference `fine-tuning.md` §5):
function objects pretty-printed in the system prompt, turns prefixed `USER: `, `ASSISTANT: ` and
`FUNCTION RESPONSE: `, assistant turns ending in ` <|endoftext|>`, and calls written as
`<functioncall> {"name": "...", "arguments": '{...}'}` with the arguments object single-quoted (not JSON).

A row that cannot be converted faithfully is counted with its reason, never raised and never half-converted.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Mapping
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
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS_OPEN = re.compile(r"""["']arguments["']\s*:\s*'""")
MAX_EXAMPLES = 10


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


@dataclass
class ParseReport:
    total: int = 0
    parsed: int = 0
    unparsable: int = 0
    # (row index, reason) of the first MAX_EXAMPLES unparsable rows.
    examples: list[tuple[int, str]] = field(default_factory=list)

    def add_failure(self, index: int, reason: str) -> None:
        self.unparsable += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((index, reason))


class GlaiveFormatError(ValueError):
    """A row that does not follow Glaive's textual format; the message is the reason counted in the report."""


def parse_tools(system: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a Glaive system prompt into the system message text and its function list (OpenAI tool entries)."""
    text = system.strip()
    if text.startswith(SYSTEM_PREFIX):
        text = text[len(SYSTEM_PREFIX) :]
    brace = text.find("{")
    if brace < 0:
        return text.strip(), []
    preamble, listing = text[:brace].strip(), text[brace:]
    decoder = json.JSONDecoder()
    tools: list[dict[str, Any]] = []
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
            raise GlaiveFormatError(f"function list: invalid JSON at character {pos}: {exc.msg}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise GlaiveFormatError("function list: an entry is not an object with a string 'name'")
        tools.append({"type": "function", "function": obj})
    # "... Use them if required -" introduces the listing, which now lives in `tools`.
    if preamble.endswith("-"):
        preamble = preamble[:-1].rstrip() + "."
    return preamble, tools


def parse_arguments(text: str) -> dict[str, Any]:
    """The arguments of a call as a dict: JSON first, then a Python literal (Glaive has True/None and
    single-quoted keys in places). A global quote swap would break on apostrophes inside values."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise GlaiveFormatError(f"arguments are neither JSON nor a Python literal: {text[:80]!r}") from None
    if isinstance(value, str):
        # Arguments given as a JSON string holding the object.
        return parse_arguments(value)
    if not isinstance(value, dict):
        raise GlaiveFormatError(f"arguments are a {type(value).__name__}, not an object")
    return value


def parse_call(text: str) -> dict[str, Any]:
    """`{"name": "f", "arguments": '{...}'}` (text after `<functioncall>`) -> an OpenAI tool call."""
    body = text.strip()
    try:
        whole = json.loads(body)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("name"), str):
        args = whole.get("arguments", {})
        arguments = parse_arguments(args) if isinstance(args, str) else args
        if not isinstance(arguments, dict):
            raise GlaiveFormatError("call arguments are not an object")
        return _tool_call(whole["name"], arguments)
    name = _NAME.search(body)
    if name is None:
        raise GlaiveFormatError(f"function call without a name: {body[:80]!r}")
    opening = _ARGS_OPEN.search(body)
    closing = body.rfind("'}")
    if opening is None or closing < opening.end():
        raise GlaiveFormatError(f"function call arguments not quoted as '...': {body[:80]!r}")
    if body[closing + 2 :].strip():
        raise GlaiveFormatError(f"text after the function call: {body[closing + 2 :][:40]!r}")
    return _tool_call(name.group(1), parse_arguments(body[opening.end() : closing]))


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def split_turns(chat: str) -> list[tuple[str, str]]:
    """`USER: ...\\n\\n\\nASSISTANT: ...` -> [(role, text)], with ` <|endoftext|>` stripped."""
    text = chat.strip()
    matches = list(_TURN_START.finditer(text))
    if not matches or matches[0].start() != 0:
        raise GlaiveFormatError("chat does not start with a USER/ASSISTANT/FUNCTION RESPONSE turn")
    turns = []
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        body = text[match.end() : end].replace(END_OF_TURN, "").strip()
        turns.append((ROLES[match.group(1)], body))
    return turns


def _assistant_message(text: str) -> dict[str, Any]:
    prose, *calls = text.split(CALL_TAG)
    message: dict[str, Any] = {"role": "assistant", "content": prose.strip()}
    if calls:
        message["tool_calls"] = [parse_call(call) for call in calls]
    return message


def parse_chat(chat: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    last_calls: list[str] = []
    for role, text in split_turns(chat):
        if role == "user":
            if not text:
                raise GlaiveFormatError("empty USER turn")
            messages.append({"role": "user", "content": text})
        elif role == "tool":
            if not last_calls:
                raise GlaiveFormatError("FUNCTION RESPONSE without a preceding function call")
            messages.append({"role": "tool", "name": last_calls.pop(0), "content": text})
        else:
            message = _assistant_message(text)
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant":
                if previous == message:
                    raise GlaiveFormatError("consecutive duplicate assistant turns")
                if previous.get("tool_calls") or not message.get("tool_calls") or message["content"]:
                    raise GlaiveFormatError("consecutive assistant turns that are not prose followed by a call")
                # Prose, then a second `ASSISTANT: <functioncall>`: one message with text and call.
                previous["tool_calls"] = message["tool_calls"]
            elif not message["content"] and not message.get("tool_calls"):
                raise GlaiveFormatError("empty ASSISTANT turn")
            else:
                messages.append(message)
            last_calls = [call["function"]["name"] for call in messages[-1].get("tool_calls", [])]
    if not any(m["role"] == "assistant" for m in messages):
        raise GlaiveFormatError("no ASSISTANT turn")
    return messages


def parse_row(row: Mapping[str, Any]) -> Conversation:
    """One Glaive row -> Conversation; raises GlaiveFormatError with the reason."""
    system, chat = row.get("system"), row.get("chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise GlaiveFormatError("row lacks the string columns 'system' and 'chat'")
    system_text, tools = parse_tools(system)
    messages = parse_chat(chat)
    if system_text:
        messages.insert(0, {"role": "system", "content": system_text})
    return Conversation(messages=messages, tools=tools)


def convert_rows(
    rows: Iterable[Mapping[str, Any]],
    convert: Callable[[Mapping[str, Any]], Conversation],
    errors: tuple[type[BaseException], ...] = (GlaiveFormatError, RecursionError),
) -> tuple[list[Conversation], ParseReport]:
    """Convert every row; a row raising one of `errors` is counted in the report with its index and reason."""
    conversations: list[Conversation] = []
    report = ParseReport()
    for index, row in enumerate(rows):
        report.total += 1
        try:
            conversations.append(convert(row))
        except errors as exc:
            report.add_failure(index, str(exc))
            continue
        report.parsed += 1
    return conversations, report


def parse_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Conversation], ParseReport]:
    """Parse every Glaive row; bad rows are counted in the report with their index and reason, never raised."""
    return convert_rows(rows, parse_row)
