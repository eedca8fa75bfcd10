"""Check a published version against its manifest, as a serving pod's init container does.

`verify_version(uri)` takes a version directory (…/{spec.slug}/{key}) or a config directory
(…/{spec.slug}, meaning the version its LATEST names). It re-reads every file from the store and
compares size and sha256 with the manifest, and reports objects the manifest does not list. With
`quick`, it checks the manifest, each file's presence and size and the listing, without reading any
file's bytes: what a serving pod checks at every start (a missing or truncated object is what makes
vLLM recompile), where re-hashing tens of GB through the mount would delay every start. With
`runtime_check`, it also asks the manifest's backend whether this host can serve the recorded toolchain.
It never writes to the store.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from compile.backend import BUILD_DESCRIPTION
from compile.errors import StoreError
from compile.settings import Settings
from registry.manifest import LATEST, MANIFEST, decode, manifest_files, manifest_problems
from registry.store import NotFound, Store
from registry.stores import open_store
from registry.uri import join_key

HASH_WORKERS = 4


@dataclass
class VerifyReport:
    uri: str  # the version that was checked
    ok: bool
    problems: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    files_checked: int = 0
    bytes_checked: int = 0
    via_latest: bool = False
    sha256_checked: bool = True  # False for a quick check: sizes only, no byte read

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "uri": self.uri, "key": (self.manifest or {}).get("key"),
                "via_latest": self.via_latest, "files_checked": self.files_checked,
                "bytes_checked": self.bytes_checked, "sha256_checked": self.sha256_checked,
                "problems": self.problems}


def resolve_version(store: Store) -> tuple[str, dict[str, Any] | None, list[str], bool]:
    """Find the version at the store root: (version key prefix, manifest or None, problems, via LATEST).

    Raises StoreError when the root is neither a version nor a config with a LATEST (a usage error).
    """
    for version, via_latest in _candidates(store):
        where = store.describe(join_key(version, MANIFEST))
        try:
            data = store.get(join_key(version, MANIFEST))
        except NotFound:
            if via_latest:
                return version, None, [f"LATEST names {version!r}, which has no {MANIFEST}"], True
            continue
        try:
            return version, decode(data, where), [], via_latest
        except ValueError as exc:
            return version, None, [str(exc)], via_latest
    if store.head(BUILD_DESCRIPTION) is not None:
        # An artifact's files but no manifest: an interrupted publish. It does not exist for readers.
        return "", None, [f"no {MANIFEST} at {store.describe()}: this version is incomplete (an interrupted "
                          "publish); publish the artifact again to complete it"], False
    raise StoreError(f"nothing to verify at {store.describe()}: no {MANIFEST} (not a complete version) and no "
                     f"{LATEST} (no version of this config completely published); give …/SPEC/KEY or …/SPEC, "
                     "`fusedspec ls URI` lists them")


def _candidates(store: Store) -> list[tuple[str, bool]]:
    """The root itself, then what its LATEST names (read lazily: LATEST only matters without a manifest)."""
    if store.head(MANIFEST) is not None:
        return [("", False)]
    try:
        pointer = decode(store.get(LATEST), store.describe(LATEST))
    except NotFound:
        return []
    except ValueError as exc:
        raise StoreError(f"{exc}; LATEST is broken, publish again to rewrite it") from None
    key = pointer.get("key")
    if not isinstance(key, str) or "/" in key or key in ("", ".", ".."):
        raise StoreError(f"{store.describe(LATEST)} names no valid version key; publish again to rewrite it")
    return [(key, True)]


def _check_listed(listed: dict[str, int], name: str, expected: dict[str, Any]) -> list[str]:
    """The quick check of one file against the version's listing: sizes come from the listing, because a
    local store's head() hashes the file, and through a Mountpoint mount that would read every byte."""
    if name not in listed:
        return [f"{name}: missing from the store"]
    if listed[name] != expected.get("size"):
        return [f"{name}: size {listed[name]} bytes, manifest says {expected.get('size')}"]
    return []


def _check_file(store: Store, version: str, name: str, expected: dict[str, Any]) -> tuple[list[str], int]:
    key = join_key(version, name)
    info = store.head(key)
    if info is None:
        return [f"{name}: missing from the store"], 0
    if info.size != expected.get("size"):
        return [f"{name}: size {info.size} bytes, manifest says {expected.get('size')}"], 0
    size, digest = store.hash_object(key)
    if digest != expected.get("sha256"):
        return [f"{name}: sha256 {digest[:16]}… differs from the manifest's {str(expected.get('sha256'))[:16]}…"], size
    return [], size


def verify_version(uri: str, settings: Settings, *, runtime_check: bool = False,
                   quick: bool = False) -> VerifyReport:
    """Verify the version at `uri` (or its LATEST). `report.ok` is False when anything differs.
    `quick`: sizes and presence only, no sha256 (see the module docstring)."""
    store = open_store(uri, settings)
    version, manifest, problems, via_latest = resolve_version(store)
    report = VerifyReport(uri=store.describe(version), ok=False, problems=problems, manifest=manifest,
                          via_latest=via_latest, sha256_checked=not quick)
    if manifest is None:
        return report
    report.problems += manifest_problems(manifest)
    name = store.describe(version).rstrip("/").rsplit("/", 1)[-1]
    if manifest.get("key") != name:
        report.problems.append(f"manifest key {manifest.get('key')!r} differs from the version directory {name!r}")
    files = manifest_files(manifest)
    prefix = f"{version}/" if version else ""
    listed = {info.key[len(prefix):]: info.size for info in store.list(version)}
    if quick:
        for file_name, expected in sorted(files.items()):
            report.problems += _check_listed(listed, file_name, expected)
    else:
        with ThreadPoolExecutor(max_workers=HASH_WORKERS) as pool:
            outcomes = list(pool.map(lambda item: _check_file(store, version, item[0], item[1]),
                                     sorted(files.items())))
        for found, size in outcomes:
            report.problems += found
            report.bytes_checked += size
    report.files_checked = len(files)
    for rel in listed:
        if rel != MANIFEST and rel not in files:
            report.problems.append(f"{rel}: in the version directory but not in the manifest")
    if runtime_check:
        report.problems += runtime_problems(manifest)
    report.ok = not report.problems
    return report


def runtime_problems(manifest: dict[str, Any]) -> list[str]:
    """Why this host cannot serve the version's recorded toolchain, per its backend. Empty when it can."""
    from compile.backend import get_backend

    backend = get_backend(str(manifest.get("backend")))
    mismatches = backend.runtime_mismatches(dict(manifest.get("toolchain") or {}))  # type: ignore[attr-defined]
    return [f"runtime: {m}" for m in mismatches]
