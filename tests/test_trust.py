"""compile/trust.py: a loader given a FileHasher hashes what it reads; a file changed since is hashed anew."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fusedspec.compile.trust import LoadTrust
from fusedspec.core import files


def test_the_loader_hands_its_digests_on_and_a_changed_file_is_hashed_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = tmp_path / "builds" / "key"
    (artifact / "weights").mkdir(parents=True)
    shard = artifact / "weights" / "tp0.safetensors"
    shard.write_bytes(bytes(range(256)) * 4096)
    trust = LoadTrust.for_directory(artifact, tmp_path / "builds")
    trust.hasher = files.FileHasher(tmp_path / "cache")
    with trust.open(artifact, "weights/tp0.safetensors") as reader:
        reader.read(100)  # a loader that stops early: the rest is read and hashed when the block ends
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: pytest.fail(f"{p} was read again"))
    digest = files.FileHasher(tmp_path / "cache").sha256(shard)
    assert digest == hashlib.sha256(shard.read_bytes()).hexdigest()

    shard.write_bytes(b"tampered" + shard.read_bytes())  # changed after the load: its digest no longer holds
    monkeypatch.setattr(files, "sha256_file", real)
    digest = files.FileHasher(tmp_path / "cache").sha256(shard)
    assert digest == hashlib.sha256(shard.read_bytes()).hexdigest()
