"""Network presets: named environments for NCCL and gloo, applied by every launcher and recorded in the report."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpucert.config.loader import ConfigError

# Set by launch: the report's environment section lists the presets the run was started with.
PRESETS_VARIABLE = "GPUCERT_NETWORK_PRESETS"


@dataclass(frozen=True)
class NetworkPreset:
    name: str
    description: str
    env: dict[str, str]


def available_presets() -> dict[str, NetworkPreset]:
    text = resources.files("gpucert.configs").joinpath("network-presets.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return {name: NetworkPreset(name, spec["description"], dict(spec["env"])) for name, spec in data.items()}


ALIASES = {"ib": "infiniband"}


def preset_env(names: list[str], iface: str | None) -> dict[str, str]:
    """The environment of presets applied in order, `{iface}` filled in; errors name what to pass instead."""
    known = available_presets()
    env: dict[str, str] = {}
    applied = []
    for raw in names:
        name = ALIASES.get(raw, raw)
        if name not in known:
            raise ConfigError(f"--preset {raw!r}: unknown; known: {', '.join([*known, *ALIASES])}")
        for key, value in known[name].env.items():
            if "{iface}" in value:
                if not iface:
                    raise ConfigError(f"--preset {name} needs --iface (the network interface NCCL and gloo use)")
                value = value.replace("{iface}", iface)
            env[key] = value
        applied.append(name)
    if applied:
        env[PRESETS_VARIABLE] = ",".join(applied)
    return env
