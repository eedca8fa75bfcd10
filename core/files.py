"""Files on local disk, the one way fusedspec handles them: atomic writes, cross-process locks, sha256.

    atomic_write(path, data)     temp file beside `path`, fsync, rename: readers see old or new, never half
    temp_beside(path, what)      the temp file those writes go through, for writers that stream or link
    file_lock(path)              an exclusive lock across threads and processes (filelock; safe on NFS too)
    lock_if_free / shared_lock   that lock only if free; a shared one that keeps it from being taken
    sha256_file(path)            hex sha256 of a file's bytes
    FileHasher(cache_dir)        sha256 of a file, remembered by (path, size, mtime, inode, ctime) so an
                                 unchanged file is hashed once, across commands and processes; `remember`
                                 takes the digest of a reader that hashed the file as it read it
                                 (compile.trust)
    unchanged(before, now)       two stats of one path are the same file with the same bytes
    disk_full(error, directory, what)  the DiskFullError a full disk (ENOSPC/EDQUOT) becomes

Why a hash cache: a local Qwen3-32B checkpoint is 64 GB; planning, validating and publishing each
used to hash it again. A file whose size, mtime and inode are unchanged has the same bytes for every
writer that does not forge timestamps, which is the trust model of every build cache (make, ccache).
The cache also keys on ctime, which a writer cannot set back: a rewrite in place that restores mtime is hashed
anew (a hard link or chmod moves it too, which costs one more hash of that file).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from fusedspec.core.errors import DiskFullError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` so that no reader or crash ever sees a partial file."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    with temp_beside(path, f"writing {path.name}", len(payload)) as tmp:
        write_synced(tmp, payload)
        os.replace(tmp, path)


@contextmanager
def temp_beside(path: Path, what: str, size: int | None = None) -> Iterator[Path]:
    """A fresh temp path beside `path` for the block to fill and then rename or link into place.

    The temp file is removed whatever happens (after a rename there is nothing left to remove). It is
    hidden (a leading dot) so listings and publishes skip it if a crash leaves it, and it sits in the
    destination's directory so the rename stays on one filesystem. A full disk inside the block becomes
    the DiskFullError saying where and while doing `what`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        yield tmp
    except OSError as exc:
        full = disk_full(exc, path.parent, what, size)
        if full is None:
            raise
        raise full from None
    finally:
        tmp.unlink(missing_ok=True)


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it, so a rename after this never exposes a file the disk lacks."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def is_temp_name(name: str) -> bool:
    """The names temp_beside gives files that are not finished yet."""
    return name.startswith(".") and ".tmp-" in name


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed) for the block: one holder across the threads
    and processes of every host that shares the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path), is_singleton=False, thread_local=False):
        yield


@contextmanager
def lock_if_free(path: Path) -> Iterator[bool]:
    """The lock on `path` if nobody holds it (True inside the block), else False at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), is_singleton=False, thread_local=False, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextmanager
def shared_lock(path: Path) -> Iterator[None]:
    """Hold a shared lock on `path` (created if needed) for the block: any number of holders, while
    `lock_if_free` and `file_lock` (exclusive) wait or give up. flock(2), the kind FileLock takes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def free_bytes(directory: Path) -> int | None:
    """Bytes this user may still write under `directory` (None when it cannot be told)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def disk_full(exc: BaseException, directory: Path, what: str, needed: int | None = None, *,
              more_than: int | None = None) -> DiskFullError | None:
    """The error to raise instead of `exc` when it is a full disk or quota, else None. `needed` is the
    size being written; `more_than` what was free when the writing began (it needed more than that)."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_FULL_ERRNOS:
        return None
    if more_than is not None and not needed:
        space = f"{more_than / 2**20:.1f} MiB were free when it began; it needed more"
    else:
        free = free_bytes(directory)
        space = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
        space += f"; it needed about {needed / 2**20:.1f} MiB" if needed else ""
    return DiskFullError(f"no space left in {directory} while {what} ({space}); free space there or point "
                         "FUSEDSPEC_WORK_DIR / TMPDIR at a larger disk, then run the same command again "
                         "(nothing half-written was kept)")


class FileHasher:
    """sha256 of files, computed once per (path, size, mtime, inode, ctime) and remembered under
    `cache_dir`."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.cache_dir = Path(cache_dir) / "file-hashes" if cache_dir is not None else None
        self._memo: dict[str, str] = {}
        self._lock = threading.Lock()

    def sha256(self, path: Path) -> str:
        path = Path(path).resolve()
        entry = _entry(path, path.stat())
        with self._lock:
            if entry in self._memo:
                return self._memo[entry]
        cached = self._read(entry)
        if cached is None:
            cached = sha256_file(path)
            self._write(entry, cached)
        with self._lock:
            self._memo[entry] = cached
        return cached

    def remember(self, path: Path, opened: os.stat_result, size: int, digest: str) -> None:
        """Take `digest`, the sha256 of all `size` bytes a reader read from `path` through a handle whose
        fstat was `opened`, as the file's hash: only while `path` is still that file, unchanged (else the
        next `sha256` reads it anew)."""
        path = Path(path).resolve()
        try:
            now = path.stat()
        except OSError:
            return
        if _stamp(now) != _stamp(opened) or size != now.st_size:
            return
        entry = _entry(path, now)
        self._write(entry, digest)
        with self._lock:
            self._memo[entry] = digest

    def _read(self, entry: str) -> str | None:
        if self.cache_dir is None:
            return None
        try:
            value = (self.cache_dir / entry[:2] / entry).read_text().strip()
        except OSError:
            return None
        return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None

    def _write(self, entry: str, digest: str) -> None:
        if self.cache_dir is None:
            return
        try:
            atomic_write(self.cache_dir / entry[:2] / entry, digest)
        except (OSError, DiskFullError):
            pass  # a cache that cannot be written only costs a re-hash next time


def unchanged(before: os.stat_result, now: os.stat_result) -> bool:
    """`now` is the file `before` was, holding the same bytes (for writers that do not forge mtime): size,
    mtime, inode and device. ctime is left out: another build hard-linking the same program (the program
    cache) moves it without changing a byte, and FileHasher's key, which has it, hashes such a file anew."""
    return _stamp(before)[:4] == _stamp(now)[:4]


def _stamp(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file is unchanged for FileHasher: size, mtime, inode, device and ctime."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev, stat.st_ctime_ns


def _entry(path: Path, stat: os.stat_result) -> str:
    stamp = json.dumps([str(path), *_stamp(stat)])
    return hashlib.sha256(stamp.encode()).hexdigest()
