"""The version `fusedspec serve` runs, as a local directory that passed `registry.verify`.

    served = open_version(uri, settings, quick=False)   # ServedFiles: .files (the artifact), .report
    served.report.ok is False -> the server refuses to start (the CLI exits 1, listing the problems)

A directory (what a pod mounts, or a directory store) is used where it is: the version directory, its
attempt directory or a config directory (its LATEST). An s3:// version is synced first into
`<cache_dir>/serve/<key>/` in the layout of a pod's mount (manifest.json beside the attempt directory),
so the verify that follows is exactly the one the init container runs on a mount (always in full, even with
quick: the copy is local, and nothing else checked what arrived). A copy already there is reused when its
manifest is byte for byte the published one, and fetched again once when it no longer verifies; anything
else is replaced as a whole
(staged under `<key>.partial`, renamed into place), under a lock so two servers sharing a cache dir do
not download it twice. A cache that cannot be written (a file where its directory belongs, no permission, a
full disk) is a one-line error naming the path and what to do, and no half-copied version is left behind.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from fusedspec.compile.documents.manifest import MANIFEST, Manifest
from fusedspec.core.errors import ConfigError, StoreError
from fusedspec.core.files import disk_full, file_lock
from fusedspec.core.settings import Settings
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store
from fusedspec.registry.uri import join_key, parse_store_uri
from fusedspec.registry.verify import VerifyReport, resolve_version, verify_version


@dataclass(frozen=True)
class ServedFiles:
    """A verified (or refused) version on local disk."""

    version_dir: Path  # manifest.json and the attempt directory
    report: VerifyReport

    @property
    def manifest(self) -> Manifest:
        assert self.report.manifest is not None
        return self.report.manifest

    @property
    def files(self) -> Path:
        """The artifact directory: build.json, weights, programs, tokenizer."""
        return self.version_dir / self.manifest.attempt


def open_version(uri: str, settings: Settings, *, quick: bool = False) -> ServedFiles:
    """The version at `uri` on local disk and its verify report (check `report.ok`). StoreError when
    `uri` holds no version at all (a usage error, as for `fusedspec verify`)."""
    parsed = parse_store_uri(uri)
    if parsed.scheme != "s3":
        store, version, _manifest, _problems, _ = resolve_version(open_store(parsed, settings))
        assert store.uri.local_root is not None
        version_dir = store.uri.local_root / version if version else store.uri.local_root
        return ServedFiles(version_dir, verify_version(str(version_dir), settings, quick=quick))
    # A synced copy is always verified byte for byte: it is local, and nothing else checked what arrived.
    store = open_store(parsed, settings)
    version_dir, reused = sync_version(store, settings)
    report = verify_version(str(version_dir), settings)
    if not report.ok and reused:  # a cached copy damaged since: fetch it again, once
        version_dir, _ = sync_version(store, settings, fresh=True)
        report = verify_version(str(version_dir), settings)
    return ServedFiles(version_dir, report)


def sync_version(store: Store, settings: Settings, *, fresh: bool = False) -> tuple[Path, bool]:
    """Copy the version at the store's root (or its LATEST) to `<cache_dir>/serve/<key>`: (that directory,
    whether a copy already there was reused). Only the files the manifest lists are copied; verify then
    compares them with it. `fresh`: copy again even when the cached manifest is the published one."""
    store, version, manifest, problems, _ = resolve_version(store)
    if manifest is None:
        raise StoreError(f"{store.describe(version)}: cannot serve it: {'; '.join(problems)}")
    manifest_bytes = store.get(join_key(version, MANIFEST))
    cache = settings.cache_dir / "serve"
    local = cache / manifest.key
    size = sum(entry.size for entry in manifest.files.values())
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with file_lock(cache / f".{manifest.key}.lock"):
            if not fresh and _same_manifest(local, manifest_bytes):
                return local, True
            staging = cache / f"{manifest.key}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                for name in sorted(manifest.files):
                    _download(store, join_key(version, manifest.attempt, name), staging / manifest.attempt / name)
                (staging / MANIFEST).write_bytes(manifest_bytes)  # last: a copy without it is never reused
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)  # a half copy would hold the disk until the next sync
                raise
            shutil.rmtree(local, ignore_errors=True)
            staging.rename(local)
    except OSError as exc:
        full = disk_full(exc, cache, f"copying version {manifest.key[:12]} into the serve cache", size)
        if full is not None:
            raise full from None
        raise ConfigError(f"cannot use the serve cache {cache}: {exc.strerror or exc}"
                          f"{f' ({exc.filename})' if exc.filename else ''}; point FUSEDSPEC_WORK_DIR at a writable "
                          f"directory with {size / 2**20:.1f} MiB free") from None
    return local, False


def _same_manifest(local: Path, published: bytes) -> bool:
    path = local / MANIFEST
    return path.is_file() and path.read_bytes() == published


def _download(store: Store, key: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for chunk in store.iter_bytes(key):
            handle.write(chunk)
