"""programs.json: one entry of the work dir's program cache, written last (compile/program_cache.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.build import KEY_PATTERN
from fusedspec.compile.documents.manifest import relative_keys

PROGRAM_SET = "programs.json"


class ProgramSet(Document):
    """The compiled programs of one graph key: which files, how large, and where they came from."""

    FIX: ClassVar[str] = "remove the entry's directory; the next build compiles it again"

    graph_key: str = Field(pattern=KEY_PATTERN)
    backend: str
    files: dict[str, int] = Field(min_length=1,
                                  description="each program file (its path inside an artifact) -> its size "
                                              "in bytes")
    source: str = Field(min_length=1, max_length=4096,
                        description="'compiled' (by this work dir), or the signed version it was fetched "
                                    "from")

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, int]) -> dict[str, int]:
        return relative_keys(files)
