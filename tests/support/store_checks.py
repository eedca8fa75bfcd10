"""What tests look for in a store after publishing, and damage done to it from outside fusedspec.

    StoreSite        a store root of one test (S3 bucket prefix on the session's SeaweedFS, or a directory)
                     with the raw access an outsider has: .corrupt(key), .remove(key), .raw_put(key, data)
    damage_version(site, version, name, how)   one file of a published version deleted or corrupted (other
                     bytes, same size) from outside, as `publish` and `run` must repair
    leftovers(...)   what remains of a version besides its manifest and the attempt that manifest names:
                     objects, unfinished uploads (S3 multipart, a directory's temp files), markers
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedspec.core.settings import Settings
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store

MiB = 1 << 20


@dataclass
class StoreSite:
    kind: str  # "s3" | "local"
    root: str  # the store URI publishes and readers are given
    settings: Settings
    client: Any = None  # a boto3 S3 client (s3): an outsider's access to the bucket
    bucket: str | None = None
    prefix: str = ""

    def store(self, **tuning: Any) -> Store:
        return open_store(self.root, self.settings, **(tuning if self.kind == "s3" else {}))

    def child(self, name: str) -> StoreSite:
        """The same kind of store under `name` (a trial of its own: its own LATEST, markers and blobs)."""
        return StoreSite(self.kind, f"{self.root}/{name}", self.settings, self.client, self.bucket,
                         f"{self.prefix}/{name}".strip("/"))

    def _path(self, key: str) -> Path:
        return Path(self.root) / key

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}".strip("/")

    def raw_get(self, key: str) -> bytes:
        if self.kind == "s3":
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read())
        return self._path(key).read_bytes()

    def raw_put(self, key: str, data: bytes) -> None:
        """Write an object as anyone with write access could: S3 keeps the object's user metadata, and
        the server computes a SHA256 of the new bytes; a directory file is rewritten in place."""
        if self.kind == "s3":
            head = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
            self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data,
                                   Metadata=head["Metadata"], ChecksumAlgorithm="SHA256")
        else:
            self._path(key).parent.mkdir(parents=True, exist_ok=True)
            self._path(key).write_bytes(data)

    def corrupt(self, key: str, *, keep_mtime: bool = False) -> None:
        """Other bytes of the same size (one byte flipped). On a directory with `keep_mtime`, in place with
        the old mtime, as silent disk corruption leaves a file: its size, inode and mtime unchanged."""
        data = bytearray(self.raw_get(key))
        data[len(data) // 2] ^= 0xFF
        if self.kind == "local" and keep_mtime:
            path = self._path(key)
            stat = path.stat()
            with open(path, "r+b") as handle:
                handle.seek(len(data) // 2)
                handle.write(bytes([data[len(data) // 2]]))
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            return
        self.raw_put(key, bytes(data))

    def remove(self, key: str) -> None:
        if self.kind == "s3":
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))
        else:
            self._path(key).unlink()


def damage_version(site: StoreSite, version: Any, name: str, how: str) -> str:
    """Delete (`how="deleted"`) or corrupt (`"corrupted"`: other bytes, same size) the file `name` of a
    published version (anything with config_path, key and attempt: a PublishResult, a Manifest)."""
    key = f"{version.config_path}/{version.key}/{version.attempt}/{name}"
    if how == "deleted":
        site.remove(key)
    elif how == "corrupted":
        site.corrupt(key)
    else:
        raise ValueError(f"damage {how!r}: say deleted or corrupted")
    return name


def leftovers(store: Store, config: str, key: str, attempt: str) -> list[str]:
    """What remains in the store of this version besides its manifest and the attempt it names."""
    version = f"{config}/{key}"
    stray = [o.key for o in store.list(version) if not o.key.startswith(f"{version}/{attempt}/")
             and o.key != f"{version}/manifest.json"]
    stray += [f"upload {u.key}" for u in store.list_uploads(version)]
    stray += [o.key for o in store.list(f".attempts/{version}")]
    local = store.uri.local_root
    if local is not None:  # a directory store: no temp file anywhere under the version
        stray += [str(p) for p in (local / version).rglob(".*") if p.is_file() and ".lock" not in p.name]
    return stray
