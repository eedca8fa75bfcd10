"""Verifying published versions: a changed byte, a missing or extra object, an incomplete version, LATEST."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fusedspec.core.errors import StoreError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.verify import verify_version

SHARD = "weights/tp1_sharded_checkpoint.safetensors"


@pytest.fixture
def published_s3(seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory):  # noqa: ANN001, ANN201
    root = f"s3://{s3_bucket}/v"
    result = publish_artifact(artifact_factory(k=4), root, s3_settings)
    return seaweed, s3_bucket, root, result


def test_one_changed_byte_in_s3_fails_naming_the_file(
        published_s3, s3_settings: Settings, capsys, monkeypatch) -> None:  # noqa: ANN001
    seaweed, bucket, root, result = published_s3
    client = seaweed.client()
    key = f"v/{result.config_path}/{result.key}/{result.attempt}/{SHARD}"
    original = client.get_object(Bucket=bucket, Key=key)
    data = bytearray(original["Body"].read())
    data[len(data) // 2] ^= 0x01
    # Same size, same metadata: the object's etag (the store's own) still tells, without reading it.
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=original["Metadata"])

    for quick in (True, False):
        report = verify_version(result.version_uri, s3_settings, quick=quick)
        assert not report.ok and len(report.problems) == 1
        assert report.problems[0].startswith(f"{SHARD}: changed since it was published")
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    assert main(["verify", result.version_uri, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and SHARD in out["problems"][0]
    assert main(["verify", f"{root}/{result.config_path}", "--quick"]) == 1  # via LATEST, plain text
    assert f"- {SHARD}: changed" in capsys.readouterr().out
    assert main(["verify", result.files_uri]) == 1  # the attempt directory a pod mounts


def test_only_reading_the_bytes_finds_a_change_that_kept_size_and_mtime(
        tmp_path: Path, artifact_factory) -> None:  # noqa: ANN001
    settings = Settings(work_dir=tmp_path)
    root = tmp_path / "store"
    result = publish_artifact(artifact_factory(k=3), str(root), settings)
    shard = root / result.config_path / result.key / result.attempt / SHARD
    stat = shard.stat()
    with open(shard, "r+b") as handle:  # in place: same inode, same size
        handle.write(bytes([handle.read(1)[0] ^ 0xFF]))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old mtime
    assert verify_version(result.version_uri, settings, quick=True).ok  # a listing cannot tell
    report = verify_version(result.version_uri, settings)
    assert not report.ok and report.problems[0].startswith(f"{SHARD}: sha256 ")


def test_missing_and_extra_objects_are_named(published_s3, s3_settings: Settings) -> None:  # noqa: ANN001
    seaweed, bucket, _root, result = published_s3
    client = seaweed.client()
    prefix = f"v/{result.config_path}/{result.key}/{result.attempt}"
    client.delete_object(Bucket=bucket, Key=f"{prefix}/tokenizer.json")
    client.put_object(Bucket=bucket, Key=f"{prefix}/stray.bin", Body=b"x")
    problems = verify_version(result.version_uri, s3_settings).problems
    assert problems == ["tokenizer.json: missing from the store",
                        "stray.bin: in the version but not in its manifest"]


def test_local_store_changed_byte_and_incomplete_version(tmp_path: Path, artifact_factory,
                                                         capsys) -> None:  # noqa: ANN001
    settings = Settings(work_dir=tmp_path)
    root = tmp_path / "store"
    result = publish_artifact(artifact_factory(k=3), str(root), settings)
    version_dir = root / result.config_path / result.key
    assert verify_version(str(version_dir), settings).ok
    shard = version_dir / result.attempt / SHARD
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = verify_version(str(version_dir), settings)
    assert not report.ok and report.problems[0].startswith(SHARD)

    # A version directory without its manifest (an interrupted publish) is incomplete: exit 1.
    (version_dir / "manifest.json").unlink()
    assert main(["verify", str(version_dir)]) == 1
    assert "incomplete" in capsys.readouterr().out
    # The config's LATEST now names a version with no manifest: also a failed check, not a pass.
    assert not verify_version(str(root / result.config_path), settings).ok


def test_nothing_at_uri_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="nothing to verify"):
        verify_version(str(tmp_path / "empty"), Settings(work_dir=tmp_path))


def test_runtime_check_uses_the_backend(tmp_path: Path, artifact_factory) -> None:  # noqa: ANN001
    from fusedspec.compile.backend import get_backend

    try:
        backend = get_backend("cpu")
    except ImportError as exc:
        pytest.skip(f"cpu backend not importable yet: {exc}")
    if not hasattr(backend, "runtime_mismatches"):
        pytest.skip("cpu backend has no runtime_mismatches yet")
    settings = Settings(work_dir=tmp_path)
    root = tmp_path / "store"
    result = publish_artifact(artifact_factory(k=3), str(root), settings)
    assert verify_version(str(root / result.config_path), settings, runtime_check=True).ok
    manifest_path = root / result.config_path / result.key / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["toolchain"]["torch"] = "0.0.1"  # as if built by another torch
    manifest_path.write_text(json.dumps(manifest))
    report = verify_version(str(root / result.config_path), settings, runtime_check=True)
    assert not report.ok and any(p.startswith("runtime:") and "torch" in p for p in report.problems)
