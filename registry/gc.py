"""Store garbage collection: what no reader can see and no live publisher owns, removed.

The URI must be a store root (where publishes write `{target}/{draft}/{spec}/{key}/...` and
`.attempts/`). For every version directory there (found by its manifest, its attempt directories, its
markers or its unfinished uploads): the attempts that the manifest does not name and whose publisher is
dead or unmarked (registry.attempts.sweep), with their multipart uploads and markers; of a committed
attempt whose publisher is gone, its marker and unfinished uploads. Then, anywhere in the store, temp files
of killed writers outside attempts (older than a lease, by the store's clock), and a directory store's
empty directories. Committed versions and live publishers' attempts are never touched, nor is a dead
attempt that holds a version (one nested there by hand: it is reported kept), and nothing that is not laid
out as a version with attempts is taken for one: given a bucket above the store root, or a config path
below it, gc finds no version there and says which URI is the root.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from fusedspec.compile.documents.build import KEY_PATTERN
from fusedspec.compile.documents.manifest import MANIFEST
from fusedspec.core.errors import StoreError
from fusedspec.core.settings import Settings
from fusedspec.registry.attempts import ATTEMPT_NAME, ATTEMPTS, LEASE_SECONDS, sweep, versions_inside
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store_root
from fusedspec.registry.uri import join_key
from fusedspec.registry.versions import read_manifest

VERSION_DEPTH = 4  # {target}/{draft}/{spec}/{key}
IS_KEY = re.compile(KEY_PATTERN)


@dataclass
class GcReport:
    uri: str
    attempts: list[str] = field(default_factory=list)  # {config}/{key}/{attempt}
    uploads: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # dead attempts left whole, each saying why
    directories: list[str] = field(default_factory=list)  # empty directories removed (a directory store)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _versions(keys: list[str]) -> set[str]:
    """{config}/{key} of every version an object key belongs to ({t}/{d}/{spec}/{key}/...)."""
    found = set()
    for key in keys:
        parts = key.split("/")
        if parts[0] == ATTEMPTS:
            parts = parts[1:]
        if (len(parts) > VERSION_DEPTH and IS_KEY.match(parts[3])
                and not any(p.startswith(".") for p in parts[:4])):
            found.add("/".join(parts[:VERSION_DEPTH]))
    return found


def _not_a_root(store: Store, keys: list[str]) -> StoreError | None:
    """The error to give when the URI holds versions but not at a store root's depth, else None."""
    depths = {key.count("/") + 1 for key in keys if key.rsplit("/", 1)[-1] == MANIFEST}
    if not depths or VERSION_DEPTH + 1 in depths:
        return None
    deeper = min(depths) - (VERSION_DEPTH + 1)
    where = (f"the store root is {deeper} level(s) below it (…/{'/'.join(['…'] * deeper)})" if deeper > 0
             else "it is inside a store: give the store root, the directory above the models' names")
    return StoreError(f"{store.describe()} is not a store root ({where}); gc needs the root, where the "
                      f"{ATTEMPTS}/ markers of publishers at work are, and removed nothing")


def collect_store(uri: str, settings: Settings, *, dry_run: bool = False) -> GcReport:
    store = open_store_root(uri, settings)
    report = GcReport(uri=store.describe())
    keys = [info.key for info in store.list()] + [upload.key for upload in store.list_uploads()]
    versions = _versions(keys)
    if not versions:
        problem = _not_a_root(store, keys)
        if problem is not None:
            raise problem
    now = store.now()
    for version in sorted(versions):
        config_path, key = version.rsplit("/", 1)

        def named(version: str = version) -> set[str]:
            manifest, _, _ = read_manifest(store, version)
            return {manifest.attempt} if manifest is not None else set()

        swept = sweep(store, config_path, key, named, now=now, dry_run=dry_run)
        for attempt in swept.kept:
            inside = ", ".join(versions_inside(store, join_key(version, attempt)))
            report.kept.append(f"{join_key(version, attempt)}: holds a version ({inside}); move it out of "
                               "the attempt, then gc removes the attempt")
        report.attempts += [join_key(version, a) for a in swept.removed]
        report.uploads += swept.uploads
        report.markers += swept.markers
    for upload in store.list_uploads():
        # A temp file outside every attempt (a small document's: LATEST, a pointer, a marker, a claim) lives
        # for a moment; one older than a lease is a killed writer's. In attempts, sweep decided.
        if not _in_an_attempt(upload.key) and upload.initiated + LEASE_SECONDS < now:
            if not dry_run:
                store.abort_upload(upload)
            report.uploads.append(upload.key)
    report.directories = store.remove_empty_dirs(dry_run=dry_run)
    return report


def _in_an_attempt(key: str) -> bool:
    parts = key.split("/")
    if parts[0] == ATTEMPTS:
        return False  # a marker's temp file: bookkeeping, not the attempt's files
    return len(parts) > VERSION_DEPTH + 1 and IS_KEY.match(parts[3]) is not None and \
        ATTEMPT_NAME.match(parts[VERSION_DEPTH]) is not None
