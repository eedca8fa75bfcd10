"""The state of one version in a store, read without reading its bytes: manifest, listing, verdict.

    version_state(store, config_path, key) -> VersionState
        manifest        the parsed manifest.json (None: absent or unreadable)
        manifest_etag   its etag, for replacing a damaged version by compare-and-swap
        problems        why the version is not intact: a broken manifest, a file missing, of another size
                        or etag than the manifest records, an object in the attempt the manifest does not list

This is the check every re-run does before it decides "already published": a listing of the attempt
directory (one request per 1,000 objects), the sizes and etags compared with the manifest. An etag
changes whenever an object's bytes do (S3: the MD5 or multipart MD5; a directory store: the sha256),
so a file deleted, truncated or overwritten is found. `fusedspec verify` reads every byte besides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fusedspec.compile.documents.manifest import LATEST, MANIFEST, LatestPointer, Manifest
from fusedspec.core.errors import StoreError
from fusedspec.registry.store import NotFound, Store
from fusedspec.registry.uri import join_key

SPEC_DIR = re.compile(r"^tp\d+-seq\d+-k\d+-bs\d+-[A-Za-z0-9]+$")  # a BuildSpec.slug: a config's last segment


@dataclass
class VersionState:
    config_path: str
    key: str
    manifest: Manifest | None = None
    manifest_etag: str | None = None
    exists: bool = False  # a manifest object is there (parsable or not)
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.manifest is not None and not self.problems

    @property
    def version(self) -> str:
        return join_key(self.config_path, self.key)


def read_manifest(store: Store, version: str) -> tuple[Manifest | None, str | None, list[str]]:
    """(manifest, etag, problems) of the manifest at `version`; (None, None, []) when there is none."""
    key = join_key(version, MANIFEST)
    try:
        data, etag = store.get_with_etag(key)
    except NotFound:
        return None, None, []
    try:
        return Manifest.parse_bytes(data, store.describe(key)), etag, []
    except StoreError as exc:
        return None, etag, [str(exc)]


def version_state(store: Store, config_path: str, key: str) -> VersionState:
    state = VersionState(config_path=config_path, key=key)
    manifest, etag, problems = read_manifest(store, state.version)
    state.manifest, state.manifest_etag, state.exists = manifest, etag, etag is not None
    state.problems += problems
    if manifest is None:
        return state
    if manifest.key != key or manifest.config_path != config_path:
        state.problems.append(f"the manifest describes {manifest.config_path}/{manifest.key}, not "
                              f"{state.version}")
    state.problems += listing_problems(store, state.version, manifest)
    return state


def listing_problems(store: Store, version: str, manifest: Manifest) -> list[str]:
    """Files of the manifest missing from the attempt directory, or there with another size or etag, and
    objects there that the manifest does not list."""
    prefix = join_key(version, manifest.attempt)
    present = {info.key[len(prefix) + 1:]: info for info in store.list(prefix)}
    problems = []
    for name, entry in sorted(manifest.files.items()):
        info = present.get(name)
        if info is None:
            problems.append(f"{name}: missing from the store")
        elif info.size != entry.size:
            problems.append(f"{name}: size {info.size} bytes, the manifest says {entry.size}")
        elif _comparable(entry.etag, info.etag) and info.etag != entry.etag:
            problems.append(f"{name}: changed since it was published (etag {info.etag}, the manifest "
                            f"records {entry.etag})")
    problems += [f"{name}: in the version but not in its manifest"
                 for name in sorted(set(present) - set(manifest.files))]
    return problems


def location_problem(where: str, manifest: Manifest) -> str | None:
    """Why the manifest of the version directory `where` (a URI or path) describes a version of another
    place, or None. A signature stays valid when a version is copied, so a version of one config copied
    under another (and LATEST pointed at it) would otherwise pass for it. A directory named by the key
    alone under a directory that is no spec's (a pod's mount, /var/mdl/<key>) carries no config: only
    the key is compared there."""
    parts = where.rstrip("/").split("/")
    if parts[-1] != manifest.key:
        return f"manifest key {manifest.key!r} differs from the version directory {parts[-1]!r}"
    if len(parts) >= 2 and SPEC_DIR.match(parts[-2]) and parts[-4:-1] != manifest.config_path.split("/"):
        return (f"the manifest describes {manifest.config_path}/{manifest.key}, but it is under "
                f"{'/'.join(parts[-4:-1])}: a version copied from another config is not this config's")
    return None


def read_latest(store: Store, config_path: str) -> tuple[LatestPointer | None, str | None]:
    """LATEST of a config and its etag; (None, None) when absent. A broken one is StoreError."""
    key = join_key(config_path, LATEST)
    try:
        data, etag = store.get_with_etag(key)
    except NotFound:
        return None, None
    return LatestPointer.parse_bytes(data, store.describe(key)), etag


def unvalidated_latest(key: str, validated: bool) -> str | None:
    """Why LATEST may not name this version (None: it may). LATEST names validated versions only (publish
    moves it for those alone), so one naming a version published --unvalidated was edited by hand."""
    if validated:
        return None
    return (f"LATEST names {key}, a version that is not validated (published with --unvalidated): LATEST "
            "only ever names validated versions, so it was edited; publish a validated build of this config "
            "to move it, or give the version itself (…/SPEC/KEY)")


def _comparable(recorded: str | None, seen: str | None) -> bool:
    """Etags are the store's own: a directory's (`stat:...`) says nothing of an S3 object's (an MD5), as when
    a version published to S3 is checked through a mount of it. Then sizes are what a listing compares."""
    return (recorded is not None and seen is not None
            and recorded.startswith("stat:") == seen.startswith("stat:"))
