"""Publish one artifact directory as an immutable, crash-safe version in a store.

Layout under the store root (a bucket prefix or a directory):

    {target-slug}/{draft-slug}/{spec.slug}/{key}/...files...   one version per content key
    {target-slug}/{draft-slug}/{spec.slug}/{key}/manifest.json written last, create-only
    {target-slug}/{draft-slug}/{spec.slug}/LATEST              {"key": ...}, moved by compare-and-swap
    .blobs/<sha256>                                            content index: {"key": an object with it}

The protocol, in the order things happen:
1. Read build.json and hash every file; build and schema-check the manifest. Any bad input stops
   here, before the store is written to.
2. If the version's manifest already exists, send nothing (at most move LATEST, see 5).
3. For each file: skip it when the object there has the same size and sha256; else copy it inside the
   store from any object with the same sha256 (the content index); else upload it. Then HEAD it and
   check size and sha256, and record it in the content index.
4. Write manifest.json create-only (If-None-Match: *). Losing that race means another publisher
   finished the same version: both report it.
5. Move LATEST to this key by compare-and-swap (If-Match), unless LATEST already names it or named it
   before (its history), so an old version republished never pulls LATEST back.

A crash anywhere leaves either no manifest (the version does not exist for readers; the next run
skips what was uploaded and completes it) or a complete version.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from compile.backend import BUILD_DESCRIPTION, read_build_description
from compile.errors import ArtifactError, StoreError
from compile.settings import Settings
from compile.spec import BuildSpec
from registry.manifest import (
    LATEST,
    MANIFEST,
    SEGMENT,
    build_manifest,
    decode,
    encode,
    manifest_files,
    manifest_problems,
    model_slug,
)
from registry.store import NotFound, PreconditionFailed, Store, sha256_file
from registry.stores import open_store
from registry.uri import join_key

BLOBS = ".blobs"
LATEST_HISTORY = 50  # previous keys kept in LATEST, so a re-run of an old publish can tell it was superseded
CAS_ATTEMPTS = 50

Step = Callable[[str], None]  # test seam: called with the name of each point of the protocol


class PublishProgress(Protocol):
    """What a terminal progress display gets told (see flows/commands/publish.py for the rich one)."""

    def begin(self, total_bytes: int, files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def end(self) -> None: ...


@dataclass
class PublishResult:
    version_uri: str
    key: str
    config_path: str
    created: bool  # this call wrote the manifest
    latest_moved: bool  # this call moved LATEST
    bytes_sent: int  # request body bytes sent to the store by this call (files, manifest, pointers)
    files_uploaded: int = 0
    files_copied: int = 0  # server-side copies of identical content already in the store
    files_skipped: int = 0  # already in place with the same size and sha256
    differs: list[str] = field(default_factory=list)  # version existed: local files that differ from it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LocalFile:
    rel: str
    path: Path
    size: int
    sha256: str
    mtime_ns: int


def artifact_files(artifact_dir: Path) -> list[LocalFile]:
    """Every file of the artifact with its size and sha256 (hidden and temp files left out)."""
    found = []
    for dirpath, dirs, files in os.walk(artifact_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name.endswith(".tmp") or name == MANIFEST:
                continue
            path = Path(dirpath) / name
            if not path.is_file():
                raise ArtifactError(f"{path}: not a regular file; an artifact holds plain files only")
            stat = path.stat()
            rel = path.relative_to(artifact_dir).as_posix()
            found.append(LocalFile(rel, path, stat.st_size, sha256_file(path), stat.st_mtime_ns))
    return found


def _config_path(description: dict[str, Any]) -> str:
    spec = BuildSpec.from_json(description["spec"])
    parts = [model_slug(description["target"]), model_slug(description["draft"]), spec.slug]
    for part in [*parts, str(description["key"])]:
        if not SEGMENT.match(part):
            raise ArtifactError(f"{BUILD_DESCRIPTION}: {part!r} cannot be a store path segment "
                                "(letters, digits, '.', '_', '-'); rebuild the artifact")
    return join_key(*parts)


def publish_artifact(
    artifact_dir: Path,
    uri: str,
    settings: Settings,
    *,
    progress: PublishProgress | None = None,
    on_step: Step | None = None,
    store: Store | None = None,
) -> PublishResult:
    """Publish `artifact_dir` under `uri` (see the module docstring for the protocol).

    `store` may be passed already opened for `uri` (tests tune part sizes with it); `on_step` is
    called at named points ("hashed", "upload:<file>", "stored:<file>", "before-manifest",
    "before-latest", "done") so tests can stop the publisher at a chosen moment.
    """
    step = on_step or (lambda _name: None)
    artifact_dir = Path(artifact_dir)
    description = read_build_description(artifact_dir)
    config_path = _config_path(description)
    key = str(description["key"])
    version = join_key(config_path, key)
    files = artifact_files(artifact_dir)
    manifest = build_manifest(artifact_dir, description,
                              {f.rel: {"size": f.size, "sha256": f.sha256} for f in files},
                              config_path=config_path)
    problems = manifest_problems(manifest)
    if problems:
        raise ArtifactError(f"{artifact_dir}: cannot describe this artifact: {'; '.join(problems[:3])}")
    step("hashed")

    store = store or open_store(uri, settings)
    sent_before = store.bytes_sent
    result = PublishResult(version_uri=store.describe(version), key=key, config_path=config_path,
                           created=False, latest_moved=False, bytes_sent=0)
    existing = _read_manifest(store, version)
    if existing is None:
        _store_files(store, version, files, result, progress, step)
        step("before-manifest")
        result.created = store.create(join_key(version, MANIFEST), encode(manifest))
        existing = manifest if result.created else _read_manifest(store, version)
        assert existing is not None, "create-only write lost, yet no manifest is there"
    published = manifest_files(existing)
    result.differs = [f.rel for f in files if published.get(f.rel) != {"size": f.size, "sha256": f.sha256}]
    step("before-latest")
    result.latest_moved = move_latest(store, config_path, key)
    result.bytes_sent = store.bytes_sent - sent_before
    step("done")
    return result


def _read_manifest(store: Store, version: str) -> dict[str, Any] | None:
    try:
        data = store.get(join_key(version, MANIFEST))
    except NotFound:
        return None
    try:
        return decode(data, store.describe(join_key(version, MANIFEST)))
    except ValueError as exc:
        raise StoreError(f"{exc}: a broken manifest blocks this version; run `fusedspec verify` on it") from None


def _store_files(store: Store, version: str, files: list[LocalFile], result: PublishResult,
                 progress: PublishProgress | None, step: Step) -> None:
    if progress is not None:
        progress.begin(sum(f.size for f in files), len(files))
    advance = progress.advance if progress is not None else None
    try:
        for local in files:
            dest = join_key(version, local.rel)
            present = store.head(dest)
            if present is not None and present.size == local.size and present.sha256 == local.sha256:
                result.files_skipped += 1
                if advance:
                    advance(local.size)
                continue
            source = _find_blob(store, local)
            if source is not None:
                store.copy(source, dest, sha256=local.sha256)
                result.files_copied += 1
                if advance:
                    advance(local.size)
            else:
                step(f"upload:{local.rel}")
                store.put_file(dest, local.path, sha256=local.sha256, progress=advance)
                _check_unchanged(local)
                result.files_uploaded += 1
            _check_stored(store, dest, local)
            if source is None:
                pointer = {"key": dest, "size": local.size}
                store.put_bytes(join_key(BLOBS, local.sha256), encode(pointer))
            step(f"stored:{local.rel}")
    finally:
        if progress is not None:
            progress.end()


def _find_blob(store: Store, local: LocalFile) -> str | None:
    """A key in the store holding exactly `local`'s bytes (by recorded size and sha256), if any."""
    try:
        pointer = decode(store.get(join_key(BLOBS, local.sha256)), BLOBS)
    except (NotFound, ValueError):
        return None  # no pointer, or a broken one that the upload will overwrite
    source = pointer.get("key")
    if not isinstance(source, str):
        return None
    info = store.head(source)
    if info is None or info.size != local.size or info.sha256 != local.sha256:
        return None  # the pointed-to object was removed or replaced since
    return source


def _check_unchanged(local: LocalFile) -> None:
    stat = local.path.stat()
    if stat.st_size != local.size or stat.st_mtime_ns != local.mtime_ns:
        raise ArtifactError(f"{local.path} changed while it was being published; publish again when the "
                            "artifact is complete (nothing was made visible)")


def _check_stored(store: Store, dest: str, local: LocalFile) -> None:
    info = store.head(dest)
    if info is None or info.size != local.size or info.sha256 != local.sha256:
        seen = "nothing" if info is None else f"size {info.size}, sha256 {info.sha256}"
        raise StoreError(f"{store.describe(dest)}: after writing, the store reports {seen}; expected size "
                         f"{local.size}, sha256 {local.sha256}. Publish again (nothing was made visible)")


def move_latest(store: Store, config_path: str, key: str) -> bool:
    """Point `config_path`/LATEST at `key` by compare-and-swap. False when it already does or did.

    Only call this after the version's manifest exists: LATEST must always name a complete version.
    """
    pointer_key = join_key(config_path, LATEST)
    for _attempt in range(CAS_ATTEMPTS):
        try:
            data, etag = store.get_with_etag(pointer_key)
            try:
                current = decode(data, store.describe(pointer_key))
            except ValueError:
                current = {}  # a broken pointer is replaced, still by compare-and-swap
        except NotFound:
            current, etag = None, None
        history = [str(k) for k in (current or {}).get("history", []) if isinstance(k, str)]
        if current and (current.get("key") == key or key in history):
            return False
        if current and isinstance(current.get("key"), str):
            history = [current["key"], *history][:LATEST_HISTORY]
        document = {"key": key, "version": join_key(config_path, key), "history": history,
                    "updated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            store.swap(pointer_key, encode(document), expected_etag=etag)
            return True
        except PreconditionFailed:
            time.sleep(random.uniform(0.01, 0.1))  # another publisher moved it: re-read and decide again
    raise StoreError(f"{store.describe(pointer_key)}: could not move LATEST after {CAS_ATTEMPTS} attempts "
                     "(too many publishers at once); publish again")


def find_version(uri: str, settings: Settings, key: str, *, config_path: str | None = None) -> dict[str, Any] | None:
    """The manifest of the published version `key` under `uri`, or None when it is not (completely) there.

    With `config_path` ({target-slug}/{draft-slug}/{spec.slug}) one GET; without it, a listing.
    """
    store = open_store(uri, settings)
    if config_path is not None:
        return _read_manifest(store, join_key(config_path, key))
    for info in store.list():
        parts = info.key.split("/")
        if len(parts) == 5 and parts[3] == key and parts[4] == MANIFEST:
            return _read_manifest(store, "/".join(parts[:4]))
    return None
