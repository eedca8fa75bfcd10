"""The content index: which object in the store already holds a given file's bytes, for copy-dedup.

    .blobs/<sha256>    {"key": an object written with these bytes, "size": ...}

A publisher writes pointers to its files once its version's manifest is committed (registry.publish),
so they name objects of committed versions, not of attempts that lose or die and are deleted.

A pointer is a hint, never trusted: before an object is copied, the store's own checksum of it (computed
by the server from the bytes it received, never the writer's metadata) must equal what the local file's
bytes give, and the copy is made only while the object still has the etag that was checked (S3
CopySourceIfMatch). A damaged or replaced object therefore fails the check and the file is uploaded
instead; it can never be copied into a new version.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.manifest import rel_path_problem
from fusedspec.core.errors import InputError, StoreError
from fusedspec.registry.store import NotFound, ObjectInfo, Store
from fusedspec.registry.uri import join_key

BLOBS = ".blobs"


class BlobPointer(Document):
    FIX: ClassVar[str] = "the next publish of that content rewrites it"
    ERROR: ClassVar[type[InputError]] = StoreError

    key: str = Field(min_length=1, max_length=2048)
    size: int = Field(ge=0)

    @field_validator("key")
    @classmethod
    def _inside_the_store(cls, key: str) -> str:
        problem = rel_path_problem(key)  # no '..', no absolute path: a pointer names an object of this store
        if problem:
            raise ValueError(problem)
        return key


def pointer_key(sha256: str) -> str:
    return join_key(BLOBS, sha256)


def trusted_source(store: Store, sha256: str, size: int, checksum: str) -> ObjectInfo | None:
    """An object whose stored bytes are the file's (its size and the store's checksum match), or None."""
    try:
        pointer = BlobPointer.parse_bytes(store.get(pointer_key(sha256)), BLOBS)
    except (NotFound, StoreError):
        return None  # no pointer, or a broken one that the next upload rewrites
    try:
        info = store.head(pointer.key)
    except StoreError:
        return None  # a key this store refuses to read (a directory store: a symlink on the way)
    if info is None or info.size != size or info.checksum != checksum or not info.etag:
        return None  # removed, replaced, or written without a checksum the store computed
    return info


def remember(store: Store, sha256: str, key: str, size: int) -> None:
    store.put_bytes(pointer_key(sha256), BlobPointer(key=key, size=size).to_bytes())
