"""The work dir's compiled programs by graph key: a new revision of a model compiles nothing.

    programs/<graph key>/<file>...       the program files, at their paths inside an artifact
    programs/<graph key>/programs.json   written last (ProgramSet): an entry without it is not one

`keep` makes an entry from an artifact this work dir just compiled, with hard links (no byte copied or read;
a copy where the filesystem cannot link). `filling` gives the registry a staging directory to fill from a
store (registry/graphs.py), renamed into place only once every file matched a manifest whose signature
verified. Nothing else writes here, so every program in the cache was compiled by this work dir or checked
against a signed manifest: the trust the cpu loader needs before it runs an AOTInductor package's native
code. `place` links an entry's files into a new artifact (compile/build.py).

Entries are never edited: a new one is staged beside and renamed over nothing (one writer per graph key
holds its lock, `.locks/<graph key>.lock` here, so work dirs sharing the cache take turns too).

`FUSEDSPEC_PROGRAMS_DIR` puts the cache outside the work dir, for several work dirs of one host to share
(CI jobs, the users of one build box): a graph compiled by one is linked into the builds of all. That keeps
the rule above only while no other account can write there or swap it, so a shared cache is refused unless
it and the path to it are this user's alone (`shared_root` states the rule).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fusedspec.compile.documents.programs import PROGRAM_SET, ProgramSet
from fusedspec.core.errors import ArtifactError, ConfigError
from fusedspec.core.settings import Settings

COMPILED = "compiled"
STAGING_SUFFIX = ".partial"


def root(settings: Settings, *, create: bool = False) -> Path:
    """The cache's directory (made with `create`), a shared one checked by `shared_root` on every use."""
    directory = settings.programs_dir
    if settings.shared_programs_dir is None:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        return directory
    shared_root(directory)  # before anything is made: a refused place gets nothing
    if create and not directory.is_dir():
        for level in reversed([p for p in (directory, *directory.parents) if not os.path.lexists(p)]):
            try:
                level.mkdir(mode=0o700)
                level.chmod(0o700)  # whatever the umask: a 002 one would make it group-writable
            except FileExistsError:
                pass  # made by another process meanwhile: checked below like any other
        shared_root(directory)
    return directory


def shared_root(directory: Path) -> None:
    """ConfigError unless `directory` (when it exists) is a directory of this user that no other account can
    write, on a path without symlinks whose every directory is this user's or root's and writable by no other
    account unless sticky (/tmp): whoever may rename a directory on the path can swap the cache for their own,
    at any moment of a build. Missing levels are allowed: `root` makes them 0700."""
    name = f"FUSEDSPEC_PROGRAMS_DIR={directory}"
    real = directory.resolve()
    if real != directory:
        raise ConfigError(f"{name} has a symlink on its path (it leads to {real}); give the real path: "
                          "whoever can change a link on it decides where the cache of native code is")
    me = os.geteuid() if hasattr(os, "geteuid") else None
    for place in (directory, *directory.parents):
        if not os.path.lexists(place):
            continue
        info = place.lstat()
        what = "it" if place == directory else f"{place} above it"
        if not stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{name}: {what} is not a directory; point "
                              "it at a directory (made 0700 if missing)")
        owners = (me,) if place == directory else (me, 0)
        if me is not None and info.st_uid not in owners:
            allowed = f"this user ({me})" + ("" if place == directory else " or root")
            raise ConfigError(f"{name}: {what} belongs to uid {info.st_uid}, not to {allowed}: its owner "
                              "could replace the cache of native code this host would run. Use a directory "
                              "of your own, or unset it to keep programs in the work dir")
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (place == directory or not info.st_mode & stat.S_ISVTX):
            raise ConfigError(
                f"{name}: {what} is writable by other accounts (mode {stat.S_IMODE(info.st_mode):o}"
                f"{'' if place == directory else ', not sticky'}), so another account could plant or swap "
                f"native code this host would run. `chmod go-w {place}`, or unset it to keep programs in the "
                "work dir")


def entry_dir(settings: Settings, graph_key: str) -> Path:
    return root(settings) / graph_key


def lock_path(settings: Settings, graph_key: str) -> Path:
    """The lock a writer of `graph_key`'s entry holds, beside the entries: work dirs sharing them share it."""
    locks = root(settings, create=True) / ".locks"
    if os.path.lexists(locks) and (locks.is_symlink() or not locks.is_dir()):
        raise ConfigError(f"{locks} is not a directory: the program cache's "
                          "locks live there. Remove it; it is made again")
    return locks / f"{graph_key}.lock"


def find(settings: Settings, graph_key: str) -> ProgramSet | None:
    """The cache's entry for `graph_key` when it is complete (its programs.json parses and every file it names
    is there at its size), else None: the build compiles."""
    entry = entry_dir(settings, graph_key)
    try:
        programs = ProgramSet.read(entry / PROGRAM_SET)
    except ArtifactError:
        return None
    for rel, size in programs.files.items():
        path = entry / rel
        parts = Path(rel).parts  # the entry, each directory below it, the file: none may be a link
        if any((entry / Path(*parts[:n])).is_symlink() for n in range(len(parts) + 1)) or not path.is_file() \
                or path.stat().st_size != size:
            return None  # a link anywhere inside the entry could lead out of the cache
    return programs if programs.graph_key == graph_key else None


def link_or_copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, destination)


def place(settings: Settings, programs: ProgramSet, out_dir: Path) -> None:
    """Put the entry's program files into the artifact being built in `out_dir`."""
    entry = entry_dir(settings, programs.graph_key)
    for rel in programs.files:
        link_or_copy(entry / rel, Path(out_dir) / rel)


@contextmanager
def filling(settings: Settings, graph_key: str, backend: str,
            source: str) -> Iterator[tuple[Path, dict[str, int]]]:
    """A staging directory and a {file: size} the block fills; the entry appears only if the block ends well.
    The caller holds the graph key's lock (compile/build.py graph_lock)."""
    directory = root(settings, create=True)
    for stale in directory.glob(f".{graph_key}.*{STAGING_SUFFIX}"):  # a killed filler's (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{graph_key}.", suffix=STAGING_SUFFIX, dir=directory))
    files: dict[str, int] = {}
    try:
        yield staging, files
        ProgramSet(graph_key=graph_key, backend=backend, files=files,
                   source=source).write(staging / PROGRAM_SET)
        entry = entry_dir(settings, graph_key)
        if entry.exists():  # an incomplete entry (no programs.json, a file missing): replaced
            shutil.rmtree(entry)
        staging.rename(entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def keep(settings: Settings, graph_key: str, backend: str, artifact_dir: Path,
         program_files: list[str]) -> None:
    """Make the entry of `graph_key` from a finished artifact that compiled these program files."""
    with filling(settings, graph_key, backend, COMPILED) as (staging, files):
        for rel in program_files:
            link_or_copy(Path(artifact_dir) / rel, staging / rel)
            files[rel] = (staging / rel).stat().st_size
