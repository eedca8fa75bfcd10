"""The work dir does not grow without bound: published builds are evicted, oldest first, past a budget.

A Qwen3-32B build at TP 32 is about 65 GB, and a compile node runs many; once a build is published the
store holds it, and a later run reuses it from there. So after each publish the pipeline marks the build
published (`.published` in its directory) and trims published builds, least recently used first, until
the builds directory fits its budget (FUSEDSPEC_BUILDS_BUDGET, default 20 GiB; 0 keeps none). Builds
that were not published (a failed gate: worth a look) are never evicted here; `fusedspec gc --work-dir`
reports everything and can remove them too. A build in use (`in_use`: validate and publish hold it, a
compile holds its build lock) is never removed: eviction takes the build's lock only when it is free.
One process at a time validates a build and publishes it (`validating`): validation.json is rewritten by a
validation, and a run publishes the bytes its own validation wrote.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fusedspec.compile.build import build_lock, is_complete, remove_stale_staging
from fusedspec.core.files import atomic_write, file_lock, lock_if_free, shared_lock
from fusedspec.core.settings import Settings

PUBLISHED_MARK = ".published"


@dataclass(frozen=True)
class BuildDir:
    path: Path
    bytes: int
    published: str | None  # the version URI it was published to
    used_at: float  # last time a run used it (the mark's or the build's mtime)


def size_of(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(dirpath) / name).lstat().st_size
            except OSError:
                pass
    return total


def mark_published(artifact_dir: Path, version_uri: str) -> None:
    atomic_write(Path(artifact_dir) / PUBLISHED_MARK, version_uri)


def builds(builds_dir: Path) -> list[BuildDir]:
    """Every complete build in the work dir, oldest use first."""
    found = []
    for path in sorted(Path(builds_dir).iterdir()) if Path(builds_dir).is_dir() else []:
        if path.name.startswith(".") or not is_complete(path):
            continue
        mark = path / PUBLISHED_MARK
        published = mark.read_text().strip() if mark.is_file() else None
        used = (mark if mark.is_file() else path).stat().st_mtime
        found.append(BuildDir(path=path, bytes=size_of(path), published=published, used_at=used))
    return sorted(found, key=lambda b: b.used_at)


def trim_published(settings: Settings, budget_bytes: int) -> list[BuildDir]:
    """Evict published builds, least recently used first, until all builds fit `budget_bytes`.
    A build whose compile lock is held (in use right now) is left alone."""
    present = builds(settings.builds_dir)
    total = sum(b.bytes for b in present)
    removed = []
    for build in present:
        if total <= budget_bytes:
            break
        if build.published is None:
            continue
        with lock_if_free(build_lock(settings, build.path.name)) as free:
            if not free:
                continue
            shutil.rmtree(build.path, ignore_errors=True)
        total -= build.bytes
        removed.append(build)
    return removed


@contextmanager
def in_use(settings: Settings, artifact_dir: Path) -> Iterator[None]:
    """While the block runs, a build of this work dir is not evicted (a shared hold of its build lock,
    which eviction needs free). An artifact directory elsewhere is nobody's to evict: nothing is held."""
    artifact_dir = Path(artifact_dir).absolute()
    if artifact_dir.parent != Path(settings.builds_dir).absolute():
        yield
        return
    with shared_lock(build_lock(settings, artifact_dir.name)):
        yield


@contextmanager
def validating(settings: Settings, artifact_dir: Path) -> Iterator[None]:
    """While the block runs, no other process of this work dir validates this build or publishes it: two runs
    on one work dir validating a build at once rewrote validation.json under the other's publish, which then
    refused the changed file. Taken after `in_use` where both are held, and never around a compile (one lock
    order). A directory outside the work dir's builds (a private copy) is nobody else's: nothing is held."""
    artifact_dir = Path(artifact_dir).absolute()
    if artifact_dir.parent != Path(settings.builds_dir).absolute():
        yield
        return
    with file_lock(settings.cache_dir / "locks" / f"validate-{artifact_dir.name}.lock"):
        yield


def stale_staging(settings: Settings) -> list[Path]:
    """Staging dirs of compiles that were killed (removed)."""
    return remove_stale_staging(settings)
