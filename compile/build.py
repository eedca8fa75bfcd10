"""Build one artifact into the work dir, keyed by content, atomically, compiling only what no build compiled.

`build_artifact` is what the CLI and the flow call. The version key names the output directory
(`settings.builds_dir/<key>/`); a directory there with a build.json is a finished build and is returned as it
is. Otherwise, when the work dir's program cache (compile/program_cache.py) holds the programs of the build's
graph key, the backend only shards the weights and links those programs in: a new revision of a model
compiles nothing. Else it compiles, and the new programs go into the cache. Either way the backend writes into
a hidden sibling staging dir which is renamed into place only when complete, so no reader ever sees half an
artifact and a failed build leaves nothing behind.

Locks: one build of a version key at a time per work dir, and inside it one build of a graph key at a time
(always taken in that order), so two revisions built at once compile their shared programs once. A staging
dir of a key found while holding its lock belongs to a killed build, and is removed.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fusedspec.compile import program_cache
from fusedspec.compile.backend import ProgramSource, get_backend, read_build_description
from fusedspec.compile.content_key import BuildKeys, build_keys
from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError
from fusedspec.core.files import disk_full, file_lock, free_bytes, lock_if_free
from fusedspec.core.settings import Settings

PARTIAL_SUFFIX = ".partial"
# What a build does: nothing (its artifact is in the work dir), shard weights and link cached programs, or
# compile. The plan shows the same words per build (flows/planning.py), with the store's versions too.
Work = Literal["built", "programs", "compile"]


@dataclass(frozen=True)
class BuiltArtifact:
    path: Path
    work: Work  # what this call did
    description: BuildDescription  # its build.json


def keys_of(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel,
            options: dict[str, Any] | None = None) -> BuildKeys:
    """The build's keys, from both models' parsed config.json (a plan hands over its keys instead)."""
    backend = get_backend(spec.backend)
    return build_keys(spec, target, draft, target.parsed_config(), draft.parsed_config(), backend.toolchain(),
                      backend.code_version, options)


def finished(artifact_dir: Path) -> BuildDescription | None:
    """The build.json of a finished build in `artifact_dir` (written last), else None."""
    try:
        return read_build_description(artifact_dir)
    except ArtifactError:
        return None


def is_complete(artifact_dir: Path) -> bool:
    """Whether `artifact_dir` holds a finished build (a readable build.json, written last)."""
    return finished(artifact_dir) is not None


def planned_work(settings: Settings, keys: BuildKeys) -> Work:
    """What `build_artifact` would do for these keys in this work dir now."""
    if is_complete(settings.builds_dir / keys.version):
        return "built"
    return "programs" if program_cache.find(settings, keys.graph) is not None else "compile"


def build_artifact(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, settings: Settings, *,
                   options: dict[str, Any] | None = None, keys: BuildKeys | None = None) -> BuiltArtifact:
    """The artifact directory for this build, compiling only what the work dir does not hold.

    `target` and `draft` must be downloaded (their `local_dir` holds config, weights, tokenizer).
    Raises the backend's InputErrors (bad spec for these models, checkpoint not matching its config)
    and DiskFullError with nothing written.
    """
    backend = get_backend(spec.backend)
    keys = keys or keys_of(spec, target, draft, options)
    out = settings.builds_dir / keys.version
    done = finished(out)
    if done is not None:
        return BuiltArtifact(out, "built", done)
    with file_lock(build_lock(settings, keys.version)), file_lock(graph_lock(settings, keys.graph)):
        done = finished(out)
        if done is not None:  # another process finished it while we waited
            return BuiltArtifact(out, "built", done)
        remove_stale_staging(settings, keys.version)
        if out.exists():
            shutil.rmtree(out)  # debris without build.json is not an artifact for any reader
        settings.builds_dir.mkdir(parents=True, exist_ok=True)
        cached = program_cache.find(settings, keys.graph)
        programs = None if cached is None else ProgramSource(
            directory=program_cache.entry_dir(settings, keys.graph), files=tuple(cached.files),
            origin=f"graph key {keys.graph} ({cached.source})")
        free_at_start = free_bytes(settings.builds_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{keys.version}.", suffix=PARTIAL_SUFFIX,
                                        dir=settings.builds_dir))
        try:
            backend.compile(spec, target, draft, staging, keys=keys, options=options, programs=programs)
            staging.rename(out)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            # a backend removes its own output on failure, so what it needed is known as a lower bound only
            full = disk_full(exc, settings.builds_dir, f"compiling {spec.slug} (key {keys.version[:12]})",
                             more_than=free_at_start)
            if full is not None:
                raise full from None
            raise
        description = read_build_description(out)
        if programs is not None:
            return BuiltArtifact(out, "programs", description)
        # a backend that reports no program files cannot reuse them (compiles each time)
        if description.programs:
            program_cache.keep(settings, keys.graph, spec.backend, out, description.programs)
    return BuiltArtifact(out, "compile", description)


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
    """The lock a build of version `key` holds (in the cache dir: the builds dir holds builds only)."""
    return settings.cache_dir / "locks" / f"build-{key}.lock"


def graph_lock(settings: Settings, graph_key: str) -> Path:
    """The lock a build holds for its graph key: the program cache entry of that key has one writer."""
    return program_cache.lock_path(settings, graph_key)
