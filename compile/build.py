"""Build one artifact into the work dir, keyed by content, atomically.

`build_artifact` is what the CLI and the flow call: the key names the output directory
(`settings.builds_dir/<key>/`); a directory there with a build.json is a finished build and is returned
as it is; otherwise the backend compiles into a hidden sibling staging dir which is renamed into place
only when complete, so no reader ever sees half an artifact and a failed build leaves nothing behind.
One compile of a key at a time per work dir (a file lock): so a staging dir of that key found while
holding the lock belongs to a killed compile, and is removed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import get_backend, read_build_description
from fusedspec.compile.content_key import content_key
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError
from fusedspec.core.files import disk_full, file_lock, free_bytes, lock_if_free
from fusedspec.core.settings import Settings

PARTIAL_SUFFIX = ".partial"


def build_key(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel,
              options: dict[str, Any] | None = None) -> str:
    backend = get_backend(spec.backend)
    return content_key(spec, target, draft, backend.toolchain(), backend.code_version, options)


def is_complete(artifact_dir: Path) -> bool:
    """Whether `artifact_dir` holds a finished build (a readable build.json, written last)."""
    try:
        read_build_description(artifact_dir)
    except ArtifactError:
        return False
    return True


def build_artifact(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, settings: Settings, *,
                   options: dict[str, Any] | None = None, key: str | None = None) -> Path:
    """The artifact directory for this build, compiling it unless a finished one is already there.

    `target` and `draft` must be downloaded (their `local_dir` holds config, weights, tokenizer).
    Raises the backend's InputErrors (bad spec for these models, checkpoint not matching its config)
    and DiskFullError with nothing written.
    """
    backend = get_backend(spec.backend)
    key = key or content_key(spec, target, draft, backend.toolchain(), backend.code_version, options)
    out = settings.builds_dir / key
    if is_complete(out):
        return out
    with file_lock(build_lock(settings, key)):
        if is_complete(out):  # another process finished it while we waited
            return out
        remove_stale_staging(settings, key)
        if out.exists():
            shutil.rmtree(out)  # debris without build.json is not an artifact for any reader
        settings.builds_dir.mkdir(parents=True, exist_ok=True)
        free_at_start = free_bytes(settings.builds_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=PARTIAL_SUFFIX, dir=settings.builds_dir))
        try:
            backend.compile(spec, target, draft, staging, key=key, options=options)
            staging.rename(out)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            # a backend removes its own output on failure, so what it needed is known as a lower bound only
            full = disk_full(exc, settings.builds_dir, f"compiling {spec.slug} (key {key[:12]})",
                             more_than=free_at_start)
            if full is not None:
                raise full from None
            raise
    return out


def remove_stale_staging(settings: Settings, key: str | None = None) -> list[Path]:
    """Remove staging dirs left by killed compiles: of `key` (the caller holds its lock), or of every key
    whose lock nobody holds (so a compile at work in another process keeps its staging dir)."""
    builds_dir = settings.builds_dir
    if key is not None:
        stale = sorted(builds_dir.glob(f".{key}.*{PARTIAL_SUFFIX}"))
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale
    removed = []
    for path in sorted(builds_dir.glob(f".*{PARTIAL_SUFFIX}")) if builds_dir.is_dir() else []:
        with lock_if_free(build_lock(settings, path.name[1:].split(".", 1)[0])) as free:
            if free:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def build_lock(settings: Settings, key: str) -> Path:
    """The lock a compile of `key` holds (in the cache dir: the builds dir holds builds only)."""
    return settings.cache_dir / "locks" / f"build-{key}.lock"

