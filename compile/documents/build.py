"""build.json: what an artifact directory holds, written last by the backend that built it.

An artifact directory is an artifact only when its build.json parses: its keys (version, graph, weights:
compile/content_key.py), backend, spec, both models (reference, commit, file hashes, store name), toolchain,
compile options, which of its files are compiled programs and where they came from, and the backend's own
section.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, JsonValue, model_validator

from fusedspec.compile.documents.base import Document
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError, InputError

BUILD_DESCRIPTION = "build.json"
SHA256_PATTERN = r"^[0-9a-f]{64}$"  # a sha256 hex digest
KEY_PATTERN = SHA256_PATTERN  # a content key is one (compile.content_key)
COMMIT_PATTERN = r"^[0-9a-f]{40}$"
FILE_HASH_PATTERN = r"^(sha256:[0-9a-f]{64}|gitsha1:[0-9a-f]{40})$"
# A store path segment: letters, digits, '.', '_', '-', starting with a letter or digit.
SEGMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
FILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"


class ModelRecord(Document):
    """A model pinned to its content, as an artifact and a manifest record it (no host paths but `ref`)."""

    ref: str = Field(min_length=1, max_length=4096,
                     description="the reference as given (hf://... or a directory)")
    repo_id: str | None = Field(default=None, max_length=200)
    commit: str | None = Field(default=None, pattern=COMMIT_PATTERN)
    files: dict[str, str] = Field(default_factory=dict,
                                  description="each file a build reads -> sha256:<hex> or gitsha1:<hex>")
    store_name: str = Field(pattern=SEGMENT_PATTERN,
                            description="this model's path segment in stores (compile.modelref.store_name)")

    @model_validator(mode="after")
    def _file_names(self) -> ModelRecord:
        import re

        for name, digest in self.files.items():
            if not re.match(FILE_NAME_PATTERN, name):
                raise ValueError(f"file name {name!r} is not a plain top-level file name")
            if not re.match(FILE_HASH_PATTERN, digest):
                raise ValueError(f"file {name!r} has hash {digest!r}, not sha256:<hex> or gitsha1:<hex>")
        return self


class BuildDescription(Document):
    """build.json. `cpu` / `neuron` hold the building backend's own section (parsed by that backend)."""

    FIX: ClassVar[str] = "this is not a complete fusedspec artifact: build it again with `fusedspec compile`"
    ERROR: ClassVar[type[InputError]] = ArtifactError

    key: str = Field(pattern=KEY_PATTERN,
                     description="the version key: a content key over graph_key and weight_key")
    graph_key: str = Field(pattern=KEY_PATTERN, description="what shapes the compiled programs")
    weight_key: str = Field(pattern=KEY_PATTERN,
                            description="which weights: both models' commits and file hashes")
    backend: str
    spec: BuildSpec
    target: ModelRecord
    draft: ModelRecord
    toolchain: dict[str, str]
    code_version: str
    options: dict[str, JsonValue] = Field(default_factory=dict)
    cpu: dict[str, Any] | None = None
    neuron: dict[str, Any] | None = None
    programs: list[str] = Field(default_factory=list,
                                description="the compiled program files (paths inside the artifact): the "
                                            "same bytes in every build of this graph key")
    programs_from: str = Field(default="compiled", max_length=4096,
                               description="'compiled' by this build, or where its programs were reused from")
    timings: dict[str, float] = Field(default_factory=dict)
    reference: str | None = Field(default=None, description="set on NxDI's target-only reference builds")

    @model_validator(mode="after")
    def _one_backend(self) -> BuildDescription:
        if self.spec.backend != self.backend:
            raise ValueError(f"backend {self.backend!r} differs from the spec's {self.spec.backend!r}")
        return self
