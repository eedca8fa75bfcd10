"""Store garbage collection: what no reader can see and no live publisher owns, removed.

For every version directory in the store (found by its manifest, its attempt directories, its markers or
its unfinished uploads): the attempts that the manifest does not name and whose publisher is dead or
unmarked (registry.attempts.sweep), with their multipart uploads and markers. Committed versions and
live publishers' attempts are never touched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from compile.settings import Settings
from registry.attempts import ATTEMPTS, attempts_of, is_dead, sweep
from registry.stores import open_store
from registry.uri import join_key
from registry.versions import read_manifest


@dataclass
class GcReport:
    uri: str
    attempts: list[str] = field(default_factory=list)  # {config}/{key}/{attempt}
    uploads: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _versions(keys: list[str]) -> set[str]:
    """{config}/{key} of every version an object key belongs to ({t}/{d}/{spec}/{key}/...)."""
    found = set()
    for key in keys:
        parts = key.split("/")
        if parts[0] == ATTEMPTS:
            parts = parts[1:]
        if len(parts) >= 5 and not parts[0].startswith("."):
            found.add("/".join(parts[:4]))
    return found


def collect_store(uri: str, settings: Settings, *, dry_run: bool = False) -> GcReport:
    store = open_store(uri, settings)
    report = GcReport(uri=store.describe())
    keys = [info.key for info in store.list()] + [upload.key for upload in store.list_uploads()]
    for version in sorted(_versions(keys)):
        config_path, key = version.rsplit("/", 1)

        def named(version: str = version) -> set[str]:
            manifest, _, _ = read_manifest(store, version)
            return {manifest.attempt} if manifest is not None else set()

        if dry_run:
            candidates = attempts_of(store, config_path, key)
            keep = named()
            report.attempts += [join_key(version, a) for a, marker in sorted(candidates.items())
                                if a not in keep and (marker is None or is_dead(marker, _now()))]
            continue
        uploads_before = {u.key for u in store.list_uploads(version)}
        removed = sweep(store, config_path, key, named)
        report.attempts += [join_key(version, a) for a in removed]
        report.uploads += sorted(k for k in uploads_before if any(k.startswith(join_key(version, a) + "/")
                                                                  for a in removed))
    return report


def _now() -> float:
    import time

    return time.time()
