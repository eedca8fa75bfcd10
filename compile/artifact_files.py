"""An artifact directory's files as a manifest lists them: relative path, size and sha256.

Publishing uploads exactly these, and validation's `content_hash` is taken over them, so that a report is
tied to the files that are published. Temp files, hidden files and the manifest itself are not part of an
artifact; a symlink or any other non-regular file is refused, since its target could be anything on this
host (/etc/passwd).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fusedspec.compile.documents.manifest import MANIFEST, rel_path_problem
from fusedspec.core.errors import ArtifactError
from fusedspec.core.files import FileHasher, is_temp_name


@dataclass(frozen=True)
class LocalFile:
    rel: str
    path: Path
    size: int
    sha256: str


def artifact_files(artifact_dir: Path, hasher: FileHasher) -> list[LocalFile]:
    """Every file of the artifact with its size and sha256. Temp files are left out; a symlink or any
    other non-regular file is refused: its target could be anything on this host (/etc/passwd)."""
    return [LocalFile(rel, path, path.stat().st_size, hasher.sha256(path))
            for rel, path in artifact_paths(artifact_dir)]


def artifact_paths(artifact_dir: Path) -> list[tuple[str, Path]]:
    """artifact_files' files as (relative path, path), none of them read."""
    artifact_dir = Path(artifact_dir)
    found: list[tuple[str, Path]] = []  # every file is looked at before any is hashed
    for dirpath, dirs, files in os.walk(artifact_dir, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            path = Path(dirpath) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                kind = "a symlink" if path.is_symlink() else "not a regular file"
                raise ArtifactError(f"{path}: {kind}; an artifact holds plain files only (nothing was "
                                    "uploaded). Replace it with the file itself or remove it")
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if is_temp_name(name) or name.startswith(".") or name == MANIFEST:
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(artifact_dir).as_posix()
            problem = rel_path_problem(rel)
            if problem:  # a manifest could not list it: refused now, before anything is sent
                raise ArtifactError(f"{path}: {problem}; rename or remove it (nothing was uploaded)")
            found.append((rel, path))
    return found
