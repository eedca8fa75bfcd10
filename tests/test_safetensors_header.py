"""compile/safetensors_header.py: safetensors' own safe_open decides, and each refusal names the file and
says what is wrong (the tensor a truncated file cuts off), in milliseconds whatever the file's size."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from fusedspec.compile.safetensors_header import check_safetensors_file
from fusedspec.core.errors import CheckpointError


def _header(entries: dict[str, object]) -> bytes:
    raw = json.dumps(entries).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file({"model.embed": np.zeros((64, 32), dtype=np.float32),
               "model.norm": np.ones(32, dtype=np.float32)}, str(path))
    return path.read_bytes()


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) // 2], r"tensor 'model.\w+' needs bytes \d+\.\.\d+ of the data, but the file holds "
                                 r"\d+; the file is truncated"),
    (lambda b: b[:100], "100 bytes cannot hold the safetensors header it starts with"),
    (lambda b: b[:4], "4 bytes cannot hold the safetensors header"),
    (lambda b: b + b"\0" * 16,
     "bytes after its last tensor that its safetensors header does not account for"),
    (lambda b: struct.pack("<Q", 9) + b"{not json", r"safetensors header is malformed \(invalid JSON"),
    (lambda b: _header({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}) + b"\0" * 8,
     r"malformed \(invalid shape, data type, or offset"),
    (lambda b: _header({"w": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}) + b"\0" * 8, "F99"),
    (lambda b: struct.pack("<Q", 2) + b"[]", "malformed"),
], ids=["truncated", "100-bytes", "4-bytes", "trailing-bytes", "not-json", "wrong-span", "unknown-dtype",
        "a-list"])
def test_a_damaged_file_is_refused_naming_the_file_and_what_is_wrong(
        good: bytes, tmp_path: Path, damage: Callable[[bytes], bytes], words: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(damage(good))
    with pytest.raises(CheckpointError, match=words) as info:
        check_safetensors_file(path)
    assert str(info.value).startswith(f"{path}: ") and \
        "re-download or re-convert the checkpoint" in str(info.value)


def test_a_whole_file_passes_and_a_missing_one_is_refused(good: bytes, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(good)
    check_safetensors_file(path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        check_safetensors_file(tmp_path / "absent.safetensors")
