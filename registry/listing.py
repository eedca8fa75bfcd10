"""List what a store holds: configs, their complete versions, and which one LATEST names.

Only versions with a manifest are listed: an interrupted publish is invisible here, as for every reader.
Works at any depth: a store root, a config path or a single version directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from compile.settings import Settings
from registry.manifest import LATEST, MANIFEST, decode, manifest_files
from registry.publish import BLOBS
from registry.store import NotFound, Store
from registry.stores import open_store
from registry.uri import join_key


@dataclass
class VersionEntry:
    key: str
    uri: str
    created_at: str | None
    files: int
    bytes: int
    latest: bool = False


@dataclass
class ConfigEntry:
    path: str  # relative to the listed URI ("" when the URI is the config itself)
    latest: str | None
    versions: list[VersionEntry] = field(default_factory=list)


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] if "/" in key else ""


def _latest_key(store: Store, config: str) -> str | None:
    try:
        pointer = decode(store.get(join_key(config, LATEST)), LATEST)
    except (NotFound, ValueError):
        return None
    return pointer.get("key") if isinstance(pointer.get("key"), str) else None


def list_versions(uri: str, settings: Settings) -> list[ConfigEntry]:
    """Every config under `uri` with its complete versions, oldest first, LATEST marked."""
    store = open_store(uri, settings)
    configs: dict[str, ConfigEntry] = {}
    for info in store.list():
        if info.key.startswith(f"{BLOBS}/"):
            continue
        name = info.key.rsplit("/", 1)[-1]
        if name == MANIFEST:
            version = _parent(info.key)
            config = _parent(version)
            entry = configs.setdefault(config, ConfigEntry(config, None))
            try:
                manifest = decode(store.get(info.key), store.describe(info.key))
            except (NotFound, ValueError):
                continue  # deleted since the listing, or broken: `fusedspec verify` says which
            files = manifest_files(manifest)
            entry.versions.append(VersionEntry(
                key=version.rsplit("/", 1)[-1] or str(manifest.get("key")), uri=store.describe(version),
                created_at=manifest.get("created_at"), files=len(files),
                bytes=sum(int(f.get("size", 0)) for f in files.values() if isinstance(f, dict))))
    for config, entry in configs.items():
        entry.latest = _latest_key(store, config)
        for listed in entry.versions:
            listed.latest = listed.key == entry.latest
        entry.versions.sort(key=lambda v: (v.created_at or "", v.key))
    return [configs[c] for c in sorted(configs)]


def listing_json(configs: list[ConfigEntry]) -> list[dict[str, Any]]:
    return [asdict(c) for c in configs]
