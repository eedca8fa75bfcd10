"""Where `fusedspec serve` gets its files (serve/source.py): an s3:// version is checked in the store (no byte
read), then synced into the cache dir in a mount's layout; a cached copy is reused while the published
manifest is unchanged, and a version damaged in the store is refused before anything is downloaded.
Loading then hashes every file (tests/test_serve_trust.py: a damaged cached copy is fetched again once)."""

from __future__ import annotations

from pathlib import Path

from fusedspec.core.settings import Settings
from fusedspec.registry.publish import publish_artifact
from fusedspec.serve.source import open_version


def test_an_s3_version_is_checked_synced_reused_and_refused_when_damaged_in_the_store(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory,  # noqa: ANN001
        tmp_path: Path) -> None:
    result = publish_artifact(artifact_factory(k=3, tp=2, weight_mib=0.5), f"s3://{s3_bucket}/src",
                              s3_settings, unvalidated=True)
    settings = Settings(work_dir=tmp_path / "work", s3_endpoint_url=seaweed.endpoint,
                        aws_region=seaweed.region)

    served = open_version(result.version_uri, settings)
    # loading hashes them
    assert served.report.ok and served.report.quick and served.report.bytes_checked == 0
    assert served.version_dir == settings.cache_dir / "serve" / result.key  # named by its key, as a mount is
    assert (served.files / "build.json").is_file() and served.manifest.key == result.key and not served.reused
    weights = sorted(served.files.rglob("*.safetensors"))[0]
    stamp = weights.stat().st_mtime_ns

    again = open_version(result.version_uri, settings)
    assert again.report.ok and again.reused and weights.stat().st_mtime_ns == stamp  # reused, not downloaded

    bucket_key = f"{result.version_uri.split('/', 3)[3]}/{result.attempt}/build.json"
    client = seaweed.client()
    original = client.get_object(Bucket=s3_bucket, Key=bucket_key)["Body"].read()
    client.put_object(Bucket=s3_bucket, Key=bucket_key, Body=original.replace(b'"cpu"', b'"CPU"', 1))
    fresh = Settings(work_dir=tmp_path / "other", s3_endpoint_url=seaweed.endpoint, aws_region=seaweed.region)
    damaged = open_version(result.version_uri, fresh)
    assert not damaged.report.ok and damaged.version_dir is None
    assert any(problem.startswith("build.json: changed since it was published")
               for problem in damaged.report.problems)
    assert not (fresh.cache_dir / "serve" / result.key).exists()  # refused before a byte was downloaded


def test_a_quick_verify_of_a_copied_directory_shows_etags_that_differ(artifact_factory,  # noqa: ANN001
                                                                      tmp_path: Path) -> None:
    """A copy has other inodes, so its `stat:` etags differ from the manifest's; the refusal must show two
    different etags (cut to 16 characters, both read `stat:<size>-<mtime prefix>`: the same text)."""
    import re
    import shutil

    result = publish_artifact(artifact_factory(k=3, tp=1, weight_mib=0.5), str(tmp_path / "store"),
                              Settings(work_dir=tmp_path / "work"), unvalidated=True)
    copy = tmp_path / "copy" / result.key
    shutil.copytree(result.version_uri, copy)
    report = open_version(str(copy), Settings(work_dir=tmp_path / "work")).report
    assert not report.ok
    for problem in report.problems:
        seen, recorded = re.fullmatch(  # type: ignore[union-attr]
            r".*\(etag (\S+), the manifest records (\S+)\)", problem).groups()
        assert seen != recorded, problem


def test_a_serve_cache_that_cannot_be_written_is_one_line_naming_it(
        artifact_factory, tmp_path: Path,  # noqa: ANN001
        monkeypatch) -> None:  # noqa: ANN001
    """sync_version with a directory store stands for S3 (the same code path after resolve_version)."""
    import errno

    import pytest

    from fusedspec.core.errors import ConfigError, DiskFullError
    from fusedspec.registry.stores import open_store
    from fusedspec.registry.uri import parse_store_uri
    from fusedspec.serve import source

    result = publish_artifact(artifact_factory(k=3, tp=1, weight_mib=0.5), str(tmp_path / "store"),
                              Settings(work_dir=tmp_path / "work"), unvalidated=True)
    settings = Settings(work_dir=tmp_path / "serve-work")
    store = open_store(parse_store_uri(result.version_uri), settings)
    settings.cache_dir.mkdir(parents=True)
    (settings.cache_dir / "serve").write_text("a file where the cache directory belongs")
    with pytest.raises(ConfigError, match=r"cannot use the serve cache .*/serve: File exists .*; point "
                                          "FUSEDSPEC_WORK_DIR at a writable directory"):
        source.sync_version(store, settings)

    (settings.cache_dir / "serve").unlink()
    calls = []

    def fill_up(store, key: str, path: Path) -> None:  # noqa: ANN001
        calls.append(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(source, "_download", fill_up)
    with pytest.raises(DiskFullError, match="no space left in .* while copying version"):
        source.sync_version(store, settings)
    assert sorted(p.name for p in (settings.cache_dir / "serve").iterdir()) == [f".{result.key}.lock"]
