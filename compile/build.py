"""Build one artifact into the work dir, keyed by content, atomically.

`build_artifact` is what the CLI and the flow call: the key names the output directory
(`settings.builds_dir/<key>/`); a directory there with a build.json is a finished build and is returned
as it is; otherwise the backend compiles into a hidden sibling temp dir which is renamed into place
only when complete, so no reader ever sees half an artifact and a failed build leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from compile.backend import BUILD_DESCRIPTION, get_backend, read_build_description
from compile.content_key import content_key
from compile.errors import ArtifactError
from compile.modelref import ResolvedModel
from compile.settings import Settings
from compile.spec import BuildSpec


def build_key(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel,
              options: dict[str, Any] | None = None) -> str:
    backend = get_backend(spec.backend)
    return content_key(spec, target, draft, backend.toolchain(), backend.code_version, options)


def is_complete(artifact_dir: Path) -> bool:
    """Whether `artifact_dir` holds a finished build (a readable build.json, written last)."""
    if not (Path(artifact_dir) / BUILD_DESCRIPTION).is_file():
        return False
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
    with nothing written.
    """
    backend = get_backend(spec.backend)
    key = key or content_key(spec, target, draft, backend.toolchain(), backend.code_version, options)
    out = settings.builds_dir / key
    if is_complete(out):
        return out
    settings.builds_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".partial", dir=settings.builds_dir))
    try:
        backend.compile(spec, target, draft, staging, key=key, options=options)
        if out.exists() and not is_complete(out):
            shutil.rmtree(out)  # debris without build.json is not an artifact for any reader
        try:
            staging.rename(out)
        except OSError:
            if not is_complete(out):  # lost a race against something that is not a finished build
                raise
            shutil.rmtree(staging)  # another worker finished the same key first: same content
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
