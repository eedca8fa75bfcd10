"""core/files.py: the one temp-then-rename writer every file write goes through."""

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
