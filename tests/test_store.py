"""Store URIs and the Store contract, run against both implementations: a local dir and real SeaweedFS."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, SSLError

from fusedspec.core.errors import StoreError
from fusedspec.core.files import sha256_file
from fusedspec.core.settings import Settings
from fusedspec.registry.s3_store import S3Store, is_transient
from fusedspec.registry.store import PreconditionFailed, Store
from fusedspec.registry.stores import open_store
from fusedspec.registry.uri import parse_store_uri

# --- URIs -----------------------------------------------------------------------------------------------


def test_uri_forms(tmp_path: Path) -> None:
    s3 = parse_store_uri("s3://my-bucket/fused/spec/")
    assert (s3.scheme, s3.bucket, s3.prefix) == ("s3", "my-bucket", "fused/spec")
    assert str(s3.child("a", "b")) == "s3://my-bucket/fused/spec/a/b"
    assert parse_store_uri("s3://my-bucket").prefix == ""
    assert parse_store_uri(f"file://{tmp_path}/x").local_root == tmp_path / "x"
    assert parse_store_uri("artifacts").local_root == Path.cwd() / "artifacts"


@pytest.mark.parametrize(("text", "words"), [
    ("s3://", "names no bucket"),
    ("s3:///prefix", "names no bucket"),
    ("gs://bucket/x", "unknown scheme 'gs'"),
    ("s3://bucket/a/../b", "'..' is not allowed"),
    ("store/../../etc", "'..' is not allowed"),
    ("file://relative/dir", "absolute path"),
    ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
])
def test_bad_uris_are_one_clear_error(text: str, words: str) -> None:
    with pytest.raises(StoreError, match=words.replace("(", r"\(")) as info:
        parse_store_uri(text)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


# --- Transient or not ----------------------------------------------------------------------------------


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_only_transient_failures_are_retried() -> None:
    # Real botocore exception objects, built as botocore builds them from a response; no server can be
    # made to throttle on demand.
    for exc in (_client_error("SlowDown", 503), _client_error("InternalError", 500),
                _client_error("Throttling", 400), _client_error("TooManyRequests", 429),
                EndpointConnectionError(endpoint_url="http://x"),
                ConnectionClosedError(endpoint_url="http://x")):
        assert is_transient(exc), exc
    for exc in (_client_error("AccessDenied", 403), _client_error("InvalidAccessKeyId", 403),
                _client_error("SignatureDoesNotMatch", 403), _client_error("NoSuchBucket", 404),
                _client_error("PreconditionFailed", 412), SSLError(endpoint_url="http://x", error="cert")):
        assert not is_transient(exc), exc


# --- The contract, on both stores ------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"), Settings(work_dir=tmp_path))
    seaweed, bucket = request.getfixturevalue("seaweed"), request.getfixturevalue("s3_bucket")
    # Small parts so a 12 MiB file is a 3-part multipart upload.
    return open_store(f"s3://{bucket}/root", seaweed.settings(), part_size=5 << 20,
                      multipart_threshold=8 << 20)


def test_put_file_keeps_the_stores_own_checksum_and_counts_bytes(store: Store, tmp_path: Path) -> None:
    for size in (1000, 12 << 20):  # single PUT, then multipart
        path = tmp_path / f"f{size}"
        path.write_bytes(os.urandom(size))
        digest = sha256_file(path)
        before, seen = store.bytes_sent, []
        store.put_file(f"v/{path.name}", path, sha256=digest, progress=seen.append)
        assert sum(seen) == size
        assert size <= store.bytes_sent - before < size + 4096
        info = store.head(f"v/{path.name}")
        assert info is not None and info.size == size
        assert info.checksum == store.expected_checksum(path, digest)  # computed by the store from the bytes
        assert store.hash_object(f"v/{path.name}") == (size, digest)


def test_a_file_that_changed_after_hashing_is_refused(store: Store, tmp_path: Path) -> None:
    from fusedspec.core.errors import ArtifactError

    path = tmp_path / "f"
    path.write_bytes(b"a" * 1000)
    digest = sha256_file(path)
    path.write_bytes(b"b" * 1000)
    with pytest.raises(ArtifactError, match="changed while it was being published"):
        store.put_file("v/f", path, sha256=digest)
    assert store.head("v/f") is None


def test_create_only_and_compare_and_swap(store: Store) -> None:
    assert store.create("c/manifest.json", b"first") is True
    assert store.create("c/manifest.json", b"second") is False
    assert store.get("c/manifest.json") == b"first"

    etag = store.swap("c/LATEST", b"one", expected_etag=None)
    with pytest.raises(PreconditionFailed):
        store.swap("c/LATEST", b"other", expected_etag=None)  # exists already
    etag2 = store.swap("c/LATEST", b"two", expected_etag=etag)
    with pytest.raises(PreconditionFailed):
        store.swap("c/LATEST", b"stale", expected_etag=etag)  # lost update prevented
    assert store.get_with_etag("c/LATEST") == (b"two", etag2)


def test_copy_list_delete(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 5000)
    digest = sha256_file(path)
    store.put_file("a/blob", path, sha256=digest)
    source = store.head("a/blob")
    assert source is not None and source.etag
    sent = store.bytes_sent
    store.copy("a/blob", "b/copy", if_match=source.etag)
    assert store.bytes_sent - sent < 1000  # a copy request, not the bytes
    info = store.head("b/copy")
    assert info is not None and (info.size, info.checksum) == (5000, source.checksum)
    assert [o.key for o in store.list()] == ["a/blob", "b/copy"]
    assert [o.key for o in store.list("b")] == ["b/copy"]
    store.delete("a/blob")
    store.delete("a/blob")  # already gone: fine
    assert store.head("a/blob") is None
    assert [o.key for o in store.list()] == ["b/copy"]


def test_copy_refuses_a_source_changed_since_its_etag_was_read(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 5000)
    store.put_file("a/blob", path, sha256=sha256_file(path))
    seen = store.head("a/blob")
    assert seen is not None and seen.etag
    path.write_bytes(b"y" * 5000)
    store.put_file("a/blob", path, sha256=sha256_file(path))  # replaced after the check
    with pytest.raises(PreconditionFailed):
        store.copy("a/blob", "b/copy", if_match=seen.etag)
    assert store.head("b/copy") is None


def test_local_store_hides_temp_and_lock_files(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"), Settings(work_dir=tmp_path))
    store.swap("c/LATEST", b"1", expected_etag=None)
    (tmp_path / "s" / "c" / ".x.tmp-123").write_bytes(b"partial")
    assert [o.key for o in store.list()] == ["c/LATEST"]


def test_local_store_listings_skip_files_removed_while_listing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A racing publisher renames its temp file into place between the listing's walk and its stat (seen
    once in 20 racing trials). The walk is patched to return paths that are gone, because that window
    cannot be hit on purpose; the listings must leave them out instead of failing the publish."""
    store = open_store(str(tmp_path / "s"), Settings(work_dir=tmp_path))
    store.swap("c/LATEST", b"1", expected_etag=None)
    walked = store._files_under  # type: ignore[attr-defined]
    gone = [("c/.shard.tmp-1", tmp_path / "s" / "c" / ".shard.tmp-1"),
            ("c/shard", tmp_path / "s" / "c" / "shard")]
    monkeypatch.setattr(store, "_files_under", lambda prefix: sorted(walked(prefix) + gone))
    assert [o.key for o in store.list("c")] == ["c/LATEST"]
    assert store.list_uploads("c") == []


# --- Endpoint, credentials and bucket problems -------------------------------------------------------------


def test_wrong_credentials_missing_bucket_unreachable(seaweed, s3_bucket: str,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    settings = seaweed.settings()
    with pytest.raises(StoreError, match="does not exist") as info:
        open_store("s3://no-such-bucket-here/x", settings)
    assert info.value.exit_code == 2

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + seaweed.secret_key[:6])
    with pytest.raises(StoreError, match="refused HeadBucket") as info:
        open_store(f"s3://{s3_bucket}/x", settings)
    assert seaweed.secret_key[:6] not in str(info.value) and seaweed.access_key not in str(info.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NOSUCHKEY")
    with pytest.raises(StoreError, match="check the credentials"):
        open_store(f"s3://{s3_bucket}/x", settings)

    dead = Settings(work_dir=settings.work_dir, s3_endpoint_url="http://user:pw@127.0.0.1:9",
                    aws_region="us-east-1")
    with pytest.raises(StoreError, match="did not answer") as info:
        open_store(f"s3://{s3_bucket}/x", dead)
    assert "pw" not in str(info.value) and "127.0.0.1:9" in str(info.value)


def test_s3_store_class_is_used_for_s3(seaweed, s3_bucket: str) -> None:  # noqa: ANN001
    assert isinstance(open_store(f"s3://{s3_bucket}", seaweed.settings()), S3Store)


def test_a_missing_profile_is_named_though_another_store_was_opened_first(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    """Stores of one process share botocore's parsed data; the profile is still read for each store, so a
    missing one is the same clear refusal in a long-lived process (a worker, `serve`) as in a fresh one."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    uri = parse_store_uri("s3://bucket/x")
    S3Store(uri, endpoint_url="http://127.0.0.1:9", region="us-east-1")  # sends nothing
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(StoreError, match=r"no-such-profile.*set AWS_PROFILE to a profile"):
        S3Store(uri, endpoint_url="http://127.0.0.1:9", region="us-east-1")
