"""A store in a local directory (the default on a laptop), with the S3 store's semantics.

Every write goes to a hidden temp file in the destination directory and is then renamed into place
(`os.replace`), so a reader or a crash never sees half an object. Create-only writes use `os.link`,
which fails when the name exists; compare-and-swap holds an exclusive `flock` on a lock file beside
the key while it compares and replaces. Etags are the sha256 of the bytes. Hidden files (temp and
lock files) are never listed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compile.errors import StoreError
from registry.store import HASH_CHUNK, NotFound, ObjectInfo, PreconditionFailed, Progress, Store, sha256_file
from registry.uri import StoreURI


class LocalStore(Store):
    def __init__(self, uri: StoreURI) -> None:
        super().__init__(uri)
        assert uri.local_root is not None
        self.root = uri.local_root

    # Paths -------------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        # Keys come from our own code; a '..' here is a bug, not user input.
        assert ".." not in parts, key
        return self.root.joinpath(*parts)

    def _temp_beside(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"

    def _write_temp(self, path: Path, data: bytes) -> Path:
        tmp = self._temp_beside(path)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    # Interface ---------------------------------------------------------------------------------------
    def check(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} exists and is not a directory; give a directory path")

    def put_file(self, key: str, path: Path, *, sha256: str, progress: Progress | None = None) -> None:
        dest = self._path(key)
        tmp = self._temp_beside(dest)
        try:
            with open(path, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(HASH_CHUNK):
                    out.write(chunk)
                    self._count_sent(len(chunk))
                    if progress is not None:
                        progress(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        dest = self._path(key)
        tmp = self._write_temp(dest, data)
        self._count_sent(len(data))
        os.replace(tmp, dest)

    def create(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        tmp = self._write_temp(dest, data)
        self._count_sent(len(data))
        try:
            os.link(tmp, dest)  # atomic, and fails if the name exists: create-only
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    @contextmanager
    def _locked(self, dest: Path) -> Iterator[None]:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock_path = dest.parent / f".{dest.name}.lock"
        with open(lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def swap(self, key: str, data: bytes, *, expected_etag: str | None) -> str:
        dest = self._path(key)
        with self._locked(dest):
            current = hashlib.sha256(dest.read_bytes()).hexdigest() if dest.is_file() else None
            if current != expected_etag:
                raise PreconditionFailed(f"{key}: etag is {current}, expected {expected_etag}")
            tmp = self._write_temp(dest, data)
            self._count_sent(len(data))
            os.replace(tmp, dest)
        return hashlib.sha256(data).hexdigest()

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(self.describe(key)) from exc
        return data, hashlib.sha256(data).hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        # No object metadata on a plain filesystem: the recorded sha256 is the bytes' own.
        digest = sha256_file(path)
        return ObjectInfo(key=key, size=path.stat().st_size, sha256=digest, etag=digest)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        found = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith("."):
                    continue  # temp and lock files are not objects
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                found.append(ObjectInfo(key=key, size=path.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    def copy(self, src_key: str, dst_key: str, *, sha256: str) -> None:
        src, dest = self._path(src_key), self._path(dst_key)
        if not src.is_file():
            raise NotFound(self.describe(src_key))
        tmp = self._temp_beside(dest)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        path = self._path(key)
        if not path.is_file():
            raise NotFound(self.describe(key))
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                yield chunk
