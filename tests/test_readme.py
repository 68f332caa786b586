"""The README and its reference pages cannot drift from the code.

- Every key a `yaml` config block of README.md or docs/configuration.md shows is a field of
  gpucert.config.run.RunConfig, with the default the block shows; a site-profile block loads as a profile.
- docs/results/README.md lists every file in docs/results/, so every figure has one place it is indexed.
- Every relative link of README.md and the pages it sends a newcomer to resolves.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert.config.profiles import load_profile
from gpucert.config.run import RunConfig

REPO = Path(__file__).resolve().parents[1]
CONFIG_PAGES = ["README.md", "docs/configuration.md"]
LINKED_PAGES = [
    "README.md",
    "docs/commands.md",
    "docs/configuration.md",
    "docs/finetune.md",
    "docs/results/README.md",
]


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```yaml block."""
    return [
        (text[: m.start()].count("\n") + 2, m.group(1))
        for m in re.finditer(r"^```ya?ml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    ]


def default_problems(shown: dict[str, Any], config: Any, prefix: str = "") -> list[str]:
    """Keys `shown` names that `config` (a dataclass instance) lacks, or whose default differs."""
    fields = {f.name for f in dataclasses.fields(config)}
    problems = []
    for key, value in shown.items():
        name = f"{prefix}{key}"
        if key not in fields:
            problems.append(f"{name}: no such key in {type(config).__name__}")
            continue
        actual = getattr(config, key)
        if dataclasses.is_dataclass(actual):
            if not isinstance(value, dict):
                problems.append(f"{name}: shown as {value!r}, but it is a section")
            else:
                problems += default_problems(value, actual, f"{name}.")
        elif value != actual:
            problems.append(f"{name}: shown as {value!r}, the default is {actual!r}")
    return problems


def block_problems(body: str, tmp_path: Path) -> tuple[str, list[str]]:
    """("run" or "profile", problems) of one yaml block; a block that is neither is a problem."""
    data = yaml.safe_load(body)
    if not isinstance(data, dict):
        return "", [f"not a mapping: {body[:60]!r}"]
    if "extends" in data:
        path = tmp_path / "site-profile.yaml"
        path.write_text(body, encoding="utf-8")
        try:
            load_profile(str(path))
        except Exception as exc:  # the loader's own message names the key
            return "profile", [f"site profile does not load: {exc}"]
        return "profile", []
    return "run", default_problems(data, RunConfig())


@pytest.mark.parametrize("page", CONFIG_PAGES)
def test_config_blocks_show_real_keys_and_defaults(page: str, tmp_path: Path) -> None:
    problems = []
    for line, body in yaml_blocks((REPO / page).read_text(encoding="utf-8")):
        _, found = block_problems(body, tmp_path)
        problems += [f"{page}:{line}: {p}" for p in found]
    assert not problems, "\n".join(problems)


def test_the_configuration_page_shows_the_run_config(tmp_path: Path) -> None:
    """The check above is not vacuous: docs/configuration.md has a RunConfig block covering every section."""
    blocks = yaml_blocks((REPO / "docs/configuration.md").read_text(encoding="utf-8"))
    run_blocks = [yaml.safe_load(body) for _, body in blocks if block_problems(body, tmp_path)[0] == "run"]
    assert run_blocks
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    assert sections <= set(run_blocks[0])


def test_a_drifted_default_or_key_is_named(tmp_path: Path) -> None:
    body = "runtime: {rendezvous_timeout_s: 121}\nbench:\n  matmul: {sweep_budgets: 60}\nhealth: 3\n"
    kind, problems = block_problems(body, tmp_path)
    assert kind == "run"
    assert problems == [
        "runtime.rendezvous_timeout_s: shown as 121, the default is 120.0",
        "bench.matmul.sweep_budgets: no such key in MatmulBenchConfig",
        "health: shown as 3, but it is a section",
    ]
    kind, problems = block_problems("extends: h100-sxm\nname: x\nnetwork: {ib_portz: 8}\n", tmp_path)
    assert kind == "profile" and len(problems) == 1 and "ib_portz" in problems[0]


def test_the_results_index_lists_every_result_file() -> None:
    index = (REPO / "docs/results/README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+)\)", index))
    missing = [
        p.name for p in sorted((REPO / "docs/results").iterdir()) if p.name != "README.md" and p.name not in linked
    ]
    assert not missing, f"docs/results/README.md does not list: {missing} (add each with what, hardware, date)"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_relative_links_resolve(page: str) -> None:
    text = (REPO / page).read_text(encoding="utf-8")
    base = (REPO / page).parent
    broken = [
        target
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)
        if "://" not in target and not (base / target).exists()
    ]
    assert not broken, f"{page}: links to nothing: {broken}"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_hardware_is_named_as_hardware(page: str) -> None:
    """Readers know machines by what they are, not by how the project got to use them."""
    text = (REPO / page).read_text(encoding="utf-8")
    found = re.findall(r"(?i)\blent\b|nvidia-h[12]00(?:-x\d)?\b|the seeds'", text)
    assert not found, f"{page}: {found}"
