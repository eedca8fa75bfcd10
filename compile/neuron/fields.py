"""The configuration field names NxDI accepts: stored per released version, or read from the NxDI installed
here.

NxDI's `NeuronConfig(**kwargs)` pops the names it knows and only logs the rest ("NeuronConfig init:
Unexpected keyword arguments", models/config.py of NxDI 0.6.0 and 0.9.0), so a misspelt or retired field is
silently dropped and the compiled artifact quietly differs from what was asked. Every name the translation
emits is therefore checked before NxDI sees it, against:
  - the lists stored in `neuron_config_fields.json` beside this file, one per config class per NxDI release
    (0.6 to 0.9, Neuron SDK 2.26 to 2.29, read from NxDI's GitHub with `read_nxdi_fields.py`): a name is
    emitted only when every stored version has it, so one translation serves the SDK 2.26 stack (the legacy
    vLLM fork that serves draft-model fused speculation) and every later SDK; and
  - on a host with NxDI installed, that NxDI's own `models/config.py`, read by the same reader from the
    installed distribution's files (parsed, never imported). NxDI's GitHub has no 0.10 source (SDK 2.30 to
    2.32 ship 0.10 wheels; `_version.py` at its HEAD 4bcdc54 says 0.9.0), so this is how 0.10 and later are
    checked and admitted.

    installed_nxdi(path=None)     the NxDI distribution installed here: version, fields read from its
                                  config.py
    check_nxdi_version(v, fields) the version gate for compile and load: a stored release, or a newer one
                                  read
    field_lists(installed)        every list the translation is checked against (stored + installed)
    version_warnings(installed)   what a dry run says instead of refusing
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from fusedspec.compile.neuron.read_nxdi_fields import read_fields
from fusedspec.core.errors import ConfigError

FIELDS_FILE = Path(__file__).with_name("neuron_config_fields.json")
CONFIG_CLASSES = ("NeuronConfig", "OnDeviceSamplingConfig", "FusedSpecNeuronConfig")
NXDI_DISTRIBUTION = "neuronx-distributed-inference"
NXDI_CONFIG_PY = "neuronx_distributed_inference/models/config.py"  # relative to the distribution's root
INSTALLED = "installed here"  # in place of an SDK version for the installed NxDI's own list


@cache
def field_table() -> dict[str, Any]:
    """The parsed data file: {"versions": {nxdi_version: {"neuron_sdk", "commit", <class>: [names]}}}."""
    data: dict[str, Any] = json.loads(FIELDS_FILE.read_text())
    return data


def supported_versions() -> dict[str, str]:
    """NxDI version -> Neuron SDK version, for every version the stored lists were read from."""
    return {v: info["neuron_sdk"] for v, info in field_table()["versions"].items()}


def accepted_fields(config_class: str = "NeuronConfig") -> frozenset[str]:
    """Names `config_class` accepts at every stored NxDI version."""
    if config_class not in CONFIG_CLASSES:
        raise ValueError(f"unknown NxDI config class {config_class!r}")
    per_version = [set(info[config_class]) for info in field_table()["versions"].values()]
    return frozenset(set.intersection(*per_version))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of an NxDI version. Wheels are numbered by build (`0.6.10598+a59fdc00` holds the 0.6.0
    sources of SDK 2.26, `0.10.18399+ed62453e` ships with SDK 2.31), so releases are compared on these two."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ConfigError(f"neuronx-distributed-inference version {version!r} is not "
                          "MAJOR.MINOR[.BUILD]") from None


# ---- the NxDI installed on this host -----------------------------------------------------------------------


@dataclass(frozen=True)
class InstalledNxdi:
    """The installed NxDI distribution, with the fields its own models/config.py accepts (None, with the
    reason in `problem`, when that file is absent or does not parse as NxDI's config module)."""

    version: str
    config_py: Path
    fields: dict[str, list[str]] | None
    problem: str | None = None


def installed_nxdi(path: Sequence[str] | None = None) -> InstalledNxdi | None:
    """The NxDI distribution on `path` (default sys.path), found by its metadata as pip installed it, or
    None."""
    found = (metadata.distributions(name=NXDI_DISTRIBUTION) if path is None
             else metadata.distributions(name=NXDI_DISTRIBUTION, path=list(path)))
    dist = next(iter(found), None)
    if dist is None:
        return None
    config_py = Path(str(dist.locate_file(NXDI_CONFIG_PY)))
    try:
        return InstalledNxdi(dist.version, config_py, read_fields(config_py.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        return InstalledNxdi(dist.version, config_py, None, f"{config_py}: {exc}")


def check_nxdi_version(installed: str, fields: dict[str, list[str]] | None = None) -> str:
    """The name of the field list `installed` is checked against, or ConfigError: the stored release of the
    same major.minor, or (given `fields`, read from the installed config.py) a release newer than every
    stored one. Older releases are refused: the translation follows NxDI 0.6's fused-speculation recipe."""
    have = release(installed)
    stored = supported_versions()
    for version in stored:
        if release(version) == have:
            return version
    oldest = min(map(release, stored))
    listed = ", ".join(f"{v} (SDK {s})" for v, s in stored.items())
    if have < oldest:
        raise ConfigError(f"neuronx-distributed-inference {installed} is installed; the neuron backend "
                          f"builds with NxDI {oldest[0]}.{oldest[1]} (SDK 2.26) or later ({listed} are "
                          "stored, newer ones are read from their own models/config.py): install a newer "
                          "Neuron SDK")
    if fields is None:
        raise ConfigError(f"neuronx-distributed-inference {installed} is newer than the stored field lists "
                          f"({listed}) and its own {NXDI_CONFIG_PY} could not be read, so the names NxDI "
                          "would silently drop cannot be checked; reinstall the package (its source file is "
                          "needed), or read it with `python -m fusedspec.compile.neuron.read_nxdi_fields` "
                          f"into compile/neuron/{FIELDS_FILE.name}")
    return installed


def field_lists(installed: InstalledNxdi | None = None) -> dict[str, dict[str, list[str]]]:
    """{version: {config class: names}}: every stored list, plus the installed NxDI's own when it was read."""
    lists = {v: {c: list(info[c]) for c in CONFIG_CLASSES} for v, info in field_table()["versions"].items()}
    if installed is not None and installed.fields is not None:
        lists[installed.version] = {c: list(installed.fields[c]) for c in CONFIG_CLASSES}
    return lists


def list_sources(installed: InstalledNxdi | None = None) -> dict[str, str]:
    """{version: the SDK it was stored from, or INSTALLED}, in the order of field_lists."""
    sources = dict(supported_versions())
    if installed is not None and installed.fields is not None:
        sources[installed.version] = INSTALLED
    return sources


def version_warnings(installed: InstalledNxdi | None) -> list[str]:
    """What a dry run on this host says about its NxDI where compile would refuse or go beyond the stored
    lists (a dry run plans; it refuses nothing for the host's version)."""
    if installed is None:
        return []
    try:
        check_nxdi_version(installed.version, installed.fields)
    except ConfigError as exc:
        return [f"a compile on this host would be refused: {exc}"]
    if release(installed.version) > max(map(release, supported_versions())):
        return [f"neuronx-distributed-inference {installed.version} installed here is newer than the stored "
                f"field lists (NxDI {', '.join(supported_versions())}); the names were also checked against "
                f"its own {installed.config_py}"]
    return []


def unknown_per_version(names: Iterable[str], config_class: str,
                        lists: dict[str, dict[str, list[str]]]) -> dict[str, list[str]]:
    """{NxDI version: the names of `names` that version's `config_class` would drop}; all empty when fine."""
    wanted = set(names)
    return {v: sorted(wanted - set(per_class[config_class])) for v, per_class in lists.items()}
