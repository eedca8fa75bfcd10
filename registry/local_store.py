"""A store in a local directory (the default on a laptop), with the S3 store's semantics.

Every write goes to a hidden temp file in the destination directory and is then renamed into place
(`os.replace`), so a reader or a crash never sees half an object; a temp file is the directory store's
"unfinished upload" (`list_uploads`), which a sweep removes when its writer died. Create-only writes use
`os.link`, which fails when the name exists; compare-and-swap holds an exclusive lock on a lock file
beside the key while it compares and replaces (its etag is the sha256 of the small document's bytes).
A listed object's etag is `stat:<size>-<mtime>-<inode>`: free to read (a quick check of a 65 GB version
through a mount reads no byte) and changed by any write or replacement. Its checksum (head) is the
sha256 of the bytes, computed once per unchanged file (core.files.FileHasher).
Hidden files (temp and lock files) are never listed as objects. Symlinks are never followed out of the
root: a key whose path holds one is refused. The store's clock (`now`) is the mtime the filesystem gives a
file created in the root (on NFS, the server's clock, whichever host asks). A file the filesystem cannot
read (EIO) is `UnreadableObject`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from fusedspec.core.errors import ArtifactError, StoreError, UnreadableObject
from fusedspec.core.files import FileHasher, file_lock, is_temp_name, temp_beside
from fusedspec.registry.store import (
    HASH_CHUNK,
    Keys,
    NotFound,
    ObjectInfo,
    ObjectInfos,
    PreconditionFailed,
    Progress,
    Store,
    Upload,
    Uploads,
)
from fusedspec.registry.uri import StoreURI

FilesByKey = list[tuple[str, Path]]  # an alias: inside LocalStore, `list` names the method


def stat_etag(stat: os.stat_result) -> str:
    return f"stat:{stat.st_size}-{stat.st_mtime_ns}-{stat.st_ino}"


class LocalStore(Store):
    def __init__(self, uri: StoreURI, hasher: FileHasher | None = None) -> None:
        super().__init__(uri)
        assert uri.local_root is not None
        self.root = uri.local_root
        self.hasher = hasher or FileHasher(None)

    def _set_root(self, uri: StoreURI) -> None:
        super()._set_root(uri)
        assert uri.local_root is not None
        self.root = uri.local_root

    # Paths -------------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        # Keys come from our own code and from manifests checked by their model; '..' cannot reach here.
        if ".." in parts:
            raise StoreError(f"{self.describe(key)}: a key with '..' would leave the store root")
        path = self.root.joinpath(*parts)
        for parent in [path, *path.parents]:
            if parent == self.root:
                break
            if parent.is_symlink():
                raise StoreError(f"{parent}: a symlink inside the store; remove it (stores hold plain files)")
        return path

    @contextmanager
    def _write_temp(self, path: Path, data: bytes) -> Iterator[Path]:
        """A synced temp file beside `path` holding `data`, for the caller to rename or link into place."""
        with temp_beside(path, f"writing {path.name} into the store", len(data)) as tmp:
            with _create(tmp) as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            self._count_sent(len(data))
            yield tmp

    def _files_under(self, prefix: str) -> FilesByKey:
        """(key, path) of every file below `prefix`, sorted by key (directory symlinks are not entered)."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        paths = (Path(dirpath) / name for dirpath, _dirs, files in os.walk(base) for name in files)
        return sorted((path.relative_to(self.root).as_posix(), path) for path in paths)

    # Interface ---------------------------------------------------------------------------------------
    def check(self) -> None:
        """The root, or the nearest part of its path that exists, must be a directory: nothing can be
        stored under a regular file (and every reader or writer would fail there with an OSError)."""
        for path in [self.root, *self.root.parents]:
            if path.exists():
                if not path.is_dir():
                    where = "exists and is not a directory" if path == self.root else \
                        f"is under {path}, a file, not a directory"
                    raise StoreError(f"store {self.root} {where}; give a directory path")
                return

    def put_file(self, key: str, path: Path, *, sha256: str, progress: Progress | None = None) -> None:
        dest = self._path(key)
        digest = hashlib.sha256()
        with temp_beside(dest, f"publishing {path.name}", path.stat().st_size) as tmp:
            with open(path, "rb") as src, _create(tmp) as out:
                while chunk := src.read(HASH_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    self._count_sent(len(chunk))
                    if progress is not None:
                        progress(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != sha256:
                raise ArtifactError(f"{path} changed while it was being published (its bytes no longer hash "
                                    "to what was recorded); publish again when the artifact is complete")
            os.replace(tmp, dest)

    def expected_checksum(self, path: Path, sha256: str) -> str:
        return sha256

    def put_bytes(self, key: str, data: bytes) -> None:
        dest = self._path(key)
        with self._write_temp(dest, data) as tmp:
            os.replace(tmp, dest)

    def create(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        with self._write_temp(dest, data) as tmp:
            try:
                os.link(tmp, dest)  # atomic, and fails if the name exists: create-only
                return True
            except FileExistsError:
                return False

    def swap(self, key: str, data: bytes, *, expected_etag: str | None) -> str:
        dest = self._path(key)
        with file_lock(dest.parent / f".{dest.name}.lock"):
            current = hashlib.sha256(dest.read_bytes()).hexdigest() if dest.is_file() else None
            if current != expected_etag:
                raise PreconditionFailed(f"{key}: etag is {current}, expected {expected_etag}")
            with self._write_temp(dest, data) as tmp:
                os.replace(tmp, dest)
        return hashlib.sha256(data).hexdigest()

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(self.describe(key)) from exc
        except OSError as exc:
            raise _unreadable(path, exc) from None
        return data, hashlib.sha256(data).hexdigest()

    def _info(self, key: str, path: Path, *, checksum: bool) -> ObjectInfo:
        stat = path.stat()
        return ObjectInfo(key=key, size=stat.st_size, etag=stat_etag(stat),
                          checksum=self.hasher.sha256(path) if checksum else None)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file() or path.is_symlink():
            return None
        try:
            return self._info(key, path, checksum=True)
        except FileNotFoundError:  # deleted after the check above: absent, as it would be a moment later
            return None

    def list(self, prefix: str = "") -> ObjectInfos:
        # Temp and lock files are not objects; a symlink is never followed. A file another writer removes
        # between the walk and its stat was not there to list.
        found = []
        for key, path in self._files_under(prefix):
            if path.name.startswith(".") or path.is_symlink():
                continue
            stat = _stat_if_present(path)
            if stat is not None:
                found.append(ObjectInfo(key=key, size=stat.st_size, etag=stat_etag(stat), checksum=None))
        return found

    def copy(self, src_key: str, dst_key: str, *, if_match: str) -> None:
        src, dest = self._path(src_key), self._path(dst_key)
        if not src.is_file():
            raise NotFound(self.describe(src_key))
        with temp_beside(dest, f"copying {src.name} inside the store", src.stat().st_size) as tmp:
            if stat_etag(src.stat()) != if_match:
                raise PreconditionFailed(f"{src_key}: changed since it was checked")
            with _create(tmp) as out:
                for chunk in self.iter_bytes(src_key):  # a source the disk cannot read is UnreadableObject
                    out.write(chunk)
            if stat_etag(src.stat()) != if_match:  # written to while it was being copied
                raise PreconditionFailed(f"{src_key}: changed since it was checked")
            os.replace(tmp, dest)

    def delete(self, key: str) -> None:
        # Emptied directories stay: removing them would race a writer creating a file in them
        # (`fusedspec gc` removes them); they hold no object, so no reader sees them.
        self._path(key).unlink(missing_ok=True)

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        path = self._path(key)
        if not path.is_file():
            raise NotFound(self.describe(key))
        try:
            with open(path, "rb") as handle:
                while chunk := handle.read(HASH_CHUNK):
                    yield chunk
        except FileNotFoundError as exc:
            raise NotFound(self.describe(key)) from exc
        except OSError as exc:
            raise _unreadable(path, exc) from None

    def now(self) -> float:
        base = next((p for p in [self.root, *self.root.parents] if p.is_dir()), None)
        try:
            handle, name = tempfile.mkstemp(prefix=".fusedspec-clock.tmp-", dir=base)  # a temp: gc's if left
        except OSError:
            # a directory nobody here can write (a read-only copy): this host's is the only clock
            return time.time()
        try:
            return os.fstat(handle).st_mtime
        finally:
            os.close(handle)
            os.unlink(name)

    def remove_empty_dirs(self, *, dry_run: bool = False) -> Keys:
        removed: Keys = []
        if not self.root.is_dir():
            return removed
        gone: set[str] = set()
        for dirpath, dirs, files in os.walk(self.root, topdown=False):
            path = Path(dirpath)
            if path == self.root or files or any(str(path / d) not in gone for d in dirs):
                continue
            if not dry_run:
                try:
                    path.rmdir()
                except OSError:  # a writer put something there since the walk: it is not empty
                    continue
            gone.add(str(path))
            removed.append(path.relative_to(self.root).as_posix())
        return removed

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return path.is_file() and not path.is_symlink()  # no checksum computed: head's would hash the file

    def holds_objects(self, prefix: str) -> bool:
        base = self._path(prefix) if prefix else self.root
        for dirpath, _dirs, files in os.walk(base) if base.is_dir() else ():
            if any(not name.startswith(".") and not (Path(dirpath) / name).is_symlink() for name in files):
                return True  # the first object list() would show
        return False

    def list_uploads(self, prefix: str = "") -> Uploads:
        # A publisher racing this listing renames its temp files into place: one gone by its stat is no
        # longer an upload.
        temps = ((key, path, _stat_if_present(path)) for key, path in self._files_under(prefix)
                 if is_temp_name(path.name))
        return [Upload(key=key, upload_id=path.name, initiated=stat.st_mtime) for key, path, stat in temps
                if stat is not None]

    def abort_upload(self, upload: Upload) -> None:
        (self.root / upload.key).unlink(missing_ok=True)


def _create(tmp: Path) -> BinaryIO:
    """open(tmp, "wb"), making its directory again when `fusedspec gc` removed it (it was empty) between
    temp_beside making it and this open."""
    try:
        return open(tmp, "wb")
    except FileNotFoundError:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        return open(tmp, "wb")


def _unreadable(path: Path, exc: OSError) -> UnreadableObject:
    return UnreadableObject(str(path), f"reading it failed: {exc.strerror or exc}")


def _stat_if_present(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
