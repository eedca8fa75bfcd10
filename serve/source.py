"""The version `fusedspec serve` runs: found, checked without reading it, then loaded with every byte hashed.

    served = open_version(uri, settings)       # ServedFiles: .report (ok? problems), .files once local
    loaded = load_served(served, settings)      # LoadedVersion: runner, text; VerificationError naming a file

1. open_version: the manifest, its signature (when a verify key is configured), and the store's listing of
   the files (registry.verify, quick: no byte read). A directory (what a pod mounts, or a directory store)
   is used where it is: the version directory, its attempt directory or a config directory (its LATEST).
   An s3:// version is checked in the store first (sizes, etags and the server's checksums: a tampered
   object is refused before a byte is downloaded), then synced into `<cache_dir>/serve/<key>/` in the
   layout of a pod's mount (manifest.json beside the attempt directory). A copy already there is reused
   when its manifest is byte for byte the published one; anything else is replaced as a whole (staged
   under `<key>.partial`, renamed into place), under a lock so two servers sharing a cache dir do not
   download it twice. A cache that cannot be written is a one-line error naming the path and what to do.
2. load_served: the backend loads the files through the manifest's LoadTrust (compile.trust): each file
   is hashed while it is read and must have the manifest's sha256; native code loads only from a version
   whose signature verified with the configured key. The tokenizer and the other small files are read
   once into a private directory, hashed on the way. Every file of the manifest is checked before the
   server is ready, by the only read serving needs. A reused cached copy that fails is fetched again once.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import get_backend
from fusedspec.compile.documents.manifest import MANIFEST, Manifest
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ConfigError, StoreError, VerificationError
from fusedspec.core.files import disk_full, file_lock
from fusedspec.core.settings import Settings
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store
from fusedspec.registry.trust import version_trust
from fusedspec.registry.uri import join_key, parse_store_uri
from fusedspec.registry.verify import VerifyReport, resolve_version, verify_version
from fusedspec.serve.text import ArtifactText


@dataclass(frozen=True)
class ServedFiles:
    """A checked (or refused) version: `version_dir` on local disk once `report.ok`."""

    version_dir: Path | None  # manifest.json and the attempt directory
    report: VerifyReport
    store: Store | None = None  # the S3 store it was synced from
    reused: bool = False  # the synced copy was already in the cache

    @property
    def manifest(self) -> Manifest:
        assert self.report.manifest is not None
        return self.report.manifest

    @property
    def files(self) -> Path:
        """The artifact directory: build.json, weights, programs, tokenizer."""
        assert self.version_dir is not None
        return self.version_dir / self.manifest.attempt


@dataclass
class LoadedVersion:
    runner: Any  # the backend's Runner
    text: ArtifactText
    trust: LoadTrust


def open_version(uri: str, settings: Settings) -> ServedFiles:
    """The version at `uri` checked without reading its bytes (check `report.ok`), local once it passed.
    StoreError when `uri` holds no version at all (a usage error, as for `fusedspec verify`)."""
    parsed = parse_store_uri(uri)
    if parsed.scheme != "s3":
        store, version, manifest, problems, via_latest = resolve_version(open_store(parsed, settings))
        assert store.uri.local_root is not None
        version_dir = store.uri.local_root / version if version else store.uri.local_root
        if manifest is None:  # nothing a reader may take: a broken or refused LATEST, an unreadable manifest
            return ServedFiles(version_dir, VerifyReport(uri=str(version_dir), ok=False, problems=problems,
                                                         via_latest=via_latest))
        return ServedFiles(version_dir, verify_version(str(version_dir), settings, quick=True))
    report = verify_version(uri, settings, quick=True)
    if not report.ok:
        return ServedFiles(None, report)
    store = open_store(report.uri, settings)  # the version checked, even if LATEST moves meanwhile
    version_dir, reused = sync_version(store, settings)
    return ServedFiles(version_dir, report, store, reused)


def load_served(served: ServedFiles, settings: Settings) -> LoadedVersion:
    """The runner and tokenizer of a checked version, every file hashed against the manifest as it loads;
    VerificationError naming the first file that differs (or native code nothing vouches for)."""
    try:
        return _load(served, settings)
    except VerificationError:
        if served.store is None or not served.reused:
            raise
    # a cached copy damaged since it was synced: fetch it again, once
    version_dir, _ = sync_version(served.store, settings, fresh=True)
    return _load(ServedFiles(version_dir, served.report, served.store, reused=False), settings)


def _load(served: ServedFiles, settings: Settings) -> LoadedVersion:
    trust = version_trust(served.report.uri, served.manifest, settings)
    runner = get_backend(served.manifest.backend).load(served.files, trust)
    small = sorted(name for name in served.manifest.files if "/" not in name)  # tokenizer, configs
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fusedspec-tokenizer-", dir=settings.tmp_dir) as private:
        for name in small:  # read once, checked, and the checked bytes are what the tokenizer loads
            (Path(private) / name).write_bytes(trust.read_bytes(served.files, name))
        text = ArtifactText(Path(private))
    for name in trust.unverified():  # whatever no loader read (none for a cpu version): hashed all the same
        trust.verify_file(served.files, name)
    return LoadedVersion(runner, text, trust)


def sync_version(store: Store, settings: Settings, *, fresh: bool = False) -> tuple[Path, bool]:
    """Copy the version at the store's root (or its LATEST) to `<cache_dir>/serve/<key>`: (that directory,
    whether a copy already there was reused). Only the files the manifest lists are copied; loading then
    hashes them against it. `fresh`: copy again even when the cached manifest is the published one."""
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
                    _download(store, join_key(version, manifest.attempt, name),
                              staging / manifest.attempt / name)
                (staging / MANIFEST).write_bytes(manifest_bytes)  # last: a copy without it is never reused
            except BaseException:
                # a half copy would hold the disk until the next sync
                shutil.rmtree(staging, ignore_errors=True)
                raise
            shutil.rmtree(local, ignore_errors=True)
            staging.rename(local)
    except OSError as exc:
        full = disk_full(exc, cache, f"copying version {manifest.key[:12]} into the serve cache", size)
        if full is not None:
            raise full from None
        raise ConfigError(f"cannot use the serve cache {cache}: {exc.strerror or exc}"
                          f"{f' ({exc.filename})' if exc.filename else ''}; point FUSEDSPEC_WORK_DIR at a "
                          f"writable directory with {size / 2**20:.1f} MiB free") from None
    return local, False


def _same_manifest(local: Path, published: bytes) -> bool:
    path = local / MANIFEST
    return path.is_file() and path.read_bytes() == published


def _download(store: Store, key: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for chunk in store.iter_bytes(key):
            handle.write(chunk)
