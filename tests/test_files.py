"""core/files.py: the one temp-then-rename writer every file write goes through, and the file hashes
remembered by stat."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.core.errors import DiskFullError
from fusedspec.core.files import atomic_write, is_temp_name, temp_beside


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "build.json"
    atomic_write(target, "old")
    atomic_write(target, b"new")
    assert target.read_text() == "new"
    assert [path.name for path in target.parent.iterdir()] == ["build.json"]


def test_a_full_disk_inside_the_block_is_one_clear_error_and_no_temp_is_left(tmp_path: Path) -> None:
    # /dev/full answers every write with ENOSPC: a real full disk, without filling one.
    target = tmp_path / "manifest.json"
    with pytest.raises(DiskFullError, match=rf"no space left in {tmp_path} while publishing manifest.json"):
        with temp_beside(target, "publishing manifest.json", 3 << 20) as tmp:
            assert is_temp_name(tmp.name) and tmp.parent == tmp_path
            tmp.write_bytes(b"half")
            with open("/dev/full", "wb") as full:
                full.write(b"x" * 4096)
                full.flush()
    assert list(tmp_path.iterdir()) == []


def test_any_other_error_passes_through_and_the_temp_is_removed(tmp_path: Path) -> None:
    with pytest.raises(PermissionError):
        with temp_beside(tmp_path / "x", "writing x") as tmp:
            tmp.write_bytes(b"half")
            raise PermissionError("not a full disk")
    assert list(tmp_path.iterdir()) == []


def test_a_digest_taken_as_a_file_was_read_is_kept_only_while_the_file_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import os

    from fusedspec.core import files

    path = tmp_path / "weights.bin"
    path.write_bytes(b"loaded" * 1000)
    with open(path, "rb") as handle:
        opened, data = os.fstat(handle.fileno()), handle.read()
    hasher = files.FileHasher(tmp_path / "cache")
    hasher.remember(path, opened, len(data), hashlib.sha256(data).hexdigest())
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: pytest.fail(f"{p} was read again"))
    assert files.FileHasher(tmp_path / "cache").sha256(path) == hashlib.sha256(data).hexdigest()

    path.write_bytes(b"changed" * 1000)  # after the read: the digest is not this file's any more
    monkeypatch.setattr(files, "sha256_file", real)
    assert files.FileHasher(tmp_path / "cache").sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    stale = os.stat(path)
    path.write_bytes(b"again" * 1000)  # a digest offered for a stat the file no longer has is not kept
    hasher.remember(path, stale, stale.st_size, "0" * 64)
    assert files.FileHasher(tmp_path / "cache").sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_rewrite_in_place_that_puts_mtime_back_is_hashed_anew(tmp_path: Path) -> None:
    import hashlib
    import os
    import time

    from fusedspec.core.files import FileHasher

    path = tmp_path / "weights.bin"
    path.write_bytes(b"before" * 1000)
    assert FileHasher(tmp_path / "cache").sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    stat = path.stat()
    time.sleep(0.05)  # past the filesystem clock's tick, so the rewrite's ctime is another
    with open(path, "r+b") as handle:  # same inode, same size
        handle.write(b"AFTER!")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime put back
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    assert FileHasher(tmp_path / "cache").sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
