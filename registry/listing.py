"""List what a store holds: configs, their complete versions, and which one LATEST names.

Only versions with a manifest are listed: an interrupted publish is invisible here, as for every reader.
A manifest or LATEST that does not parse is listed among the config's `problems`, naming the file and the
field (no reader trusts it; `fusedspec verify` and a re-publish repair it), and so is a LATEST naming a
version published --unvalidated (no reader follows it). Works at any depth: a store
root, a config path or a single version directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fusedspec.compile.documents.manifest import LATEST, MANIFEST
from fusedspec.core.errors import StoreError
from fusedspec.core.settings import Settings
from fusedspec.registry.store import NotFound, Store
from fusedspec.registry.stores import open_store_root
from fusedspec.registry.uri import join_key
from fusedspec.registry.versions import read_latest, read_manifest, unvalidated_latest


@dataclass
class VersionEntry:
    key: str
    # versions of one graph key share their programs (None: published before graph keys)
    graph_key: str | None
    uri: str
    created_at: str | None
    files: int
    bytes: int
    validated: bool = True
    latest: bool = False


@dataclass
class ConfigEntry:
    path: str  # relative to the listed URI ("" when the URI is the config itself)
    latest: str | None
    versions: list[VersionEntry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # damaged manifests and LATEST, each naming its file


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] if "/" in key else ""


def _latest_key(store: Store, entry: ConfigEntry) -> str | None:
    try:
        latest, _ = read_latest(store, entry.path)
    except StoreError as exc:
        entry.problems.append(str(exc))
        return None
    return latest.key if latest is not None else None


def list_versions(uri: str, settings: Settings) -> list[ConfigEntry]:
    """Every config under `uri` with its complete versions, oldest first, LATEST marked."""
    store = open_store_root(uri, settings)
    configs: dict[str, ConfigEntry] = {}
    for info in store.list():
        if info.key.startswith(".") or info.key.rsplit("/", 1)[-1] != MANIFEST:
            continue  # bookkeeping (.blobs, .attempts, .claims) and the versions' files
        version = _parent(info.key)
        config = _parent(version)
        entry = configs.setdefault(config, ConfigEntry(config, None))
        try:
            manifest, _, problems = read_manifest(store, version)
        except NotFound:
            continue  # deleted since the listing
        if manifest is None:
            entry.problems += problems
            continue
        entry.versions.append(VersionEntry(key=manifest.key, graph_key=manifest.graph_key,
                                           uri=store.describe(version), created_at=manifest.created_at,
                                           files=len(manifest.files), bytes=manifest.total_bytes(),
                                           validated=manifest.validated))
    for entry in configs.values():
        entry.latest = _latest_key(store, entry)
        for listed in entry.versions:
            listed.latest = listed.key == entry.latest
            refused = unvalidated_latest(listed.key, listed.validated) if listed.latest else None
            if refused:
                entry.problems.append(f"{store.describe(join_key(entry.path, LATEST))}: {refused}")
        entry.versions.sort(key=lambda v: (v.created_at or "", v.key))
    return [configs[c] for c in sorted(configs)]


def listing_json(configs: list[ConfigEntry]) -> list[dict[str, Any]]:
    return [asdict(c) for c in configs]
