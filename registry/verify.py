"""Check a published version against its manifest, as a serving pod's init container does.

`verify_version(uri)` takes a version directory (…/{spec.slug}/{key}), its attempt directory
(…/{key}/{attempt}, which is what a pod mounts) or a config directory (…/{spec.slug}, meaning the version
its LATEST names; a LATEST naming a version published --unvalidated was edited, and is refused). In order:
- the manifest parses, and it is signed by the configured verify key (when one is configured);
- it describes this place: the directory is named by its key and, in a store's layout, lies under the
  config path the manifest records (a signature survives a copy of the version under another config);
- the attempt directory's listing: every file there with the size and etag the manifest records, and
  nothing else (registry.versions);
- `quick`, on S3: each object's server-computed checksum (HEAD, no byte read) against the one the manifest
  recorded at commit (or, for a manifest that recorded none, the full-object checksum its sha256 gives): an
  object overwritten with other bytes of the same size is found, through the S3 API, in one request per
  file. A directory (a pod's mount) has no store checksum: its quick check is sizes only;
- unless `quick`: every file read back and its sha256 compared with the manifest (a 65 GB Qwen3-32B
  version takes minutes; the listing takes one request per 1,000 files);
- with `mount` (the directory a pod mounts the version at): that directory holds this very manifest and
  the files it lists, with their sizes (the pod reads the mount; the checksums are the store's);
- with `runtime_check`: the manifest's backend says whether this host can serve the recorded toolchain.
It never writes to the store.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusedspec.compile.documents.build import BUILD_DESCRIPTION
from fusedspec.compile.documents.manifest import LATEST, MANIFEST, FileEntry, Manifest
from fusedspec.core.errors import StoreError, UnreadableObject
from fusedspec.core.settings import Settings
from fusedspec.registry.attempts import ATTEMPT_NAME
from fusedspec.registry.signing import load_verify_key, signature_problem
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store
from fusedspec.registry.uri import join_key
from fusedspec.registry.versions import (
    listing_problems,
    location_problem,
    read_latest,
    read_manifest,
    unvalidated_latest,
)

HASH_WORKERS = 4


@dataclass
class VerifyReport:
    uri: str  # the version that was checked
    ok: bool
    problems: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    files_checked: int = 0
    bytes_checked: int = 0  # bytes read back and hashed (0 for a quick check)
    via_latest: bool = False
    quick: bool = False
    signer: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "uri": self.uri, "key": self.manifest.key if self.manifest else None,
                "attempt": self.manifest.attempt if self.manifest else None, "via_latest": self.via_latest,
                "quick": self.quick, "sha256_checked": not self.quick, "signer": self.signer,
                "files_checked": self.files_checked,
                "bytes_checked": self.bytes_checked, "problems": self.problems}


def resolve_version(store: Store) -> tuple[Store, str, Manifest | None, list[str], bool]:
    """Find the version at the store root: (store, version key prefix, manifest or None, problems, via
    LATEST). The store returned is the given one, or its parent when the root is an attempt directory.
    Raises StoreError when the root is none of the three (a usage error)."""
    manifest, _, problems = read_manifest(store, "")
    if manifest is not None or problems:
        return store, "", manifest, problems, False
    try:
        latest, _ = read_latest(store, "")
    except StoreError as exc:  # a damaged pointer is a failed check, like a damaged manifest
        return store, "", None, [str(exc)], True
    if latest is not None:
        manifest, _, problems = read_manifest(store, latest.key)
        if manifest is None and not problems:
            problems = [f"LATEST names {latest.key!r}, which has no {MANIFEST}"]
        refused = unvalidated_latest(latest.key, manifest.validated) if manifest is not None else None
        if refused:  # no reader takes it through LATEST: no version at all, as for a broken pointer
            return store, latest.key, None, [refused], True
        return store, latest.key, manifest, problems, True
    name = store.describe().rstrip("/").rsplit("/", 1)[-1]
    if ATTEMPT_NAME.match(name):  # an attempt directory: its version's manifest is one level up
        parent = store.parent()
        manifest, _, problems = read_manifest(parent, "")
        if manifest is not None and manifest.attempt != name:
            problems = [f"{name} is not the attempt this version's manifest names ({manifest.attempt}): it "
                        "is debris of a publisher, or a version that was replaced"]
            manifest = None
        if manifest is not None or problems:
            return parent, "", manifest, problems, False
    if store.head(BUILD_DESCRIPTION) is not None or store.list():
        return store, "", None, [f"no {MANIFEST} at {store.describe()}: this version is incomplete (an "
                                 "interrupted publish) and does not exist for readers; publish the artifact "
                                 "again"], False
    raise StoreError(f"nothing to verify at {store.describe()}: no {MANIFEST} (not a complete version) and "
                     f"no {LATEST} (no version of this config completely published); give …/SPEC/KEY or "
                     "…/SPEC, `fusedspec ls URI` lists them")


def _check_bytes(store: Store, prefix: str, name: str, entry: FileEntry) -> tuple[list[str], int]:
    try:
        size, digest = store.hash_object(join_key(prefix, name))
    except UnreadableObject as exc:
        return [f"{name}: the store cannot return it ({exc.reason}): delete it, then publish the artifact "
                "again to replace the version"], 0
    if size != entry.size:
        return [f"{name}: {size} bytes read back, the manifest says {entry.size}"], size
    if digest != entry.sha256:
        return [f"{name}: sha256 {digest[:16]}… differs from the manifest's {entry.sha256[:16]}…"], size
    return [], size


def verify_version(uri: str, settings: Settings, *, runtime_check: bool = False, quick: bool = False,
                   mount: Path | None = None) -> VerifyReport:
    """Verify the version at `uri` (or its LATEST). `report.ok` is False when anything differs."""
    store, version, manifest, problems, via_latest = resolve_version(open_store(uri, settings))
    report = VerifyReport(uri=store.describe(version), ok=False, problems=problems, manifest=manifest,
                          via_latest=via_latest, quick=quick)
    if manifest is None:
        return report
    report.signer = manifest.signature.key_id if manifest.signature else None
    key = load_verify_key(settings.verify_key) if settings.verify_key else None
    refused = signature_problem(manifest, key)
    if refused:
        report.problems.append(refused)
        return report  # nothing of an untrusted version is worth checking further
    misplaced = location_problem(store.describe(version), manifest)
    if misplaced:
        report.problems.append(misplaced)
    report.problems += listing_problems(store, version, manifest)
    report.files_checked = len(manifest.files)
    if quick and not report.problems and store.uri.scheme == "s3":
        report.problems += checksum_problems(store, join_key(version, manifest.attempt), manifest)
    if mount is not None:
        report.problems += mount_problems(mount, manifest, settings)
    if not quick and not report.problems:
        prefix = join_key(version, manifest.attempt)
        with ThreadPoolExecutor(max_workers=HASH_WORKERS) as pool:
            outcomes = list(pool.map(lambda item: _check_bytes(store, prefix, *item),
                                     sorted(manifest.files.items())))
        for found, size in outcomes:
            report.problems += found
            report.bytes_checked += size
    if runtime_check:
        report.problems += runtime_problems(manifest)
    report.ok = not report.problems
    return report


def checksum_problems(store: Store, prefix: str, manifest: Manifest) -> list[str]:
    """Each object whose server-computed checksum (HEAD) is not the one the manifest's file gives."""
    def check(item: tuple[str, FileEntry]) -> str | None:
        name, entry = item
        info = store.head(join_key(prefix, name))
        if info is None:
            return f"{name}: missing from the store"
        expected = entry.checksum or full_object_checksum(entry.sha256)
        composite_unrecorded = entry.checksum is None and info.checksum is not None and "-" in info.checksum
        # a multipart object of an older manifest: its etag (the listing) vouches for it
        if composite_unrecorded:
            return None
        if info.checksum != expected:
            return (f"{name}: the store's checksum of the object is {info.checksum or 'absent'}, the "
                    f"manifest's file gives {expected}: the object was overwritten after it was published "
                    "(same size, other bytes); publish the artifact again")
        return None

    with ThreadPoolExecutor(max_workers=HASH_WORKERS) as pool:
        return [problem for problem in pool.map(check, sorted(manifest.files.items())) if problem]


def full_object_checksum(sha256_hex: str) -> str:
    """S3's ChecksumSHA256 of an object sent in one piece: the base64 of its sha256."""
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode()


def mount_problems(mount: Path, manifest: Manifest, settings: Settings) -> list[str]:
    """Why `mount` is not this version as a pod mounts it: its own manifest differs, a file is missing or
    of another size, or it is not named by the key."""
    seen = verify_version(str(mount), settings, quick=True)
    if seen.manifest is None:
        return [f"mount {mount}: {problem}" for problem in seen.problems or ["holds no version"]]
    if seen.manifest.unsigned_bytes() != manifest.unsigned_bytes():
        return [f"mount {mount}: holds version {seen.manifest.key} (attempt {seen.manifest.attempt}), not "
                f"the checked {manifest.key} (attempt {manifest.attempt}): the volume mounts another prefix"]
    return [f"mount {mount}: {problem}" for problem in seen.problems]


def runtime_problems(manifest: Manifest) -> list[str]:
    """Why this host cannot serve the version's recorded toolchain, per its backend. Empty when it can."""
    from fusedspec.compile.backend import get_backend

    backend = get_backend(manifest.backend)
    return [f"runtime: {m}" for m in backend.runtime_mismatches(manifest.toolchain)]
