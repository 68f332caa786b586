"""The BFCL-compatible checker: whether one predicted call matches a reference, a call or BFCL's possible answer.

Pure functions of JSON values and a tool's parameters schema, after BFCL's AST checker (ShishirPatil/gorilla
`bfcl_eval/eval_checker/ast_eval/ast_checker.py`); docs/evaluation.md lists where we differ on purpose and why,
and tests/fixtures/finetune_eval/bfcl_cases.jsonl holds BFCL entries with BFCL's own verdicts, which
tests/finetune/test_evaluate.py checks we reproduce. gpucert.finetune.eval.evaluate scores whole turns with it.

- References. A reference call (a held-out `tool_calls` entry) accepts the values it gives. BFCL's possible answer
  (`possible_answer_calls`) lists, per parameter, the values it accepts, "" meaning it may be left out; an object
  parameter's keys list theirs the same way.
- Types are JSON Schema's, taken from the tool's schema where it gives one: an integer is accepted for a number
  (5 == 5.0), and 5.0 for an integer (JSON Schema counts a number with no fraction as an integer; BFCL's
  Python-typed check does not), at every depth; a bool is never a number; a number given as a string ("42")
  fails an integer or number parameter and passes a string one. Where the schema gives no type, the reference
  value's JSON type decides, with the same number rule.
- Strings match after lower-casing and removing spaces and `,./-_*^` (BFCL's `standardize_string`, which also
  reads ' as ").
- Lists are compared in order, as BFCL does: ["a", "b"] does not match ["b", "a"] even where the order carries no
  meaning (a set of ingredients), unless a possible answer lists both orders.
- Parameters, and the keys of objects at every depth: every required one must be present; one outside the schema
  fails; one the reference gives must be given, unless it is optional and the reference's value is the schema's
  `default` (a possible answer: unless its list holds ""); one the reference lacks fails, unless (a reference
  call only) it is optional and equals the schema's `default`. Without a schema for an object, the reference's
  keys are required and no others are allowed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# In a possible answer's list of accepted values, BFCL's mark for "may be left out".
OMITTED = ""
# BFCL's standardize_string: these characters and spaces are removed before strings are compared.
_STRING_NOISE_RE = re.compile(r"[ ,./\-_*^]")

# JSON Schema type names, and the Python-flavoured aliases seen in tool schemas (BFCL writes "float", "dict").
_TYPE_ALIASES = {
    "string": "string",
    "str": "string",
    "integer": "integer",
    "int": "integer",
    "number": "number",
    "float": "number",
    "double": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "object": "object",
    "dict": "object",
    "null": "null",
    "any": "any",
}


@dataclass(frozen=True)
class Call:
    """One function call. `arguments` is None when they did not decode to a JSON object; `raw_arguments` then
    keeps what was given, for the failure message.

    A reference call may instead list what it accepts (`possible_answer`): `arguments` then holds BFCL's
    possible-answer form, each parameter mapped to its accepted values, "" meaning "may be left out"
    (`possible_answer_calls` reads and checks it)."""

    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str | None = None
    possible_answer: bool = False


@dataclass(frozen=True)
class CallMatch:
    name_ok: bool
    args_valid_json: bool
    args_match: bool
    reasons: list[str]

    @property
    def ok(self) -> bool:
        return self.name_ok and self.args_match


def tool_schemas(tools: Iterable[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema, from OpenAI-style tools ({"type": "function", "function": ...})
    or bare function descriptions."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            schemas[fn["name"]] = dict(params) if isinstance(params, Mapping) else {}
    return schemas


def possible_answer_calls(ground_truth: Any, where: str = "possible answer") -> list[Call]:
    """Reference calls from BFCL's possible-answer form: a list of one-key objects {function: {parameter:
    [accepted values]}}. An object value's keys list their accepted values the same way (BFCL's dict_checker),
    and so do the objects inside a list value (list_dict_checker); deeper objects are plain values. A shape
    that cannot be read is a ValueError naming `where` and the parameter."""
    if not isinstance(ground_truth, list):
        raise ValueError(
            f"{where}: expected a list of {{function: {{parameter: [values]}}}}, found {show_json(ground_truth)}"
        )
    calls = []
    for n, item in enumerate(ground_truth):
        if not (isinstance(item, Mapping) and len(item) == 1):
            raise ValueError(
                f"{where}, call {n}: expected one {{function: {{parameter: [values]}}}}, found {show_json(item)}"
            )
        ((name, params),) = item.items()
        problems = _answer_shape_problems(params, name)
        if problems:
            raise ValueError(f"{where}, call {n}: " + "; ".join(problems))
        calls.append(Call(str(name), dict(params), possible_answer=True))
    return calls


def _answer_shape_problems(params: Any, path: str, nested: bool = False) -> list[str]:
    if not isinstance(params, Mapping):
        return [f"{path}: expected an object of parameter: [accepted values], found {show_json(params)}"]
    problems = []
    for key, values in params.items():
        at = f"{path}.{key}" if nested else f"{path}({key})"
        if not isinstance(values, list):
            problems.append(f"{at}: expected a list of accepted values, found {show_json(values)}")
        elif not nested:
            for value in values:
                items = value if isinstance(value, list) else [value]
                problems += [p for v in items if isinstance(v, Mapping) for p in _answer_shape_problems(v, at, True)]
    return problems


def compare_call(expected: Call, predicted: Call, schema: Mapping[str, Any] | None = None) -> CallMatch:
    """Compare one predicted call with the reference. `schema` is the function's parameters schema (an object
    schema with properties / required), or None to compare by the reference's keys and types alone.
    `args_match` judges the arguments alone; `ok` needs the name too."""
    reasons = []
    name_ok = expected.name == predicted.name
    if not name_ok:
        reasons.append(f"function: expected {expected.name}, found {predicted.name}")
    valid = predicted.arguments is not None
    if predicted.arguments is None:
        reasons.append(f"{predicted.name}: arguments are not a JSON object: {predicted.raw_arguments}")
        args_match = False
    elif expected.arguments is None:
        reasons.append(f"{expected.name}: the reference arguments are not a JSON object: {expected.raw_arguments}")
        args_match = False
    else:
        accepted = (
            _answer_keys(expected.arguments, schema)
            if expected.possible_answer
            else _reference_value(expected.arguments, schema)
        )
        problems = _compare_keys(accepted, predicted.arguments, schema, path="")
        reasons += [f"{expected.name}({where}): {what}" for where, what in problems]
        args_match = not problems
    return CallMatch(name_ok=name_ok, args_valid_json=valid, args_match=args_match, reasons=reasons)


Problem = tuple[str, str]  # (where, what)


@dataclass(frozen=True)
class Accepted:
    """What a reference accepts for one parameter, or one key of an object: any of `values` (as `_compare_value`
    reads them: objects as Keys), or nothing at all where `omissible`."""

    values: tuple[Any, ...]
    omissible: bool = False


@dataclass(frozen=True)
class Keys:
    """An object of a reference, key by key. `complete`: the keys are every one accepted (a possible answer
    lists them all); otherwise (a reference call, one example of a right answer) a key it lacks may still be
    given its schema default."""

    accepted: Mapping[str, Accepted]
    complete: bool


def _reference_value(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A reference call's value as `_compare_value` reads it: each object key accepts the one value given, and
    may be left out only where that value is the schema's default for an optional key (BFCL's possible answers
    list "" there and nowhere else)."""
    if isinstance(value, dict):
        props, required = _properties(schema), _required(schema)
        accepted = {}
        for key, item in value.items():
            sub = props.get(key) if props else None
            omissible = key not in required and _is_schema_default(item, sub)
            accepted[key] = Accepted((_reference_value(item, sub),), omissible)
        return Keys(accepted, complete=False)
    if isinstance(value, list):
        items = _items(schema)
        return [_reference_value(item, items) for item in value]
    return value


def _answer_keys(params: Mapping[str, Any], schema: Mapping[str, Any] | None) -> Keys:
    """A possible answer's parameters: each lists its accepted values; objects among them list theirs the same
    way, one level deep, and so do the objects inside a list (BFCL's dict_checker and list_dict_checker)."""
    props = _properties(schema)

    def alternative(value: Any, sub: Mapping[str, Any] | None) -> Any:
        if isinstance(value, dict):
            keys_props = _properties(sub)
            return Keys(
                {
                    key: _accepted(values, keys_props.get(key) if keys_props else None, _reference_value)
                    for key, values in value.items()
                },
                complete=True,
            )
        if isinstance(value, list):
            items = _items(sub)
            return [alternative(v, items) if isinstance(v, dict) else _reference_value(v, items) for v in value]
        return value

    return Keys(
        {key: _accepted(values, props.get(key) if props else None, alternative) for key, values in params.items()},
        complete=True,
    )


def _accepted(
    values: list[Any], schema: Mapping[str, Any] | None, read: Callable[[Any, Mapping[str, Any] | None], Any]
) -> Accepted:
    # "" stays among the values as well: BFCL's string check accepts a model's "" where "" is listed.
    return Accepted(tuple(read(v, schema) for v in values), omissible=OMITTED in values)


def _is_schema_default(value: Any, schema: Mapping[str, Any] | None) -> bool:
    if not (isinstance(schema, Mapping) and "default" in schema):
        return False
    return not _compare_value(_reference_value(schema["default"], schema), value, schema, "")


def _properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    props = schema.get("properties") if schema else None
    return props if isinstance(props, Mapping) else None


def _required(schema: Mapping[str, Any] | None) -> list[str]:
    required = schema.get("required") if schema else None
    return [k for k in required if isinstance(k, str)] if isinstance(required, list) else []


def _items(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    items = schema.get("items") if schema else None
    return items if isinstance(items, Mapping) else None


def _match_accepted(accepted: Accepted, predicted: Any, schema: Mapping[str, Any] | None, path: str) -> list[Problem]:
    """[] when `predicted` matches one of the accepted values; otherwise that value's problems, or with several
    values, one line listing them."""
    first: list[Problem] | None = None
    for value in accepted.values:
        problems = _compare_value(value, predicted, schema, path)
        if not problems:
            return []
        # The problems of the first value given (not the "" of "may be left out"), for a one-value answer.
        first = problems if first is None and value != OMITTED else first
    shown = [show_json(v) for v in accepted.values if v != OMITTED]
    if first is not None and len(shown) == 1:
        return first
    if not shown:
        return [(path, f"given {show_json(predicted)}, where the reference accepts only leaving it out")]
    return [(path, f"expected one of {', '.join(shown)}, found {show_json(predicted)}")]


def _compare_value(expected: Any, predicted: Any, schema: Mapping[str, Any] | None, path: str) -> list[Problem]:
    types = _schema_types(schema)
    if types is not None:
        if not any(_is_type(predicted, t) for t in types):
            return [
                (path, f"expected {' or '.join(sorted(types))}, found {_json_type(predicted)} {show_json(predicted)}")
            ]
    elif _kind(expected) != _kind(predicted):
        return [
            (
                path,
                f"expected {_json_type(expected)} {show_json(expected)}, "
                f"found {_json_type(predicted)} {show_json(predicted)}",
            )
        ]
    if isinstance(expected, Keys) and isinstance(predicted, dict):
        return _compare_keys(expected, predicted, schema, path)
    if isinstance(expected, list) and isinstance(predicted, list):
        if len(expected) != len(predicted):
            found = f"{len(predicted)} {show_json(predicted)}"
            return [(path, f"expected {len(expected)} items {show_json(expected)}, found {found}")]
        items = _items(schema)
        problems: list[Problem] = []
        for i, (e, p) in enumerate(zip(expected, predicted, strict=True)):
            problems += _compare_value(e, p, items, f"{path}[{i}]")
        return problems
    if _is_number(expected) and _is_number(predicted):
        equal = expected == predicted
    elif isinstance(expected, str) and isinstance(predicted, str):
        equal = _standardize(expected) == _standardize(predicted)
    else:
        equal = type(expected) is type(predicted) and expected == predicted
    return [] if equal else [(path, f"expected {show_json(expected)}, found {show_json(predicted)}")]


def _compare_keys(
    expected: Keys, predicted: Mapping[str, Any], schema: Mapping[str, Any] | None, path: str
) -> list[Problem]:
    """Every required key present; every key of the reference present unless it may be left out; no key
    outside the schema; no key outside the reference, except (for a reference call) one given its schema
    default; then each shared key's value against what the reference accepts for it."""

    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    props, required = _properties(schema), _required(schema)
    accepted = expected.accepted
    problems: list[Problem] = [(at(k), "required, missing") for k in required if k not in predicted]
    for key, acc in accepted.items():
        if key not in predicted and key not in required and not acc.omissible:
            shown = [show_json(v) for v in acc.values if v != OMITTED]
            problems.append((at(key), f"missing, expected {' or '.join(shown)}"))
    for key, value in predicted.items():
        if props is not None and key not in props:
            problems.append((at(key), "not a parameter in the schema"))
        elif key not in accepted:
            if props is None:
                problems.append((at(key), "not in the reference call"))
            elif expected.complete or key in required or not _is_schema_default(value, props[key]):
                problems.append((at(key), f"given {show_json(value)}, not in the reference call"))
    for key, acc in accepted.items():
        if key in predicted and (props is None or key in props):
            sub = props.get(key) if props is not None else None
            problems += _match_accepted(acc, predicted[key], sub if isinstance(sub, Mapping) else None, at(key))
    return problems


def _schema_types(schema: Mapping[str, Any] | None) -> set[str] | None:
    """The JSON types a schema allows; None when it says nothing usable (no type, or an unknown type name)."""
    raw = schema.get("type") if schema else None
    names = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    types = {_TYPE_ALIASES.get(str(n).lower()) for n in names}
    if not names or None in types or "any" in types:
        return None
    return {t for t in types if t is not None}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_type(value: Any, json_type: str) -> bool:
    if json_type == "integer":
        return _is_number(value) and float(value).is_integer()
    if json_type == "number":
        return _is_number(value)
    return _kind(value) == json_type


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict | Keys):
        return "object"
    return "null" if value is None else type(value).__name__


def _json_type(value: Any) -> str:
    return "integer" if isinstance(value, int) and not isinstance(value, bool) else _kind(value)


def show_json(value: Any) -> str:
    return json.dumps(_as_json(value), ensure_ascii=False)


def _as_json(value: Any) -> Any:
    """A reference value as JSON, for messages: a key accepting several values shows them as a list."""
    if isinstance(value, Keys):
        shown = {}
        for key, acc in value.accepted.items():
            values = [_as_json(v) for v in acc.values if v != OMITTED]
            shown[key] = values[0] if len(values) == 1 else values
        return shown
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def _standardize(text: str) -> str:
    return _STRING_NOISE_RE.sub("", text).lower().replace("'", '"')
