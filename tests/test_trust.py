"""compile/trust.py: a loader given a FileHasher hashes what it reads and keeps each digest. Validation's
content hash is of the bytes the loader used: a file changed or gone since it was read is refused, naming
it, never hashed anew; a file no loader read is hashed only while it is the file it was before the load;
and native code the loader would run by path runs from a private copy of the bytes it hashed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fusedspec.compile.artifact_files import artifact_paths
from fusedspec.compile.documents.validation import content_hash
from fusedspec.compile.trust import LoadTrust
from fusedspec.core import files
from fusedspec.core.errors import ArtifactError
from fusedspec.validate.greedy import ran_content_hash

SHARD = "weights/tp0.safetensors"


def _loaded_artifact(tmp_path: Path) -> tuple[Path, LoadTrust]:
    """A build of this work dir with a shard and a tokenizer, the shard read by a loader that hashes."""
    artifact = tmp_path / "builds" / "key"
    (artifact / "weights").mkdir(parents=True)
    (artifact / SHARD).write_bytes(bytes(range(256)) * 4096)
    (artifact / "tokenizer.json").write_text("{}")
    trust = LoadTrust.for_directory(artifact, tmp_path / "builds")
    trust.hasher = files.FileHasher(tmp_path / "cache")
    return artifact, trust


def test_the_content_hash_is_of_the_bytes_loaded_and_a_file_changed_since_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact, trust = _loaded_artifact(tmp_path)
    shard = artifact / SHARD
    before = {rel: path.stat() for rel, path in artifact_paths(artifact)}
    with trust.open(artifact, SHARD) as reader:
        reader.read(100)  # a loader that stops early: the rest is read and hashed when the block ends
    loaded = hashlib.sha256(shard.read_bytes()).hexdigest()
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file",
                        lambda p: pytest.fail(f"{p} read again") if Path(p).name == shard.name else real(p))
    expected = content_hash([(SHARD, loaded), ("tokenizer.json", hashlib.sha256(b"{}").hexdigest())])
    assert trust.hasher is not None and ran_content_hash(artifact, trust, trust.hasher, before) == expected
    assert files.FileHasher(tmp_path / "cache").sha256(shard) == loaded  # publishing reads it no more

    swap = shard.with_name("swap")  # zeroed after the load, same size, renamed over it
    swap.write_bytes(bytes(shard.stat().st_size))
    swap.replace(shard)
    with pytest.raises(ArtifactError, match=f"{SHARD}: changed since the loader read it"):
        ran_content_hash(artifact, trust, trust.hasher, before)
    shard.unlink()
    with pytest.raises(ArtifactError, match=f"{SHARD}: gone since the loader read it"):
        ran_content_hash(artifact, trust, trust.hasher, before)


def test_a_file_no_loader_read_is_hashed_only_while_it_is_the_file_it_was_before_the_load(
        tmp_path: Path) -> None:
    artifact, trust = _loaded_artifact(tmp_path)
    before = {rel: path.stat() for rel, path in artifact_paths(artifact)}
    trust.verify_file(artifact, SHARD)
    assert trust.hasher is not None
    swap = artifact / "swap.tmp"
    swap.write_text('{"model": "another"}')
    swap.replace(artifact / "tokenizer.json")  # after validation began, before its content hash
    with pytest.raises(ArtifactError, match="tokenizer.json: changed while it was being validated"):
        ran_content_hash(artifact, trust, trust.hasher, before)
    (artifact / "extra.bin").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="extra.bin: appeared while it was being validated"):
        ran_content_hash(artifact, trust, trust.hasher, {**before, "tokenizer.json":
                                                         (artifact / "tokenizer.json").stat()})


def test_a_native_package_of_a_work_dir_build_runs_from_the_bytes_its_loader_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusedspec.compile.cpu import export, native

    artifact, trust = _loaded_artifact(tmp_path)
    rel = "programs/fused_step.aoti.pt2"
    package = artifact / rel
    package.parent.mkdir()
    package.write_bytes(b"an AOTInductor package" * 1000)
    ran: list[tuple[Path, bytes]] = []

    def load(path: Path, cpu_isa: object) -> object:
        ran.append((path, path.read_bytes()))
        return object()

    monkeypatch.setattr(export, "_load_package", load)
    monkeypatch.setattr(native, "check_host_isa", lambda isa, where: None)
    export.load_program(artifact, rel, trust, "x86-64-v3")
    [(path, data)] = ran
    assert path != package and data == package.read_bytes()  # a private copy: the path could change
    assert trust.loaded_sha256(artifact, rel) == hashlib.sha256(data).hexdigest()

    ran.clear()  # with nothing asking for digests (serving a build of this work dir), it loads where it is
    export.load_program(artifact, rel, LoadTrust.for_directory(artifact, tmp_path / "builds"), "x86-64-v3")
    assert [path for path, _ in ran] == [package]
