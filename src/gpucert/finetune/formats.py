"""Load a data source and convert its rows to Conversations, by format.

Formats (DataConfig.format):
- "glaive": `system` + `chat` strings of Glaive function-calling v2 (see glaive.py);
- "alpaca": `instruction`, optional `input`, `output`: one user turn and one assistant turn; the user turn
  carries the input after "### Input:", so the plain alpaca template (assets/alpaca.jinja) renders the classic
  "### Instruction: / ### Input: / ### Response:" prompt;
- "messages": OpenAI-style `messages` with optional `tools` (lists, or JSON strings as Arrow/Parquet stores them).

Sources (DataConfig.source): "sample" (the bundled Glaive-format file), a local .json/.jsonl file (JSON Lines,
or a JSON array of objects), a local .parquet file, or a hub dataset id (read with `datasets`). A line of a
local JSON file that is not a JSON object is skipped and counted with its file:line; above
data.max_bad_row_share of the lines, or with no rows at all, loading stops with a DataError (exit 3). Rows that
cannot be converted are counted with their reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucert.finetune.config import DataConfig
from gpucert.finetune.glaive import (
    FOREIGN_CALL,
    Conversation,
    Converter,
    GlaiveFormatError,
    ParseReport,
    Repair,
    convert_rows,
    json_value,
    parse_rows,
    read_foreign_calls,
)
from gpucert.finetune.sample_data import SAMPLE_PATH

FORMATS = ("glaive", "alpaca", "messages")
COLUMNS = {"glaive": ("system", "chat"), "alpaca": ("instruction", "output"), "messages": ("messages",)}
ROLES = ("system", "user", "assistant", "tool")
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
INPUT_HEADER = "\n\n### Input:\n"
# Bad lines named in a refusal and kept in the report.
BAD_LINE_EXAMPLES = 5

log = logging.getLogger(__name__)


class RowFormatError(ValueError):
    """A row that does not follow its format; the message is the reason counted in the report and `case` the
    data-quality case it is counted under."""

    def __init__(self, message: str, case: str = "invalid_row") -> None:
        super().__init__(message)
        self.case = case


class DataError(ValueError):
    """Data that cannot be prepared (an empty or unreadable file, too many bad lines, an empty split): refused
    before anything is cached, with the file, the counts and what to change (exit 3)."""


def alpaca_to_conversation(row: Mapping[str, Any], repairs: list[Repair] | None = None) -> Conversation:
    instruction, extra, output = row.get("instruction"), row.get("input") or "", row.get("output")
    if not isinstance(instruction, str) or not instruction.strip():
        raise RowFormatError("'instruction' is missing or empty", "missing_field")
    if not isinstance(output, str) or not output.strip():
        raise RowFormatError("'output' is missing or empty", "missing_field")
    if not isinstance(extra, str):
        raise RowFormatError("'input' is not a string", "bad_field")
    prompt = instruction.strip() + (INPUT_HEADER + extra.strip() if extra.strip() else "")
    _, calls = read_foreign_calls(output, None, (), "alpaca output")
    if calls:
        # Alpaca has no calls: a call written in its output would be trained as text.
        raise RowFormatError(
            f"'output' holds a function call, which alpaca rows cannot carry: {output[:80]!r}", FOREIGN_CALL
        )
    return Conversation(
        messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": output.strip()}]
    )


def _maybe_json(value: Any, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise RowFormatError(f"'{field}' is a string but not JSON", "bad_field") from None
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
        raise RowFormatError(f"tools[{i}] is not an object", "bad_tool")
    function = entry.get("function", entry) if entry.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowFormatError(f"tools[{i}] is not a function with a string 'name'", "bad_tool")
    return {"type": "function", "function": _drop_none(function)}


def _tool_call(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise RowFormatError(f"{where} is not an object", "bad_call")
    function = entry.get("function", entry)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RowFormatError(f"{where} has no function name", "bad_call")
    arguments = _maybe_json(function.get("arguments") or {}, f"{where}.arguments")
    if not isinstance(arguments, dict):
        raise RowFormatError(f"{where}.arguments is not an object", "bad_call")
    # The same rule as Glaive's: finite numbers only, or the model learns to write NaN inside <tool_call>.
    arguments, _ = json_value(arguments, from_literal=False)
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _message(entry: Any, i: int, repairs: list[Repair] | None, declared: list[str]) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(entry, dict):
        raise RowFormatError(f"{where} is not an object", "bad_message")
    role, content = entry.get("role"), entry.get("content")
    if role not in ROLES:
        raise RowFormatError(f"{where}.role is {role!r}, expected one of {', '.join(ROLES)}", "bad_message")
    message: dict[str, Any] = {"role": role}
    if role == "tool" and not isinstance(content, str) and content is not None:
        content = json.dumps(content, ensure_ascii=False)
    if role == "assistant" and content is None:
        content = ""
    if not isinstance(content, str):
        raise RowFormatError(f"{where}.content is not a string", "bad_message")
    message["content"] = content
    if role == "assistant":
        calls = _maybe_json(entry.get("tool_calls") or [], f"{where}.tool_calls")
        if not isinstance(calls, list):
            raise RowFormatError(f"{where}.tool_calls is not a list", "bad_call")
        # A call written in the content (`<tool_call>` text) is read into tool_calls, or drops the row.
        content, foreign = read_foreign_calls(content, repairs, declared, "tool_calls")
        if foreign and calls:
            raise RowFormatError(f"{where} has tool_calls and a call written in its content", FOREIGN_CALL)
        message["content"] = content
        calls = calls or foreign
        if calls:
            message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if not content.strip() and not calls:
            raise RowFormatError(f"{where} is an assistant turn with neither text nor calls", "empty_turn")
    if role == "tool" and isinstance(entry.get("name"), str):
        message["name"] = entry["name"]
    return message


def messages_to_conversation(row: Mapping[str, Any], repairs: list[Repair] | None = None) -> Conversation:
    messages = _maybe_json(row.get("messages"), "messages")
    if not isinstance(messages, list) or not messages:
        raise RowFormatError("'messages' is not a non-empty list", "missing_field")
    tools = _maybe_json(row.get("tools") or [], "tools")
    if not isinstance(tools, list):
        raise RowFormatError("'tools' is not a list", "bad_tool")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    declared = [t["function"]["name"] for t in checked]
    converted = [_message(m, i, repairs, declared) for i, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in converted):
        raise RowFormatError("no assistant message", "no_assistant_turn")
    return Conversation(messages=converted, tools=checked)


def _convert_all(
    rows: Iterable[Mapping[str, Any]], convert: Converter, locations: list[str] | None = None
) -> tuple[list[Conversation], ParseReport]:
    return convert_rows(rows, convert, (RowFormatError, GlaiveFormatError), locations)


def parse_alpaca_rows(
    rows: Iterable[Mapping[str, Any]], locations: list[str] | None = None
) -> tuple[list[Conversation], ParseReport]:
    return _convert_all(rows, alpaca_to_conversation, locations)


def parse_messages_rows(
    rows: Iterable[Mapping[str, Any]], locations: list[str] | None = None
) -> tuple[list[Conversation], ParseReport]:
    return _convert_all(rows, messages_to_conversation, locations)


@dataclass
class SourceRows:
    """The rows of a source, and what could not be read of it."""

    rows: list[dict[str, Any]]
    # Where each row came from ("rows.jsonl:18", "rows.json[17]"); None for a hub dataset or a Parquet file.
    locations: list[str] | None = None
    # Records read: rows and bad lines (blank lines are neither).
    lines: int = 0
    bad_lines: int = 0
    bad_line_examples: list[str] = field(default_factory=list)

    def add_bad(self, where: str, reason: str) -> None:
        self.lines += 1
        self.bad_lines += 1
        if len(self.bad_line_examples) < BAD_LINE_EXAMPLES:
            self.bad_line_examples.append(f"{where}: {reason}")

    def add_row(self, row: dict[str, Any], where: str) -> None:
        self.lines += 1
        self.rows.append(row)
        assert self.locations is not None
        self.locations.append(where)


def _bad_json(exc: json.JSONDecodeError, line: str) -> str:
    return f"{exc.msg} at column {exc.colno}: {line[:60]!r}"


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> DataError:
    # The decoder's offset is within the chunk it read: find the first bad byte of the whole file instead.
    data = path.read_bytes()
    start = 0
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as whole:
        start = whole.start
    line = data[:start].count(b"\n") + 1
    return DataError(
        f"data.source: {path} is not UTF-8 text (byte {start}, line {line}: {exc.reason}); save it as UTF-8 JSON Lines"
    )


def read_json_rows(path: Path, max_rows: int | None = None) -> SourceRows:
    """JSON Lines (one object per line), or for a .json file a JSON array of objects. A line (an array item)
    that is not a JSON object is counted as bad and skipped; blank lines are ignored."""
    source = SourceRows(rows=[], locations=[])
    with open(path, "rb") as f:
        array = path.suffix.lower() == ".json" and f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")
    try:
        if array:
            _read_array(path, source, max_rows)
        else:
            _read_lines(path, source, max_rows)
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None
    return source


def _read_array(path: Path, source: SourceRows, max_rows: int | None) -> None:
    try:
        items = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(
            f"data.source: {path} starts a JSON array but is not valid JSON (line {exc.lineno}, column "
            f"{exc.colno}: {exc.msg}); a .json source is a JSON array of objects or JSON Lines"
        ) from None
    for index, item in enumerate(items):
        if max_rows is not None and len(source.rows) >= max_rows:
            break
        where = f"{path.name}[{index}]"
        if isinstance(item, dict):
            source.add_row(item, where)
        else:
            source.add_bad(where, f"a {type(item).__name__}, not a JSON object")


def _read_lines(path: Path, source: SourceRows, max_rows: int | None) -> None:
    # newline="\n": a line ends at "\n" only, never at a U+2028 or a lone "\r" (invalid inside JSON strings
    # anyway); utf-8-sig drops a byte-order mark that would make the first line unreadable.
    with open(path, encoding="utf-8-sig", newline="\n") as f:
        for number, line in enumerate(f, 1):
            if max_rows is not None and len(source.rows) >= max_rows:
                break
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                source.add_bad(where, _bad_json(exc, line))
                continue
            if isinstance(obj, dict):
                source.add_row(obj, where)
            else:
                source.add_bad(where, f"a {type(obj).__name__}, not a JSON object: {line[:60]!r}")


def source_path(data_cfg: DataConfig) -> Path | None:
    """The local file behind data.source, or None for a hub dataset id."""
    if data_cfg.source == "sample":
        return SAMPLE_PATH
    path = Path(data_cfg.source)
    if path.suffix.lower() in LOCAL_BUILDERS or path.exists():
        return path
    return None


def read_source(data_cfg: DataConfig) -> SourceRows:
    """The rows of data.source (the first data.max_rows of them when set), with what could not be read."""
    from datasets import load_dataset

    path = source_path(data_cfg)
    if path is None:
        dataset = load_dataset(data_cfg.source, split=data_cfg.split)
        if data_cfg.max_rows is not None:
            dataset = dataset.select(range(min(data_cfg.max_rows, len(dataset))))
        rows = dataset.to_list()
        return SourceRows(rows=rows, lines=len(rows))
    if not path.exists():
        raise FileNotFoundError(
            f"data.source: file {path} not found; expected 'sample', a local .json/.jsonl/.parquet file "
            "or a hub dataset id"
        )
    builder = LOCAL_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"data.source: {path} has suffix {path.suffix!r}; expected one of {', '.join(LOCAL_BUILDERS)}")
    if builder == "json":
        return read_json_rows(path, data_cfg.max_rows)
    # datasets converts the file to Arrow in its cache: keep that beside the prepared data.
    cache = str(Path(data_cfg.cache_dir) / "hf-datasets")
    try:
        dataset = load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise DataError(
            f"data.source: {path} is not a readable Parquet file ({type(cause).__name__}: {cause}); "
            "check the file (pyarrow.parquet.read_table) or convert the data to JSON Lines"
        ) from exc
    if data_cfg.max_rows is not None:
        dataset = dataset.select(range(min(data_cfg.max_rows, len(dataset))))
    rows = dataset.to_list()
    return SourceRows(rows=rows, lines=len(rows))


def load_rows(data_cfg: DataConfig) -> list[dict[str, Any]]:
    """The rows of data.source as dicts (the first data.max_rows of them when set); bad lines skipped."""
    return read_source(data_cfg).rows


def judge_source(data_cfg: DataConfig, source: SourceRows) -> None:
    """Refuse a source with no rows, or with more unreadable lines than data.max_bad_row_share allows."""
    where = source_path(data_cfg) or data_cfg.source
    if source.lines == 0:
        raise DataError(
            f"data.source: {where} is empty: no rows; expected JSON Lines (one JSON object per line), a JSON "
            "array of objects, or Parquet"
        )
    share = source.bad_lines / source.lines
    if share > data_cfg.max_bad_row_share:
        raise DataError(
            f"data.source: {where}: {source.bad_lines} of {source.lines} lines ({share:.1%}) are not JSON objects, "
            f"above data.max_bad_row_share={data_cfg.max_bad_row_share}; first: "
            f"{'; '.join(source.bad_line_examples)}. Fix or delete those lines, or raise data.max_bad_row_share "
            "to skip them"
        )
    if source.bad_lines:
        log.warning(
            "data.source %s: skipped %d of %d lines that are not JSON objects (first: %s)",
            where,
            source.bad_lines,
            source.lines,
            source.bad_line_examples[0],
        )


def load_conversations(data_cfg: DataConfig) -> tuple[list[Conversation], ParseReport]:
    """Load data.source and convert it by data.format; bad rows are counted in the report, never raised. Bad
    lines are counted there too (report.bad_lines); too many of them, or no rows, raise a DataError."""
    if data_cfg.format not in FORMATS:
        raise ValueError(f"data.format: unknown format {data_cfg.format!r}; expected one of {', '.join(FORMATS)}")
    source = read_source(data_cfg)
    judge_source(data_cfg, source)
    rows = source.rows
    present = set().union(*(row.keys() for row in rows)) if rows else set()
    missing = [c for c in COLUMNS[data_cfg.format] if c not in present]
    if rows and missing:
        raise ValueError(
            f"data.source {data_cfg.source!r} has columns {sorted(present)}; format {data_cfg.format!r} "
            f"needs {', '.join(repr(c) for c in missing)}"
        )
    if data_cfg.format == "glaive":
        conversations, report = parse_rows(rows, source.locations)
    elif data_cfg.format == "alpaca":
        conversations, report = parse_alpaca_rows(rows, source.locations)
    else:
        conversations, report = parse_messages_rows(rows, source.locations)
    report.lines, report.bad_lines, report.bad_line_examples = source.lines, source.bad_lines, source.bad_line_examples
    return conversations, report
