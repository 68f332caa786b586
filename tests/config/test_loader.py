from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from gpucert.config.loader import ConfigError, apply_overrides, build, load_config, load_yaml
from gpucert.config.run import HealthConfig, RunConfig

HEALTH_KEYS = "command_timeout_s, expected_gpus, liveness, xid_window_h"
SAMPLE_KEYS = "anything, count, dims, either, inner, limits, maybe, mode, name, ratio, tags"
RUN_KEYS = "bench, health, localize, profile, runs_dir, runtime"


@dataclass(frozen=True)
class Inner:
    ratio: float = 1.0
    label: str | None = "x"


@dataclass(frozen=True)
class Sample:
    name: str
    count: int = 0
    ratio: float = 0.5
    maybe: int | None = 3
    tags: list[str] = field(default_factory=list)
    dims: tuple[int, ...] = ()
    limits: dict[str, float] = field(default_factory=dict)
    mode: Literal["fast", "slow"] = "fast"
    either: int | str = 0
    anything: Any = None
    inner: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class NeedsValue:
    value: int


@dataclass(frozen=True)
class Outer:
    needs: NeedsValue


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(func: Any, *args: Any) -> str:
    with pytest.raises(ConfigError) as info:
        func(*args)
    return str(info.value)


# build and coercion, on small dataclasses


def test_build_fills_defaults_for_absent_keys() -> None:
    assert build(Sample, {"name": "a"}, "s.yaml") == Sample(
        name="a", count=0, ratio=0.5, maybe=3, tags=[], dims=(), limits={}, mode="fast", either=0, inner=Inner()
    )


def test_build_coerces_every_supported_type() -> None:
    sample = build(
        Sample,
        {
            "name": "a",
            "count": 7,
            "ratio": 2,
            "maybe": None,
            "tags": ["x", "y"],
            "dims": [1, 2, 3],
            "limits": {"hbm": 3, 1: 2.5},
            "mode": "slow",
            "either": "text",
            "anything": {"free": ["form"]},
            "inner": {"ratio": 4, "label": None},
        },
        "s.yaml",
    )
    assert sample == Sample(
        name="a",
        count=7,
        ratio=2.0,
        maybe=None,
        tags=["x", "y"],
        dims=(1, 2, 3),
        limits={"hbm": 3.0, "1": 2.5},
        mode="slow",
        either="text",
        anything={"free": ["form"]},
        inner=Inner(ratio=4.0, label=None),
    )
    # Equality alone would pass 2 == 2.0 and a list for a tuple: the types are part of the contract.
    assert type(sample.ratio) is float
    assert type(sample.inner.ratio) is float
    assert type(sample.limits["hbm"]) is float
    assert type(sample.dims) is tuple
    assert type(sample.tags) is list


@pytest.mark.parametrize(("written", "read"), [("1e-3", 1e-3), ("2E5", 2e5), ("-1.5e-2", -0.015), (".5", 0.5)])
def test_a_float_written_with_an_exponent_and_no_dot_is_a_float(written: str, read: float) -> None:
    """PyYAML (YAML 1.1) reads 1e-3 as a string; `--set train.lr=1e-3` was refused as 'expected float'."""
    assert build(Sample, {"name": "a", "ratio": yaml.safe_load(written)}, "s.yaml").ratio == read
    for word in ("nan", "inf", "1e", "e3"):
        assert "expected float" in config_error(build, Sample, {"name": "a", "ratio": word}, "s.yaml")


def test_a_tuple_in_the_data_becomes_a_list_for_a_list_field() -> None:
    assert build(Sample, {"name": "a", "tags": ("x",)}, "s.yaml").tags == ["x"]


def test_union_takes_the_first_option_that_fits() -> None:
    assert build(Sample, {"name": "a", "either": 5}, "s.yaml").either == 5


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": True}, "s.yaml: count: expected int, found True"),
        ({"count": 1.5}, "s.yaml: count: expected int, found 1.5"),
        ({"ratio": False}, "s.yaml: ratio: expected float, found False"),
        ({"ratio": "fast"}, "s.yaml: ratio: expected float, found 'fast'"),
        ({"maybe": "x"}, "s.yaml: maybe: expected int, found 'x'"),
        ({"maybe": True}, "s.yaml: maybe: expected int, found True"),
        ({"tags": "x"}, "s.yaml: tags: expected a list, found 'x'"),
        ({"tags": ["x", 1]}, "s.yaml: tags[1]: expected str, found 1"),
        ({"dims": [1, "two"]}, "s.yaml: dims[1]: expected int, found 'two'"),
        ({"limits": [1]}, "s.yaml: limits: expected a mapping, found [1]"),
        ({"limits": {"hbm": "fast"}}, "s.yaml: limits.hbm: expected float, found 'fast'"),
        ({"mode": "medium"}, "s.yaml: mode: expected one of ['fast', 'slow'], found 'medium'"),
        ({"either": 1.5}, "s.yaml: either: expected int or str, found 1.5"),
        ({"inner": 3}, "s.yaml: inner: expected a mapping, found int"),
        ({"inner": {"ratio": "x"}}, "s.yaml: inner.ratio: expected float, found 'x'"),
        ({"inner": {"label": 5}}, "s.yaml: inner.label: expected str, found 5"),
        ({"bogus": 1}, "s.yaml: unknown key 'bogus'; expected one of: " + ", ".join(sorted(Sample.__annotations__))),
    ],
)
def test_build_rejects_wrong_values_naming_source_key_and_value(data: dict[str, Any], message: str) -> None:
    assert config_error(build, Sample, {"name": "a", **data}, "s.yaml") == message


def test_missing_required_key_is_named() -> None:
    assert config_error(build, Sample, {"count": 1}, "s.yaml") == "s.yaml: missing required key(s): name"


def test_missing_required_nested_key_is_named_with_its_section() -> None:
    assert config_error(build, Outer, {"needs": {}}, "o.yaml") == "o.yaml: missing required key(s): needs.value"
    assert config_error(build, Outer, {}, "o.yaml") == "o.yaml: missing required key(s): needs"


def test_build_rejects_a_non_mapping_at_the_top() -> None:
    assert config_error(build, Sample, ["name"], "s.yaml") == "s.yaml: top level: expected a mapping, found list"


# the real RunConfig, from YAML files


def test_yaml_file_fills_the_run_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "profile: h100-sxm\nruns_dir: /scratch/runs\nhealth:\n  expected_gpus: 8\n  liveness: false\n"
        "  xid_window_h: 12\n",
    )
    config = load_config(RunConfig, path)
    assert config == RunConfig(
        profile="h100-sxm",
        runs_dir="/scratch/runs",
        health=HealthConfig(expected_gpus=8, liveness=False, xid_window_h=12.0, command_timeout_s=20.0),
    )
    assert type(config.health.xid_window_h) is float


def test_null_is_accepted_for_an_optional_key(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: null\n")
    assert load_config(RunConfig, path).health.expected_gpus is None


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(RunConfig, write(tmp_path, "# nothing set\n")) == RunConfig()


def test_unknown_top_level_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "profil: h100-sxm\n")
    assert config_error(load_config, RunConfig, path) == f"{path}:1: unknown key 'profil'; expected one of: {RUN_KEYS}"


def test_unknown_nested_key_names_the_dotted_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: 8\n  bogus: 1\n")
    assert config_error(load_config, RunConfig, path) == (
        f"{path}:3: unknown key 'health.bogus'; expected one of: {HEALTH_KEYS}"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('health:\n  expected_gpus: "eight"\n', "2: health.expected_gpus: expected int, found 'eight'"),
        ("health:\n  expected_gpus: true\n", "2: health.expected_gpus: expected int, found True"),
        ("health:\n  liveness: 3\n", "2: health.liveness: expected bool, found 3"),
        ("health:\n  xid_window_h: [24]\n", "2: health.xid_window_h: expected float, found [24]"),
        ("health: 3\n", "1: health: expected a mapping, found int"),
        ("profile: 5\n", "1: profile: expected str, found 5"),
    ],
)
def test_wrong_type_in_file_names_file_key_and_value(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    assert config_error(load_config, RunConfig, path) == f"{path}:{message}"


def test_invalid_yaml_reports_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "profile: auto\nhealth:\n  expected_gpus: 4: 5\n")
    assert config_error(load_yaml, path) == (
        f"{path}: line 3, column 19 not valid YAML: mapping values are not allowed here"
    )


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "- profile: auto\n- health: {}\n")
    assert config_error(load_config, RunConfig, path) == (
        f"{path}: expected a mapping of keys at the top level, found list"
    )


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    assert config_error(load_config, RunConfig, path) == f"{path}: cannot read: No such file or directory"


# precedence: defaults < file < --set


def test_defaults_apply_without_file_or_overrides() -> None:
    config = load_config(RunConfig, None)
    assert config == RunConfig()
    assert config.health.expected_gpus is None
    assert config.health.liveness is True
    assert config.profile == "auto"


def test_file_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: 4\n")
    config = load_config(RunConfig, path)
    assert config.health.expected_gpus == 4
    assert config.health.liveness is True


def test_set_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: 4\n  liveness: false\n")
    config = load_config(RunConfig, path, ["health.expected_gpus=8"])
    assert config.health.expected_gpus == 8
    # Keys the --set did not name keep the file's values.
    assert config.health.liveness is False


def test_set_without_file_overrides_defaults() -> None:
    assert load_config(RunConfig, None, ["health.expected_gpus=8"]).health.expected_gpus == 8


def test_later_set_wins() -> None:
    config = load_config(RunConfig, None, ["health.expected_gpus=2", "health.expected_gpus=8"])
    assert config.health.expected_gpus == 8


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("health.liveness=false", RunConfig(health=HealthConfig(liveness=False))),
        ("health.expected_gpus=null", RunConfig(health=HealthConfig(expected_gpus=None))),
        ("health.xid_window_h=6", RunConfig(health=HealthConfig(xid_window_h=6.0))),
        ("runs_dir=/scratch/a=b", RunConfig(runs_dir="/scratch/a=b")),
        ("profile=h100-sxm", RunConfig(profile="h100-sxm")),
        ("health={expected_gpus: 2, liveness: no}", RunConfig(health=HealthConfig(expected_gpus=2, liveness=False))),
    ],
)
def test_set_values_are_parsed_as_yaml(override: str, expected: RunConfig) -> None:
    assert load_config(RunConfig, None, [override]) == expected


def test_set_with_unknown_key_names_the_set_argument(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: 4\n")
    assert config_error(load_config, RunConfig, path, ["health.bogus=1"]) == (
        f"--set health.bogus=1: unknown key 'health.bogus'; expected one of: {HEALTH_KEYS}"
    )
    assert config_error(load_config, RunConfig, None, ["profil=x"]) == (
        f"--set profil=x: unknown key 'profil'; expected one of: {RUN_KEYS}"
    )


def test_set_without_equals_is_rejected() -> None:
    assert config_error(load_config, RunConfig, None, ["health.liveness"]) == (
        "--set health.liveness: expected key.path=value"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("profile.name=x", "--set profile.name=x: profile has no sub-keys"),
        ("health.liveness.on=1", "--set health.liveness.on=1: health.liveness has no sub-keys"),
    ],
)
def test_set_path_into_a_value_is_rejected(override: str, message: str) -> None:
    assert config_error(load_config, RunConfig, None, [override]) == message


def test_set_into_a_section_the_raw_data_holds_as_a_value_is_rejected() -> None:
    assert config_error(apply_overrides, {"health": 3}, RunConfig, ["health.liveness=false"]) == (
        "--set health.liveness=false: health is a value, not a section"
    )


def test_set_value_that_is_not_yaml_is_rejected() -> None:
    message = config_error(load_config, RunConfig, None, ["health.expected_gpus=[1"])
    assert message.startswith("--set health.expected_gpus=[1: value is not valid YAML: ")
    assert "expected ',' or ']', but got '<stream end>'" in message


def test_wrong_type_from_set_names_that_set_argument(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: 4\n")
    assert config_error(load_config, RunConfig, path, ["health.expected_gpus=eight"]) == (
        "--set health.expected_gpus=eight: health.expected_gpus: expected int, found 'eight'"
    )
    overrides = ["health.expected_gpus=8", "health.liveness=3", "profile=h200"]
    assert config_error(load_config, RunConfig, None, overrides) == (
        "--set health.liveness=3: health.liveness: expected bool, found 3"
    )


def test_bad_file_value_is_blamed_on_the_file_even_when_set_would_replace_it(tmp_path: Path) -> None:
    path = write(tmp_path, "health:\n  expected_gpus: eight\n")
    assert config_error(load_config, RunConfig, path, ["health.expected_gpus=8"]) == (
        f"{path}:2: health.expected_gpus: expected int, found 'eight'"
    )


def test_apply_overrides_leaves_the_input_unchanged() -> None:
    data = {"health": {"expected_gpus": 4}}
    merged = apply_overrides(data, RunConfig, ["health.expected_gpus=8", "profile=h200"])
    assert merged == {"health": {"expected_gpus": 8}, "profile": "h200"}
    assert data == {"health": {"expected_gpus": 4}}


# Range errors: judged on the resolved config, said with the file or --set argument that set the value.


def run_config_error(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from gpucert.cli import main

    assert main(["health", "--profile", "cpu", "-o", str(tmp_path / "out"), *argv]) == 3
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err


def test_a_range_error_from_a_file_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("bench:\n  memory: {size_mib: 0}\n")
    err = run_config_error(tmp_path, ["--config", str(config)], capsys)
    assert f"gpucert: error: {config}:2: bench.memory.size_mib must be in 1..32768, found 0" in err


def test_a_range_error_from_a_set_names_the_set_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run_config_error(tmp_path, ["--set", "bench.memory={size_mib: 0}"], capsys)
    assert "error: --set bench.memory={size_mib: 0}: bench.memory.size_mib must be in 1..32768, found 0" in err


def test_two_keys_from_two_places_name_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("bench: {collectives: {min_bytes: 4096}}\n")
    argv = ["--config", str(config), "--set", "bench.collectives.max_bytes=1024"]
    err = run_config_error(tmp_path, argv, capsys)
    assert "bench.collectives.max_bytes must be >= bench.collectives.min_bytes (4096), found 1024" in err
    said = "bench.collectives.max_bytes from --set bench.collectives.max_bytes=1024, bench.collectives.min_bytes from "
    assert said + str(config) in err


def test_a_bad_key_in_a_file_is_named_with_its_line(tmp_path: Path) -> None:
    """`cfg.yaml:5: ...`, as compilers and linters say it, so an editor jumps there."""
    path = tmp_path / "cfg.yaml"
    path.write_text("name: a\ncount: 1\n\ninner:\n  ratio: fast\n")
    message = config_error(load_config, Sample, path)
    assert message == f"{path}:5: inner.ratio: expected float, found 'fast'", message
    path.write_text("name: a\n\nbogus: 1\n")
    assert config_error(load_config, Sample, path).startswith(f"{path}:3: unknown key 'bogus'")


def test_every_bad_key_of_a_file_is_named_at_once_in_file_order(tmp_path: Path) -> None:
    """Three mistakes, one run: each with its line, in the order an editor shows them, and a terminal gets a
    count and a line each."""
    path = tmp_path / "cfg.yaml"
    path.write_text("name: a\nbogus: 1\ncount: many\ninner:\n  ratio: fast\n")
    with pytest.raises(ConfigError) as caught:
        load_config(Sample, path)
    assert caught.value.problems == [
        f"{path}:2: unknown key 'bogus'; expected one of: {SAMPLE_KEYS}",
        f"{path}:3: count: expected int, found 'many'",
        f"{path}:5: inner.ratio: expected float, found 'fast'",
    ]
    assert str(caught.value) == "; ".join(caught.value.problems)  # one line for logs
    assert caught.value.said().splitlines() == ["3 problems:"] + [f"  {p}" for p in caught.value.problems]
    assert ConfigError("one thing").said() == "one thing"


def test_type_and_range_problems_of_a_file_come_in_its_line_order(tmp_path: Path) -> None:
    """Types and ranges are found in two passes: they were said types first, so line 16 came before line 13."""
    from gpucert.acceptance import RunRequest, load_run_config

    path = write(tmp_path, "runtime:\n  heartbeat_interval_s: x\n  rendezvous_timeout_s: 0\n  kill_grace_s: nope\n")
    request = RunRequest("health", [], path, ["localize.max_rounds=0"], None, None, [])
    with pytest.raises(ConfigError) as caught:
        load_run_config(request)
    assert [p.split(": ")[0] for p in caught.value.problems] == [
        f"{path}:2",
        f"{path}:3",
        f"{path}:4",
        "--set localize.max_rounds=0",
    ]


def test_every_bad_set_argument_is_named_at_once_beside_the_files_problems(tmp_path: Path) -> None:
    """`--set foo=1 --set bar=2 --set health.liveness=maybe` named only foo: three runs to find three mistakes."""
    path = write(tmp_path, "health: {command_timeout_s: soon}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(RunConfig, path, ["foo=1", "health.liveness=true", "health.liveness=maybe"])
    assert [p.split(":")[0] for p in caught.value.problems] == [str(path), "--set foo=1", "--set health.liveness=maybe"]


def test_a_binary_file_given_as_config_is_named(tmp_path: Path) -> None:
    """It said only "'utf-8' codec can't decode byte 0xa3 in position 0": no file named."""
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xa3\x00\xff binary")
    assert (
        config_error(load_yaml, path) == f"{path}: not UTF-8 text (byte 0xa3 at offset 0); a config is a YAML text file"
    )
