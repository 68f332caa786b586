"""Load a data source and convert its rows to Conversations, by format.

Formats (DataConfig.format):
- "glaive": `system` + `chat` strings of Glaive function-calling v2 (see glaive.py);
- "alpaca": `instruction`, optional `input`, `output`: one user turn and one assistant turn; the user turn
  carries the input after "### Input:", so the plain alpaca template (assets/alpaca.jinja) renders the classic
  "### Instruction: / ### Input: / ### Response:" prompt;
- "messages": OpenAI-style `messages` with optional `tools` (lists, or JSON strings as Arrow/Parquet stores them).

Sources (DataConfig.source): "sample" (the bundled Glaive-format file), a local .json/.jsonl/.parquet file, or a
hub dataset id, all read with `datasets`. Rows that cannot be converted are counted with their reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpucert.finetune.config import DataConfig
from gpucert.finetune.glaive import Conversation, GlaiveFormatError, ParseReport, convert_rows, parse_rows
from gpucert.finetune.sample_data import SAMPLE_PATH

FORMATS = ("glaive", "alpaca", "messages")
COLUMNS = {"glaive": ("system", "chat"), "alpaca": ("instruction", "output"), "messages": ("messages",)}
ROLES = ("system", "user", "assistant", "tool")
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
INPUT_HEADER = "\n\n### Input:\n"


class RowFormatError(ValueError):
    """A row that does not follow its format; the message is the reason counted in the report."""


def alpaca_to_conversation(row: Mapping[str, Any]) -> Conversation:
    instruction, extra, output = row.get("instruction"), row.get("input") or "", row.get("output")
    if not isinstance(instruction, str) or not instruction.strip():
        raise RowFormatError("'instruction' is missing or empty")
    if not isinstance(output, str) or not output.strip():
        raise RowFormatError("'output' is missing or empty")
    if not isinstance(extra, str):
        raise RowFormatError("'input' is not a string")
    prompt = instruction.strip() + (INPUT_HEADER + extra.strip() if extra.strip() else "")
    return Conversation(
        messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": output.strip()}]
    )


def _maybe_json(value: Any, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise RowFormatError(f"'{field}' is a string but not JSON") from None
    return value


def _drop_none(value: Any) -> Any:
    # Arrow gives every row the union of all rows' keys, filling the missing ones with None.
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _tool(entry: Any, i: int) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise RowFormatError(f"tools[{i}] is not an object")
    function = entry.get("function", entry) if entry.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowFormatError(f"tools[{i}] is not a function with a string 'name'")
    return {"type": "function", "function": _drop_none(function)}


def _tool_call(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise RowFormatError(f"{where} is not an object")
    function = entry.get("function", entry)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowFormatError(f"{where} has no function name")
    arguments = _maybe_json(function.get("arguments") or {}, f"{where}.arguments")
    if not isinstance(arguments, dict):
        raise RowFormatError(f"{where}.arguments is not an object")
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _message(entry: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(entry, dict):
        raise RowFormatError(f"{where} is not an object")
    role, content = entry.get("role"), entry.get("content")
    if role not in ROLES:
        raise RowFormatError(f"{where}.role is {role!r}, expected one of {', '.join(ROLES)}")
    message: dict[str, Any] = {"role": role}
    if role == "tool" and not isinstance(content, str) and content is not None:
        content = json.dumps(content, ensure_ascii=False)
    if role == "assistant" and content is None:
        content = ""
    if not isinstance(content, str):
        raise RowFormatError(f"{where}.content is not a string")
    message["content"] = content
    if role == "assistant":
        calls = _maybe_json(entry.get("tool_calls") or [], f"{where}.tool_calls")
        if not isinstance(calls, list):
            raise RowFormatError(f"{where}.tool_calls is not a list")
        if calls:
            message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if not content.strip() and not calls:
            raise RowFormatError(f"{where} is an assistant turn with neither text nor calls")
    if role == "tool" and isinstance(entry.get("name"), str):
        message["name"] = entry["name"]
    return message


def messages_to_conversation(row: Mapping[str, Any]) -> Conversation:
    messages = _maybe_json(row.get("messages"), "messages")
    if not isinstance(messages, list) or not messages:
        raise RowFormatError("'messages' is not a non-empty list")
    converted = [_message(m, i) for i, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in converted):
        raise RowFormatError("no assistant message")
    tools = _maybe_json(row.get("tools") or [], "tools")
    if not isinstance(tools, list):
        raise RowFormatError("'tools' is not a list")
    return Conversation(messages=converted, tools=[_tool(t, i) for i, t in enumerate(tools)])


def _convert_all(
    rows: Iterable[Mapping[str, Any]], convert: Callable[[Mapping[str, Any]], Conversation]
) -> tuple[list[Conversation], ParseReport]:
    return convert_rows(rows, convert, (RowFormatError, GlaiveFormatError))


def parse_alpaca_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Conversation], ParseReport]:
    return _convert_all(rows, alpaca_to_conversation)


def parse_messages_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Conversation], ParseReport]:
    return _convert_all(rows, messages_to_conversation)


def source_path(data_cfg: DataConfig) -> Path | None:
    """The local file behind data.source, or None for a hub dataset id."""
    if data_cfg.source == "sample":
        return SAMPLE_PATH
    path = Path(data_cfg.source)
    if path.suffix.lower() in LOCAL_BUILDERS or path.exists():
        return path
    return None


def load_rows(data_cfg: DataConfig) -> list[dict[str, Any]]:
    """The rows of data.source as dicts (the first data.max_rows of them when set)."""
    from datasets import load_dataset

    path = source_path(data_cfg)
    if path is None:
        dataset = load_dataset(data_cfg.source, split=data_cfg.split)
    else:
        if not path.exists():
            raise FileNotFoundError(
                f"data.source: file {path} not found; expected 'sample', a local .json/.jsonl/.parquet file "
                "or a hub dataset id"
            )
        builder = LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"data.source: {path} has suffix {path.suffix!r}; expected one of {', '.join(LOCAL_BUILDERS)}"
            )
        # datasets converts the file to Arrow in its cache: keep that beside the prepared data.
        cache = str(Path(data_cfg.cache_dir) / "hf-datasets")
        dataset = load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
    if data_cfg.max_rows is not None:
        dataset = dataset.select(range(min(data_cfg.max_rows, len(dataset))))
    return dataset.to_list()


def load_conversations(data_cfg: DataConfig) -> tuple[list[Conversation], ParseReport]:
    """Load data.source and convert it by data.format; bad rows are counted in the report, never raised."""
    if data_cfg.format not in FORMATS:
        raise ValueError(f"data.format: unknown format {data_cfg.format!r}; expected one of {', '.join(FORMATS)}")
    rows = load_rows(data_cfg)
    if rows:
        missing = [c for c in COLUMNS[data_cfg.format] if c not in rows[0]]
        if missing:
            raise ValueError(
                f"data.source {data_cfg.source!r} has columns {sorted(rows[0])}; format {data_cfg.format!r} "
                f"needs {', '.join(repr(c) for c in missing)}"
            )
    if data_cfg.format == "glaive":
        return parse_rows(rows)
    if data_cfg.format == "alpaca":
        return parse_alpaca_rows(rows)
    return parse_messages_rows(rows)
