"""Build typed dataclass trees from YAML mappings, strictly.

Precedence is dataclass defaults < YAML file < `--set key.path=value` overrides. Every error names the source
(file path or the `--set` argument) and the dotted key, and says what was expected, so a typo in a 200-line
config is found in one read.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config or profile that cannot be used as written.

    problems: each thing wrong, one line each, when there are several (a config file with three typos is told all
    three at once, as "; "-joined text); a plain message is one problem."""

    def __init__(self, message: str = "", problems: Sequence[str] = ()) -> None:
        self.problems = list(problems) or [message]
        super().__init__("; ".join(self.problems))

    def said(self) -> str:
        """For a terminal: one problem as its line, several as a count and a line each (one line for logs and
        node-problem-detector output is str())."""
        if len(self.problems) == 1:
            return self.problems[0]
        return f"{len(self.problems)} problems:" + "".join(f"\n  {problem}" for problem in self.problems)


def error_text(exc: BaseException) -> str:
    """An error as a terminal shows it: a ConfigError's problems a line each (ConfigError.said), any other as
    str()."""
    return exc.said() if isinstance(exc, ConfigError) else str(exc)


def describe_os_error(exc: OSError) -> str:
    """An OSError as one line that names the path it concerns: `[Errno 28] No space left on device: '/x'` reads
    `/x: No space left on device`; a message of our own (no errno) is kept as it is."""
    if exc.errno is None or not exc.strerror:
        return str(exc) or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{' -> '.join(paths)}: {exc.strerror}" if paths else f"{exc.strerror} (errno {exc.errno})"


def not_text(exc: UnicodeDecodeError) -> str:
    """A file read as text that is not UTF-8, said as such: the bare codec message names no file or line."""
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {not_text(exc)}; a config is a YAML text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, found {type(data).__name__}")
    return data


def build(cls: type[T], data: Mapping[str, Any], source: str, prefix: str = "", dropped: list[str] | None = None) -> T:
    """Make a `cls` from `data`, rejecting unknown keys and values of the wrong type.

    dropped: build anyway, each unknown or wrong key left at its default and its dotted name appended here (what
    `also_wrong` checks the ranges of); a missing required key still raises."""
    if not isinstance(data, Mapping):
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(f"{source}: {where}: expected a mapping, found {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    # Every problem of the mapping, not the first: a user fixing a config should not need one run per typo.
    # In the order the keys are written, as an editor shows them.
    problems: list[str] = []
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        if name not in fields:
            problems.append(f"{source}: unknown key '{prefix}{name}'; expected one of: {', '.join(sorted(fields))}")
            if dropped is not None:
                dropped.append(f"{prefix}{name}")
            continue
        try:
            tp = hints[name]
            if dropped is not None and dataclasses.is_dataclass(tp) and isinstance(tp, type):
                # A section: its good keys kept, its bad ones dropped one by one.
                kwargs[name] = build(tp, {} if value is None else value, source, f"{prefix}{name}.", dropped)
            else:
                kwargs[name] = _coerce(tp, value, source, f"{prefix}{name}")
        except ConfigError as exc:
            problems += exc.problems
            if dropped is not None:
                dropped.append(f"{prefix}{name}")
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        problems.append(f"{source}: missing required key(s): {', '.join(prefix + m for m in missing)}")
        dropped = None
    if problems and dropped is None:
        raise ConfigError(problems=problems)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors: list[ConfigError] = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, source, key)
            except ConfigError as exc:
                errors.append(exc)
        # One real option (X | None): its own message is the most precise; several: list what would do.
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{source}: {key}: expected {_describe(tp)}, found {value!r}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        # `health:` with nothing under it is YAML null: an empty section, all defaults.
        return build(tp, {} if value is None else value, source, f"{key}.")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{source}: {key}: expected one of {list(typing.get_args(tp))}, found {value!r}")
        return value
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{source}: {key}: expected a list, found {value!r}")
        item_tp = typing.get_args(tp)[0]
        items = [_coerce(item_tp, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {key}: expected a mapping, found {value!r}")
        value_tp = typing.get_args(tp)[1]
        return {str(k): _coerce(value_tp, v, source, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
        # YAML 1.1 (PyYAML) reads 1e-3 and 2E5, without a dot, as strings: every user writes a learning rate so.
        return float(value)
    # bool is an int subclass: `expected_gpus: true` must not pass as 1.
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{source}: {key}: expected {_describe(tp)}, found {value!r}")


# A number as YAML 1.2 and Python write it, exponent without a dot included (1e-3); not nan or inf spelt out.
_FLOAT_LITERAL = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def apply_overrides(data: dict[str, Any], cls: type, overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `key.path=value` strings (values parsed as YAML) on top of a raw config mapping."""
    merged = _deep_copy(data)
    for item in overrides:
        source = f"--set {item}"
        if "=" not in item:
            raise ConfigError(f"{source}: expected key.path=value")
        dotted, raw = item.split("=", 1)
        parts = dotted.strip().split(".")
        _check_key_path(cls, parts, source)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: value is not valid YAML: {exc}") from exc
        node = merged
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{source}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return merged


def _check_key_path(cls: type, parts: list[str], source: str) -> None:
    current: Any = cls
    for depth, part in enumerate(parts):
        if not (dataclasses.is_dataclass(current) and isinstance(current, type)):
            raise ConfigError(f"{source}: {'.'.join(parts[:depth])} has no sub-keys")
        names = {f.name for f in dataclasses.fields(current)}
        if part not in names:
            where = ".".join(parts[: depth + 1])
            raise ConfigError(f"{source}: unknown key {where!r}; expected one of: {', '.join(sorted(names))}")
        current = _unwrap_optional(typing.get_type_hints(current)[part])


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(
    cls: type[T], path: Path | None, overrides: Sequence[str] = (), base: Mapping[str, Any] | None = None
) -> T:
    """base (e.g. a profile's run_defaults) < file < overrides, each error naming where the bad value came from."""
    data = merge_mappings(base or {}, load_yaml(path) if path else {})
    problems: list[str] = []
    try:
        config = build(cls, data, str(path) if path else "defaults")
    except ConfigError as exc:
        problems += [with_line(problem, path) for problem in exc.problems]
    for item in overrides:
        # Each --set on its own (over the base alone), so a bad one is blamed on itself and every bad one is said
        # at once, beside the file's problems.
        try:
            build(cls, apply_overrides(dict(base or {}), cls, [item]), f"--set {item}")
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems=problems)
    for item in overrides:
        data = apply_overrides(data, cls, [item])
        config = build(cls, data, f"--set {item}")
    return config


@dataclasses.dataclass
class Salvaged(Generic[T]):
    """A config whose types were wrong, built over what was right (salvage)."""

    config: T
    used: list[str]  # the --set items that were right, applied
    dropped: list[str]  # the keys left at their defaults: wrong in the file, or set by a wrong --set


def salvage(
    cls: type[T], path: Path | None, overrides: Sequence[str], error: ConfigError, base: Mapping[str, Any] | None = None
) -> Salvaged[T] | None:
    """The config `error` (from load_config: wrong types) refused, built anyway: every wrong key at its default and
    every wrong --set left out. None where nothing can be built (a missing required key, a file unreadable as a
    whole: its own error stands alone)."""
    wrong_sets = [item for item in overrides if any(p.startswith(f"--set {item}: ") for p in error.problems)]
    used = [item for item in overrides if item not in wrong_sets]
    dropped: list[str] = [item.split("=", 1)[0].strip() for item in wrong_sets]
    try:
        data = merge_mappings(base or {}, load_yaml(path) if path else {})
        for item in used:
            data = apply_overrides(data, cls, [item])
        return Salvaged(build(cls, data, "", dropped=dropped), used, dropped)
    except ConfigError:
        return None


def also_wrong(
    salvaged: Salvaged[T] | None,
    problems_of: Callable[[T, Sequence[str]], list[str]],
    blame: Callable[[list[str], Sequence[str]], list[str]],
) -> list[str]:
    """The range problems of a salvaged config (`problems_of` it and the overrides it was built with, then `blame`d
    on where their values came from), said beside its type problems: `--set train.lr=abc --set train.max_steps=-1`
    is told both at once, not the type first and the range on the next run. A range problem that names a key left
    out is not said: its value was not the user's."""
    if salvaged is None:
        return []
    # Before blame adds where each value came from (a file named train.yaml would read as the key train).
    left_out = [re.compile(rf"(?<![\w.]){re.escape(key)}(?!\w)") for key in salvaged.dropped]
    found = problems_of(salvaged.config, salvaged.used)
    return blame([problem for problem in found if not any(k.search(problem) for k in left_out)], salvaged.used)


def in_file_order(problems: Sequence[str], path: Path | None) -> list[str]:
    """Problems placed in the file (`cfg.yaml:12: ...`) in the order of their lines, before the others (a bad
    --set, a profile's), which keep theirs: type problems and range problems are found in two passes, and a
    reader fixing the file goes down it once."""
    if path is None:
        return list(problems)
    placed = re.compile(rf"^{re.escape(str(path))}:(\d+): ")

    def line(problem: str) -> float:
        found = placed.match(problem)
        return int(found.group(1)) if found else math.inf

    return sorted(problems, key=line)


def said_by_every(lists: Sequence[Sequence[str]]) -> list[str]:
    """The problems every list says, in the first one's order: with the profile chosen later by each node's
    hardware, what is wrong under every profile a node may pick is certain now."""
    return [p for p in lists[0] if all(p in other for other in lists[1:])] if lists else []


# What build's messages say after the source: `key.path: expected ...` or `unknown key 'key.path'`.
_BUILD_KEY = re.compile(r"^(?:unknown key '([^']+)'|([\w.\[\]]+): )")


def with_line(message: str, path: Path | None) -> str:
    """build's `cfg.yaml: train.lr: expected float, found 'x'` as `cfg.yaml:12: train.lr: ...`, the line of the
    key in the file (for an editor's jump-to-line), where the key is in that file; else the message as it was."""
    if path is None or not message.startswith(f"{path}: "):
        return message
    rest = message[len(f"{path}: ") :]
    found = _BUILD_KEY.match(rest)
    if not found:
        return message
    key = re.sub(r"\[\d+\]", "", found.group(1) or found.group(2))
    line = key_line(path, key)
    return f"{path}:{line}: {rest}" if line else message


def key_line(path: Path, dotted: str) -> int | None:
    """The 1-based line where `dotted` (a.b.c) is written in the YAML file at `path`, or None."""
    try:
        node = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            return line
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if match is None:
            return line
        line, node = match[0].start_mark.line + 1, match[1]
    return line


# A dotted key as range messages name it (`bench.memory.size_mib must be in ...`).
_DOTTED_KEY = re.compile(r"\b[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+\b")


def _sets(data: Mapping[str, Any], key: str) -> bool:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def blame_sources(
    problems: Sequence[str],
    path: Path | None,
    overrides: Sequence[str],
    base_source: str = "the profile's run defaults",
    base: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    top_keys: Collection[str] = (),
) -> list[str]:
    """Each range problem (checked on the resolved config, which no longer says where a value came from) with the
    place that set the keys it names: the last of base < file < --set arguments to set each. `cfg.yaml:
    bench.memory.size_mib must be ...`; a problem of two keys set in two places names both.

    flags: an override -> what the user typed where a command-line flag made it (`resume="x"` -> `--resume x`).
    top_keys: keys without a section (finetune's `resume`); a problem names one as its first word."""
    # Each layer: a mapping as read, or the dotted key a --set names (`--set bench.memory={size_mib: 0}` sets
    # the keys under it too).
    layers: list[tuple[str, Mapping[str, Any] | str]] = [(base_source, base)] if base else []
    if path is not None:
        layers.append((str(path), load_yaml(path)))
    said = flags or {}
    layers += [(said.get(item) or f"--set {item}", item.split("=", 1)[0].strip()) for item in overrides]

    def sets(layer: Mapping[str, Any] | str, key: str) -> bool:
        return key == layer or key.startswith(f"{layer}.") if isinstance(layer, str) else _sets(layer, key)

    blamed = []
    for problem in problems:
        where: dict[str, str] = {}
        first = problem.split(" ", 1)[0]
        for key in dict.fromkeys(([first] if first in top_keys else []) + _DOTTED_KEY.findall(problem)):
            for source, layer in reversed(layers):
                if sets(layer, key):
                    where[key] = source
                    break
        places = list(dict.fromkeys(where.values()))
        if len(places) == 1 and path is not None and places[0] == str(path):
            # `cfg.yaml:12: train.lr must be ...`, at the first key it names, as build's type errors say it.
            line = key_line(path, next(iter(where)))
            blamed.append(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")
        elif len(places) == 1:
            blamed.append(f"{places[0]}: {problem}")
        elif places:
            blamed.append(f"{problem} ({', '.join(f'{key} from {source}' for key, source in where.items())})")
        else:
            blamed.append(problem)
    return blamed


def dotted(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves keyed by their dotted path (`train.lr`), lists and other values as they are."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def merge_mappings(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Nested mappings merged key by key; anything else in override replaces what base had."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_mappings(merged[key], value)
        else:
            merged[key] = value
    return merged
