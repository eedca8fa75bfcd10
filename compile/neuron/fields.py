"""The configuration field names NxDI accepts, kept in the repo with the versions they were read from.

NxDI's `NeuronConfig(**kwargs)` pops the names it knows and only logs the rest ("NeuronConfig init:
Unexpected keyword arguments", models/config.py of NxDI 0.6.0 and 0.9.0), so a misspelt field is silently
dropped and the compiled artifact quietly differs from what was asked. We check every name before NxDI
sees it. The list lives in `neuron_config_fields.json` beside this file, one list per config class per
NxDI version (0.6 to 0.9, Neuron SDK 2.26 to 2.29, read with `read_nxdi_fields.py`); a name is accepted only
when every supported version has it, so one translation serves the SDK 2.26 stack (the legacy vLLM fork that
serves draft-model fused speculation) and every later SDK.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from fusedspec.core.errors import ConfigError

FIELDS_FILE = Path(__file__).with_name("neuron_config_fields.json")
CONFIG_CLASSES = ("NeuronConfig", "OnDeviceSamplingConfig", "FusedSpecNeuronConfig")


@cache
def field_table() -> dict[str, Any]:
    """The parsed data file: {"versions": {nxdi_version: {"neuron_sdk", "commit", <class>: [names]}}}."""
    data: dict[str, Any] = json.loads(FIELDS_FILE.read_text())
    return data


def supported_versions() -> dict[str, str]:
    """NxDI version -> Neuron SDK version, for every version the field list was read from."""
    return {v: info["neuron_sdk"] for v, info in field_table()["versions"].items()}


def accepted_fields(config_class: str = "NeuronConfig") -> frozenset[str]:
    """Names `config_class` accepts at every supported NxDI version."""
    if config_class not in CONFIG_CLASSES:
        raise ValueError(f"unknown NxDI config class {config_class!r}")
    per_version = [set(info[config_class]) for info in field_table()["versions"].values()]
    return frozenset(set.intersection(*per_version))


def versions_with(name: str, config_class: str = "NeuronConfig") -> list[str]:
    """The supported NxDI versions whose `config_class` knows `name` (for error messages)."""
    return [v for v, info in field_table()["versions"].items() if name in info[config_class]]


def unknown_per_version(names: Iterable[str], config_class: str = "NeuronConfig") -> dict[str, list[str]]:
    """{NxDI version: the names of `names` that version's `config_class` would drop}; all empty when fine."""
    wanted = set(names)
    return {v: sorted(wanted - set(info[config_class])) for v, info in field_table()["versions"].items()}


def unknown_fields(names: Iterable[str], config_class: str = "NeuronConfig") -> list[str]:
    accepted = accepted_fields(config_class)
    return sorted(n for n in names if n not in accepted)


def field_problems(names: Iterable[str], config_class: str = "NeuronConfig", where: str = "") -> list[str]:
    """One sentence per name NxDI would drop (or that only some supported versions know)."""
    accepted = accepted_fields(config_class)
    problems = []
    label = f"{where}: " if where else ""
    for name in unknown_fields(names, config_class):
        known_in = versions_with(name, config_class)
        if known_in:
            problems.append(
                f"{label}{config_class} field {name!r} exists only in NxDI {', '.join(known_in)}; the supported "
                f"versions are {', '.join(supported_versions())}, and the others would silently ignore it"
            )
            continue
        close = difflib.get_close_matches(name, sorted(accepted), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(
            f"{label}{config_class} has no field {name!r}{hint}; NxDI would log and ignore it. "
            f"Accepted names are listed in {FIELDS_FILE.name}"
        )
    return problems


def check_fields(names: Iterable[str], config_class: str = "NeuronConfig", where: str = "") -> None:
    """Raise ConfigError naming every field of `names` that NxDI would not accept."""
    problems = field_problems(names, config_class, where)
    if problems:
        raise ConfigError("; ".join(problems))


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def check_nxdi_version(installed: str) -> str:
    """The supported NxDI version `installed` belongs to, or ConfigError. Wheels are numbered by build
    (`0.6.10598+...` for the 0.6.0 sources of SDK 2.26), so the release is matched on major.minor."""
    versions = supported_versions()
    for version in versions:
        if _minor(version) == _minor(installed):
            return version
    raise ConfigError(
        f"neuronx-distributed-inference {installed} is installed, but the NeuronConfig field list was read "
        f"from NxDI {', '.join(f'{v} (SDK {s})' for v, s in versions.items())}; read its models/config.py "
        f"and add that version to compile/neuron/{FIELDS_FILE.name}, or install a supported NxDI"
    )
