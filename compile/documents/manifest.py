"""The manifest of a published version, and LATEST: the two documents a store's readers trust.

    {config}/{key}/manifest.json   the commit point of a version: names the attempt directory that holds
                                   its files and lists each file's size, sha256 and store etag; signed
    {config}/LATEST                the newest validated version of the config, moved by compare-and-swap

`registry/manifest.schema.json` is generated from `Manifest` (tests/test_manifest_schema.py checks
the shipped file equals what the model generates).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, JsonValue, field_validator, model_validator

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.build import KEY_PATTERN, SEGMENT_PATTERN, SHA256_PATTERN, ModelRecord
from fusedspec.compile.documents.validation import Part, ValidationSummary
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import InputError, StoreError

MANIFEST = "manifest.json"
LATEST = "LATEST"
MANIFEST_SCHEMA = 2
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"
# A file inside a version: relative, '/'-separated plain segments (no '..', no absolute path, no
# hidden or odd names), so no reader can be sent outside the version directory.
_REL_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
MAX_FILES = 10_000


def rel_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file inside a version, or None."""
    parts = path.split("/")
    if len(path) > 1024 or not parts or any(not _REL_SEGMENT.match(p) or p in (".", "..") for p in parts):
        return (f"file path {path!r} is not a relative path of plain names (letters, digits, '.', '_', '-'; "
                "no '..', no leading '/' or '.')")
    return None


FilesT = TypeVar("FilesT", bound=dict[str, Any])


def relative_keys(files: FilesT) -> FilesT:
    """`files` when every key is a path inside the artifact (rel_path_problem); else ValueError naming it."""
    for path in files:
        problem = rel_path_problem(path)
        if problem:
            raise ValueError(problem)
    return files


class FileEntry(Part):
    size: int = Field(strict=True, ge=0)
    sha256: str = Field(pattern=SHA256_PATTERN)
    etag: str | None = Field(default=None, max_length=200,
                             description="the store's etag for the object when the version was committed")
    # absent in manifests written before it was recorded: readers then compare what the sha256 gives
    checksum: str | None = Field(default=None, max_length=200,
                                 description="the store's own checksum of the object when the version was "
                                             "committed (S3: the server-computed SHA256, full or composite "
                                             "of the parts)")


class Models(Part):
    target: ModelRecord
    draft: ModelRecord


class Producer(Part):
    name: Literal["fusedspec"] = "fusedspec"
    version: str


class Signature(Part):
    algorithm: Literal["ed25519"] = "ed25519"
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="sha256 of the raw public key, first 16 hex")
    value: str = Field(pattern=r"^[A-Za-z0-9+/]{86}==$",
                       description="base64 signature of the unsigned manifest")


class Manifest(Document):
    """manifest.json: written last (create-only, or swapped only over a damaged version)."""

    FIX: ClassVar[str] = "publish the artifact again to replace it (`fusedspec publish`)"
    ERROR: ClassVar[type[InputError]] = StoreError

    schema_version: Literal[2] = Field(default=2, alias="schema")
    key: str = Field(pattern=KEY_PATTERN, description="content key of the build (the version directory name)")
    # absent (None, []) only in manifests written before builds had graph keys
    graph_key: str | None = Field(default=None, pattern=KEY_PATTERN,
                                  description="what shapes the compiled programs (compile/content_key.py)")
    weight_key: str | None = Field(default=None, pattern=KEY_PATTERN,
                                   description="which weights the version holds")
    programs: list[str] = Field(default_factory=list, max_length=MAX_FILES,
                                description="the files that are compiled programs, the same in every version "
                                            "of this graph key")
    backend: str
    config_path: str = Field(description="{target}/{draft}/{spec slug}, relative to the store root")
    attempt: str = Field(pattern=SEGMENT_PATTERN, description="directory under the version holding its files")
    spec: BuildSpec
    models: Models
    tokenizer_hash: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    toolchain: dict[str, str]
    code_version: str
    options: dict[str, JsonValue]
    files: dict[str, FileEntry] = Field(min_length=1, max_length=MAX_FILES)
    validated: bool = Field(
        description="true when the artifact passed the greedy gate; LATEST names only these")
    validation: ValidationSummary | None = None
    producer: Producer
    created_at: str = Field(pattern=TIMESTAMP_PATTERN)
    signature: Signature | None = None

    model_config = Document.model_config | {"populate_by_name": True, "serialize_by_alias": True}

    @field_validator("config_path")
    @classmethod
    def _config_path(cls, value: str) -> str:
        parts = value.split("/")
        if len(parts) != 3 or not all(re.match(SEGMENT_PATTERN, p) for p in parts):
            raise ValueError(f"config_path {value!r} is not {{target}}/{{draft}}/{{spec slug}}")
        return value

    @field_validator("files")
    @classmethod
    def _file_paths(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        return relative_keys(files)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        strays = sorted(set(self.programs) - set(self.files))
        if strays:
            raise ValueError(f"programs {strays[:3]} are not files of the version")
        if self.validated and (self.validation is None or not self.validation.passed):
            raise ValueError("validated is true but the validation summary does not say passed")
        if self.spec.backend != self.backend:
            raise ValueError(f"backend {self.backend!r} differs from the spec's {self.spec.backend!r}")
        return self

    def unsigned_bytes(self) -> bytes:
        """What a signature covers: the canonical encoding without the signature."""
        return self.model_copy(update={"signature": None}).to_bytes()

    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())


class LatestPointer(Document):
    """LATEST: which version of a config is the newest validated one, and which it named before."""

    FIX: ClassVar[str] = "publish a validated version again to rewrite it"
    ERROR: ClassVar[type[InputError]] = StoreError

    key: str = Field(pattern=KEY_PATTERN)
    version: str
    history: list[str] = Field(default_factory=list, max_length=1000)
    updated_at: str = Field(pattern=TIMESTAMP_PATTERN)


def json_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (2020-12), as shipped in registry/manifest.schema.json."""
    schema = Manifest.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://fusedspec.invalid/manifest.schema.json", **schema}
