"""The artifact store interface: what publishing, verifying and listing need from a bucket or a dir.

Keys are relative to the store root (the URI's prefix or directory) and use '/'. Two implementations
keep the same semantics: `registry.local_store.LocalStore` and `registry.s3_store.S3Store`.

    put_file(key, path, sha256=)   upload a file (multipart and parallel when large); the store checks
                                   the bytes it receives against their sha256 and keeps its own checksum
    put_bytes(key, data)           plain overwrite of a small object
    create(key, data) -> bool      create-only (If-None-Match: *); False when the key already exists
    swap(key, data, expected_etag) compare-and-swap (If-Match; None = must be absent) -> new etag
    copy(src, dst, if_match=)      server-side copy of the source exactly as it was when its etag was read
    head / list                    size, etag and the store's own checksum of objects (no bytes read)
    list_uploads / abort_upload    unfinished (multipart) uploads, e.g. of a killed publisher
    now()                          the store's own clock: the server's Date (S3), a fresh file's mtime (a
                                   directory). Leases (registry.attempts, registry.claims) are judged by it,
                                   never by this host's clock, which may be minutes off another writer's
    get / get_with_etag / delete / iter_bytes / hash_object / exists / holds_objects

Two store-level signals are plain exceptions, not user errors: `NotFound` for a missing key and
`PreconditionFailed` for a lost create-only or compare-and-swap race. Everything a user must fix
(endpoint, credentials, bucket) is a `core.errors.StoreError`. An object the store lists but cannot
return (a server answering 500 for it while it answers everything else) is `core.errors.UnreadableObject`
(exit 1), raised within seconds, never after the whole retry deadline.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fusedspec.registry.uri import StoreURI

HASH_CHUNK = 1 << 20
Progress = Callable[[int], None]  # called with the number of bytes just sent


class NotFound(FileNotFoundError):
    """The key does not exist in the store."""


class PreconditionFailed(Exception):
    """A create-only write found the key present, or a compare-and-swap found another etag."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about an object without reading it.

    `checksum` is the store's own checksum of the bytes it holds (S3: the server-computed SHA256, full or
    composite of parts; a directory: the sha256 of the file), comparable with `Store.expected_checksum`
    of a local file; None when the store has none (objects written without one). `etag` changes whenever
    the bytes do. Both come from the store, never from what a writer claimed.
    """

    key: str
    size: int
    etag: str | None = None
    checksum: str | None = None


@dataclass(frozen=True)
class Upload:
    """An unfinished upload (S3 multipart upload, a directory store's temp file) and when it began."""

    key: str
    upload_id: str
    initiated: float  # seconds since the epoch


ObjectInfos = list[ObjectInfo]  # aliases: inside Store, `list` names the method
Uploads = list[Upload]
Keys = list[str]


class Store(ABC):
    """One artifact store rooted at `uri`. Thread-safe for concurrent `put_file` calls."""

    uri: StoreURI

    def __init__(self, uri: StoreURI) -> None:
        self.uri = uri
        self._sent_lock = threading.Lock()
        self._bytes_sent = 0

    # Counting -------------------------------------------------------------------------------------
    @property
    def bytes_sent(self) -> int:
        """Bytes of object content this store has sent since it was opened (retries included)."""
        with self._sent_lock:
            return self._bytes_sent

    def _count_sent(self, nbytes: int) -> None:
        with self._sent_lock:
            self._bytes_sent += nbytes

    def parent(self) -> Store:
        """The same store (connection, counters) rooted one level up."""
        clone = copy.copy(self)
        clone._set_root(self.uri.parent())
        return clone

    def _set_root(self, uri: StoreURI) -> None:
        self.uri = uri

    def describe(self, key: str = "") -> str:
        """A printable URI for a key (no credentials ever appear in URIs)."""
        return str(self.uri.child(key)) if key else str(self.uri)

    # The interface ---------------------------------------------------------------------------------
    @abstractmethod
    def check(self) -> None:
        """Raise StoreError unless the store is reachable, the credentials work and the root exists."""

    @abstractmethod
    def put_file(self, key: str, path: Path, *, sha256: str, progress: Progress | None = None) -> None:
        """Write a file's bytes to `key` atomically (readers see the old object or the whole new one).
        ArtifactError when the bytes read do not hash to `sha256` (the file changed since it was hashed)."""

    @abstractmethod
    def expected_checksum(self, path: Path, sha256: str) -> str:
        """The checksum this store reports (ObjectInfo.checksum) for an object holding `path`'s bytes,
        whose sha256 (hex) is `sha256`. ArtifactError when a store that reads the file to compute it
        finds bytes that do not hash to `sha256` (the file changed since it was hashed)."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Overwrite `key` with `data` atomically."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write `data` only if `key` does not exist. True when this call created it."""

    @abstractmethod
    def swap(self, key: str, data: bytes, *, expected_etag: str | None) -> str:
        """Replace `key` only if its etag is `expected_etag` (None: only if absent). Returns the new etag.

        Raises PreconditionFailed when another writer got there first.
        """

    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and etag. Raises NotFound."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size, recorded sha256 and etag of `key`, or None when it does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> ObjectInfos:
        """Every object under `prefix` (recursive), sorted by key."""

    @abstractmethod
    def copy(self, src_key: str, dst_key: str, *, if_match: str) -> None:
        """Copy inside the store without sending the bytes again, only if the source's etag is still
        `if_match` (PreconditionFailed otherwise): the copy holds exactly the bytes that etag named."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; no error when it is already gone."""

    @abstractmethod
    def iter_bytes(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks. Raises NotFound."""

    @abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds since the epoch (what it stamps objects with when they are
        written)."""

    @abstractmethod
    def list_uploads(self, prefix: str = "") -> Uploads:
        """Unfinished uploads under `prefix` (they hold space but are no object)."""

    @abstractmethod
    def abort_upload(self, upload: Upload) -> None:
        """Drop an unfinished upload; no error when it is already gone."""

    # Helpers built on the interface ----------------------------------------------------------------
    def get(self, key: str) -> bytes:
        return self.get_with_etag(key)[0]

    def remove_empty_dirs(self, *, dry_run: bool = False) -> Keys:
        """Remove the directories under the root that hold nothing (a directory store; S3 has none); their
        keys. Writers make a directory again when it vanished under them (registry.local_store)."""
        return []

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def holds_objects(self, prefix: str) -> bool:
        """Whether anything is stored under `prefix` (implementations stop at the first object)."""
        return bool(self.list(prefix))

    def hash_object(self, key: str) -> tuple[int, str]:
        """(size, hex sha256) of the object's actual bytes, read from the store."""
        digest = hashlib.sha256()
        size = 0
        for chunk in self.iter_bytes(key):
            digest.update(chunk)
            size += len(chunk)
        return size, digest.hexdigest()
