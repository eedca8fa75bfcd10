"""Model references (`hf://ORG/NAME@REV`, `hf://ORG/NAME`, a local directory) and resolved models.

Parsing is pure and strict: a reference that could escape a directory (`..`, absolute components) is
refused here, before anything touches the network or the disk. Resolution (commit sha, file hashes,
download) lives in `registry.hub`; its result is a `ResolvedModel`, which is what content keys use.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from fusedspec.compile.documents.build import COMMIT_PATTERN, ModelRecord
from fusedspec.compile.modelconfig import ModelConfig, read_model_config
from fusedspec.core.errors import ModelRefError
from fusedspec.core.schemes import split_scheme

HF_SCHEME = "hf://"
_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
COMMIT_SHA = re.compile(COMMIT_PATTERN)


@dataclass(frozen=True)
class ModelRef:
    """Where a model comes from. Exactly one of `repo_id` and `local_dir` is set."""

    text: str
    repo_id: str | None = None
    revision: str | None = None  # None means the Hub's default branch ("main")
    local_dir: Path | None = None

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    @property
    def slug(self) -> str:
        """A path-safe name for work dirs and titles: `Qwen--Qwen3-32B` or the directory's name."""
        if self.repo_id is not None:
            return self.repo_id.replace("/", "--")
        assert self.local_dir is not None
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.local_dir.name).lstrip("._-")[:80] or "model"

    def __str__(self) -> str:
        return self.text


def _check_name_part(part: str, text: str) -> None:
    if part in ("", ".", "..") or not _NAME_PART.match(part):
        raise ModelRefError(
            f"model reference {text!r}: {part!r} is not a valid Hub name part "
            "(use letters, digits, '.', '_' or '-'; no '..', no empty or absolute parts)"
        )


def parse_model_ref(text: str, base_dir: Path | None = None) -> ModelRef:
    """Parse a reference. Local directories must exist; Hub names are checked for shape only."""
    text = text.strip()
    scheme, body = split_scheme(text, (HF_SCHEME,), ModelRefError, "model reference",
                                "hf://ORG/NAME[@REVISION] or a local directory")
    if scheme == HF_SCHEME:
        name, _, revision = body.partition("@")
        parts = name.split("/")
        if any(part in ("", ".", "..") for part in parts) and len(parts) > 1:
            raise ModelRefError(
                f"model reference {text!r}: '..', '.' and empty or absolute path parts are not allowed; "
                "write hf://ORG/NAME[@REVISION]"
            )
        if len(parts) != 2:
            raise ModelRefError(
                f"model reference {text!r}: expected hf://ORG/NAME[@REVISION] with exactly one '/'"
            )
        for part in parts:
            _check_name_part(part, text)
        if "@" in body:
            if not revision or not _REVISION.match(revision) or ".." in revision.split("/"):
                raise ModelRefError(
                    f"model reference {text!r}: revision {revision!r} is not a branch, tag or commit sha"
                )
        return ModelRef(text=text, repo_id=name, revision=revision or None)
    path = Path(text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_dir():
        where = f" ({path.absolute()})" if str(path.absolute()) != text else ""
        raise ModelRefError(
            f"model reference {text!r}: no such local directory{where}; give a checkpoint directory, or "
            "hf://ORG/NAME for a Hub model"
        )
    return ModelRef(text=text, local_dir=path.resolve())


@dataclass(frozen=True)
class ResolvedModel:
    """A model pinned to immutable content: what a build depends on, and where its files are.

    `commit` is the Hub commit sha (None for a local directory). `file_hashes` maps each file a build
    reads (weights, config, tokenizer files) to `sha256:<hex>` or, for small Hub files that the Hub
    identifies by git blob, `gitsha1:<hex>`. Content keys use `commit` and `file_hashes`, never paths.
    `config` is its config.json as parsed when it was pinned (a plan's models always carry it).
    """

    ref: ModelRef
    commit: str | None
    local_dir: Path
    file_hashes: dict[str, str] = field(default_factory=dict)
    # parsed once where the model is pinned and handed down with it, so no later stage parses it again
    config: ModelConfig | None = field(default=None, compare=False)

    def parsed_config(self) -> ModelConfig:
        """Its config.json: the one parsed when it was pinned, else read from its directory now."""
        return self.config if self.config is not None else read_model_config(self.local_dir)

    def identity(self) -> dict[str, object]:
        """What identifies the model's content, for content keys and manifests (no local paths)."""
        return {
            "repo_id": self.ref.repo_id,
            "commit": self.commit,
            "files": dict(sorted(self.file_hashes.items())),
        }

    @property
    def store_name(self) -> str:
        """This model's path segment in stores (see `store_name`)."""
        return store_name(self.ref, self.file_hashes)

    def record(self) -> ModelRecord:
        """The model as build.json and manifests record it."""
        return ModelRecord(ref=self.ref.text if self.ref.is_hub else str(self.local_dir),
                           repo_id=self.ref.repo_id, commit=self.commit,
                           files=dict(sorted(self.file_hashes.items())), store_name=self.store_name)


def store_name(ref: ModelRef, file_hashes: dict[str, str]) -> str:
    """A model's path segment in stores, the one rule every writer and reader uses.

    A Hub model is `ORG--NAME`: its versions share one LATEST per config as its commits move on. A local
    directory is its name plus a short digest of its content (the hash of every file a build reads), so
    two different models in directories of the same name never share a LATEST, and a symlink to a
    directory names the same models as the directory itself.
    """
    if ref.repo_id is not None:
        return ref.slug
    digest = hashlib.sha256(json.dumps(sorted(file_hashes.items())).encode()).hexdigest()[:10]
    return f"{ref.slug[:100]}-{digest}"
