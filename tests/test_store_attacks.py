"""Hostile content in a store, as someone with write access to it could leave (issue 11: "try to break it as
an attacker"): manifests naming paths outside their version, LATEST naming a path, content-index pointers out
of the store, a version copied under another config, a manifest naming another attempt, gc pointed at the
wrong directory. Each is refused (a failed check naming what is wrong) or harmless (ignored, then repaired by
the next publish). On real SeaweedFS and on a directory store. Signed manifests: tests/test_signing.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fusedspec.core.errors import ArtifactError, StoreError
from fusedspec.flows.cli import main
from fusedspec.registry.gc import collect_store
from fusedspec.registry.publish import PublishResult, publish_artifact
from fusedspec.registry.verify import verify_version
from tests.support.store_checks import StoreSite

SHARD0 = "weights/tp0_sharded_checkpoint.safetensors"


def manifest_key(result: PublishResult) -> str:
    return f"{result.config_path}/{result.key}/manifest.json"


def edit_json(site: StoreSite, key: str, edit: Callable[[dict], None]) -> None:
    document = json.loads(site.raw_get(key))
    edit(document)
    site.raw_put(key, json.dumps(document).encode())


@pytest.mark.parametrize("field, value, words", [
    ("files", "../../etc/passwd", "'../../etc/passwd' is not a relative path"),
    ("files", "/etc/passwd", "'/etc/passwd' is not a relative path"),
    ("attempt", "..", "attempt"),
    ("attempt", "../other-version/a20261201T000000-00000000", "attempt"),
    ("config_path", "../../etc", "config_path"),
])
def test_a_manifest_naming_a_path_outside_its_version_is_refused_then_replaced(
        store_site: StoreSite, artifact_factory, field: str, value: str, words: str) -> None:  # noqa: ANN001
    artifact = artifact_factory(k=4)
    first = publish_artifact(artifact, store_site.root, store_site.settings)

    def plant(manifest: dict) -> None:
        if field == "files":
            manifest["files"][value] = manifest["files"].pop(SHARD0)
        else:
            manifest[field] = value

    edit_json(store_site, manifest_key(first), plant)
    report = verify_version(first.version_uri, store_site.settings)
    assert not report.ok and report.manifest is None and words in report.problems[0]
    again = publish_artifact(artifact, store_site.root, store_site.settings)  # replaced by compare-and-swap
    assert again.outcome == "repaired" and verify_version(again.version_uri, store_site.settings).ok


def test_latest_naming_a_path_is_refused_and_the_next_publish_rewrites_it(
        store_site: StoreSite, artifact_factory, capsys, monkeypatch) -> None:  # noqa: ANN001
    artifact = artifact_factory(k=4)
    first = publish_artifact(artifact, store_site.root, store_site.settings)
    latest = f"{first.config_path}/LATEST"
    edit_json(store_site, latest, lambda pointer: pointer.update(key="../../../etc/passwd"))
    if store_site.kind == "s3":
        monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", str(store_site.settings.s3_endpoint_url))
    config_uri = f"{store_site.root}/{first.config_path}"
    assert main(["verify", config_uri]) == 1  # a damaged LATEST: nothing is looked up under that name
    assert "LATEST: key=" in capsys.readouterr().out  # in the report, naming the field
    again = publish_artifact(artifact, store_site.root, store_site.settings)
    # a broken pointer is replaced, by compare-and-swap
    assert again.outcome == "existing" and again.latest_moved
    assert verify_version(config_uri, store_site.settings).ok


@pytest.mark.parametrize("target", ["../../../etc/passwd", "/etc/passwd", "..", ".blobs/../../x"])
def test_a_content_pointer_out_of_the_store_is_ignored(
        store_site: StoreSite, artifact_factory, target: str) -> None:  # noqa: ANN001
    first = publish_artifact(artifact_factory(k=4, weights_seed=5), store_site.root, store_site.settings)
    shard = json.loads(store_site.raw_get(manifest_key(first)))["files"][SHARD0]["sha256"]
    edit_json(store_site, f".blobs/{shard}", lambda pointer: pointer.update(key=target))
    sibling = publish_artifact(artifact_factory(k=5, weights_seed=5), store_site.root, store_site.settings)
    assert sibling.outcome == "created" and (sibling.files_copied, sibling.files_uploaded) == (3, 5)
    assert verify_version(sibling.version_uri, store_site.settings).ok


def test_a_version_copied_under_another_config_is_refused(store_site: StoreSite,
                                                          artifact_factory) -> None:  # noqa: ANN001
    """A copied manifest keeps a valid signature, so where it lies is checked: a k=4 build copied under the
    k=5 config, LATEST pointed at it, must not pass for the k=5 build (to verify, or to `fusedspec k8s`)."""
    k4 = publish_artifact(artifact_factory(k=4), store_site.root, store_site.settings)
    k5 = publish_artifact(artifact_factory(k=5), store_site.root, store_site.settings)
    store = store_site.store()
    for info in store.list(f"{k4.config_path}/{k4.key}"):
        rest = info.key[len(k4.config_path) + 1:]
        store_site.raw_put(f"{k5.config_path}/{rest}", store.get(info.key)) if store_site.kind == "local" \
            else store_site.client.copy_object(Bucket=store_site.bucket,
                                               Key=f"{store_site.prefix}/{k5.config_path}/{rest}",
                                               CopySource={"Bucket": store_site.bucket,
                                                           "Key": f"{store_site.prefix}/{info.key}"})
    edit_json(store_site, f"{k5.config_path}/LATEST", lambda pointer: pointer.update(key=k4.key))
    for uri in (f"{store_site.root}/{k5.config_path}", f"{store_site.root}/{k5.config_path}/{k4.key}"):
        report = verify_version(uri, store_site.settings, quick=True)
        assert not report.ok and any("copied from another config" in p for p in report.problems), \
            report.problems
    assert verify_version(k4.version_uri, store_site.settings).ok  # the original is fine where it is
    if store_site.kind == "s3":
        from fusedspec.registry.k8s import ServingOptions, render_k8s

        # not this host's loopback
        cluster = ServingOptions(s3_endpoint="http://seaweedfs-s3.storage.svc:8333")
        with pytest.raises(StoreError, match="copied from another config"):
            render_k8s(f"{store_site.root}/{k5.config_path}", store_site.settings, cluster)


def test_a_manifest_naming_another_attempt_fails_and_is_replaced(store_site: StoreSite,
                                                                 artifact_factory) -> None:  # noqa: ANN001
    """Y's manifest edited to name X's attempt: attempts live under their own version, so it names a
    directory Y does not have, and nothing of X is read for Y."""
    x = publish_artifact(artifact_factory(k=4, weights_seed=1), store_site.root, store_site.settings)
    y_artifact = artifact_factory(k=5, weights_seed=1)
    y = publish_artifact(y_artifact, store_site.root, store_site.settings)
    edit_json(store_site, manifest_key(y), lambda manifest: manifest.update(attempt=x.attempt))
    report = verify_version(y.version_uri, store_site.settings)
    assert not report.ok and all(p.endswith("missing from the store") for p in report.problems)
    assert publish_artifact(y_artifact, store_site.root, store_site.settings).outcome == "repaired"
    assert verify_version(y.version_uri, store_site.settings).ok and \
        verify_version(x.version_uri, store_site.settings).ok


def test_gc_given_a_directory_above_or_below_the_store_root_removes_nothing(
        store_site: StoreSite, artifact_factory) -> None:  # noqa: ANN001
    """`fusedspec gc s3://bucket` where the store is s3://bucket/store took every published version for a
    dead attempt of a version named by its spec directory."""
    result = publish_artifact(artifact_factory(k=4), store_site.root, store_site.settings)
    above = store_site.root.rsplit("/", 1)[0]
    with pytest.raises(StoreError, match=r"not a store root \(the store root is 1 level"):
        collect_store(above, store_site.settings)
    with pytest.raises(StoreError, match="not a store root .*inside a store"):
        collect_store(f"{store_site.root}/{result.config_path}", store_site.settings)
    assert collect_store(store_site.root, store_site.settings).attempts == []
    assert verify_version(result.version_uri, store_site.settings).ok


def test_an_artifact_file_no_manifest_could_name_is_refused_before_sending(
        store_site: StoreSite, artifact_factory) -> None:  # noqa: ANN001
    artifact = artifact_factory(k=4)
    (artifact / "programs" / "my notes.txt").write_text("x")
    with pytest.raises(ArtifactError, match="my notes.txt.*not a relative path of plain names"):
        publish_artifact(artifact, store_site.root, store_site.settings)
    if store_site.kind == "s3":
        assert store_site.client.list_objects_v2(Bucket=store_site.bucket).get("KeyCount", 0) == 0
    else:
        assert not Path(store_site.root).exists()


# --- issue 27: a store root inside a store, an edited LATEST, an object the store cannot return -------------


def _everything(site: StoreSite) -> dict[str, object]:
    """Every object of the site's bucket (S3) or every path under the directory store: to see a refusal
    wrote nothing, not even a directory."""
    if site.kind == "s3":
        pages = site.client.get_paginator("list_objects_v2").paginate(Bucket=site.bucket)
        return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", [])}
    return {str(p): p.stat().st_size if p.is_file() else -1 for p in Path(site.root).rglob("*")}


@pytest.mark.parametrize("inside", ["attempt", "version", "config", "draft", ".blobs", ".attempts"])
def test_a_store_root_inside_a_store_is_refused_before_anything_is_written(
        store_site: StoreSite, artifact_factory, inside: str) -> None:  # noqa: ANN001
    """`publish A5 STORE/.../KEY/ATTEMPT --unvalidated` nested a version inside a live one; a config
    directory as the root was accepted too."""
    live = publish_artifact(artifact_factory(k=4), store_site.root, store_site.settings)
    config = live.config_path
    roots = {"attempt": f"{config}/{live.key}/{live.attempt}", "version": f"{config}/{live.key}",
             "config": config, "draft": config.rsplit("/", 1)[0], ".blobs": ".blobs",
             ".attempts": ".attempts"}
    before = _everything(store_site)
    with pytest.raises(StoreError, match=r"inside a store") as refused:
        publish_artifact(artifact_factory(k=5, validation=False), f"{store_site.root}/{roots[inside]}",
                         store_site.settings, unvalidated=True)
    assert store_site.root in str(refused.value)  # the way out: the store root it is inside
    assert _everything(store_site) == before
    assert verify_version(live.version_uri, store_site.settings).ok


def test_a_repair_never_deletes_a_version_nested_in_the_attempt_it_replaces(
        store_site: StoreSite, artifact_factory) -> None:  # noqa: ANN001
    """A version nested in a live one's attempt (copied there by hand: fusedspec refuses to publish there)
    makes the live one damaged; its repair replaced the attempt and deleted the nested version with it."""
    outer_artifact = artifact_factory(k=4)
    outer = publish_artifact(outer_artifact, store_site.root, store_site.settings)
    # beside the store: not inside it
    elsewhere = StoreSite(store_site.kind, f"{store_site.root.rsplit('/', 1)[0]}/elsewhere",
                          store_site.settings, store_site.client, store_site.bucket, "elsewhere")
    nested = publish_artifact(artifact_factory(k=5), elsewhere.root, store_site.settings)
    attempt_dir = f"{outer.config_path}/{outer.key}/{outer.attempt}"
    # moved as they are (etags kept)
    for info in elsewhere.store().list(f"{nested.config_path}/{nested.key}"):
        if store_site.kind == "s3":
            store_site.client.copy_object(Bucket=store_site.bucket,
                                          Key=f"{store_site.prefix}/{attempt_dir}/{info.key}",
                                          CopySource={"Bucket": store_site.bucket,
                                                      "Key": f"{elsewhere.prefix}/{info.key}"})
        else:
            (Path(store_site.root) / attempt_dir / info.key).parent.mkdir(parents=True, exist_ok=True)
            (Path(elsewhere.root) / info.key).rename(Path(store_site.root) / attempt_dir / info.key)
    nested_uri = f"{store_site.root}/{attempt_dir}/{nested.config_path}/{nested.key}"
    assert verify_version(nested_uri, store_site.settings).ok
    assert not verify_version(outer.version_uri, store_site.settings).ok  # its mount holds foreign files

    again = publish_artifact(outer_artifact, store_site.root, store_site.settings)
    assert again.outcome == "repaired" and verify_version(again.version_uri, store_site.settings).ok
    assert verify_version(nested_uri, store_site.settings).ok  # the committed version nested there is kept
    assert outer.attempt not in again.removed_attempts
    kept = collect_store(store_site.root, store_site.settings)
    assert kept.attempts == [] and verify_version(nested_uri, store_site.settings).ok
    assert any(outer.attempt in line for line in kept.kept), kept.kept


def test_latest_edited_to_name_an_unvalidated_version_is_refused(
        store_site: StoreSite, artifact_factory, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    """LATEST edited to name a signed but --unvalidated version: verify (with the verify key) passed via
    LATEST and serve loaded it, though LATEST never names one."""
    from fusedspec.core.settings import Settings
    from fusedspec.registry.signing import generate_keys
    from fusedspec.serve.source import open_version

    private, public = generate_keys()
    signing = Settings(work_dir=store_site.settings.work_dir,
                       s3_endpoint_url=store_site.settings.s3_endpoint_url,
                       aws_region=store_site.settings.aws_region, signing_key=private)
    reading = Settings(work_dir=tmp_path / "reader", s3_endpoint_url=store_site.settings.s3_endpoint_url,
                       aws_region=store_site.settings.aws_region, verify_key=public)
    good = publish_artifact(artifact_factory(k=4), store_site.root, signing)
    unchecked = publish_artifact(artifact_factory(k=4, weights_seed=1, validation=False, key="f" * 64),
                                 store_site.root, signing, unvalidated=True)
    assert good.config_path == unchecked.config_path and good.latest_moved and not unchecked.latest_moved
    edit_json(store_site, f"{good.config_path}/LATEST", lambda pointer: pointer.update(
        key=unchecked.key, version=f"{good.config_path}/{unchecked.key}"))
    config_uri = f"{store_site.root}/{good.config_path}"
    report = verify_version(config_uri, reading)
    assert not report.ok and report.via_latest
    assert any("LATEST names" in p and "not validated" in p for p in report.problems), report.problems
    try:  # serve refuses to start on it: a failed check (a mount) or no version to copy (S3)
        assert not open_version(config_uri, reading).report.ok
    except StoreError as exc:
        assert "LATEST names" in str(exc)
    assert verify_version(unchecked.version_uri, reading).ok  # named directly, the version itself is fine
    if store_site.kind == "s3":
        monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", str(store_site.settings.s3_endpoint_url))
    assert main(["ls", store_site.root]) == 1  # the listing names the bad pointer too
    assert "LATEST names" in capsys.readouterr().err


def test_an_object_the_store_cannot_return_is_named_within_seconds_and_never_copied(
        seaweed, s3_bucket: str, artifact_factory, capsys, monkeypatch) -> None:  # noqa: ANN001
    """One object the server answers with 500 InternalError (its data damaged under it) made `verify` exit 2
    after 127 s as "the endpoint did not answer", and every later publish of the same bytes failed after 118
    s: a failed copy from the content index's source never fell back to an upload."""
    site = StoreSite("s3", f"s3://{s3_bucket}/store", seaweed.settings(), seaweed.client(), s3_bucket,
                     "store")
    artifact = artifact_factory(k=4, weights_seed=7)
    first = publish_artifact(artifact, site.root, site.settings)
    seaweed.damage_object(s3_bucket, (artifact / SHARD0).read_bytes())
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    started = time.perf_counter()
    code = main(["verify", first.version_uri])
    seconds = time.perf_counter() - started
    out = capsys.readouterr().out
    print(f"verify named the damaged object in {seconds:.1f} s")
    assert code == 1 and seconds < 10, (code, seconds, out)
    assert f"{SHARD0}: the store cannot return it" in out, out

    started = time.perf_counter()
    sibling = publish_artifact(artifact_factory(k=5, weights_seed=7), site.root, site.settings)
    print(f"a publish of the same bytes took {time.perf_counter() - started:.1f} s")
    assert time.perf_counter() - started < 10
    assert sibling.outcome == "created" and verify_version(sibling.version_uri, site.settings).ok
    pointer = json.loads(site.raw_get(
        f".blobs/{json.loads(site.raw_get(manifest_key(first)))['files'][SHARD0]['sha256']}"))
    assert pointer["key"] == f"{sibling.config_path}/{sibling.key}/{sibling.attempt}/{SHARD0}"  # rewritten


def test_a_file_the_disk_cannot_read_is_named_and_never_copied(
        tmp_path: Path, artifact_factory, capsys, monkeypatch) -> None:  # noqa: ANN001
    """The directory store's counterpart. An EIO from a failing disk cannot be caused here (this runs as root,
    which reads what chmod forbids), so that one fault is stood in for: opening the one damaged file of the
    store raises EIO, as the kernel would."""
    import builtins
    import errno

    from fusedspec.core.settings import Settings
    from fusedspec.registry import local_store

    settings, root = Settings(work_dir=tmp_path / "work"), str(tmp_path / "store")
    artifact = artifact_factory(k=4, weights_seed=7)
    first = publish_artifact(artifact, root, settings)
    damaged = Path(root) / first.config_path / first.key / first.attempt / SHARD0

    def failing_open(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if Path(path) == damaged:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(local_store, "open", failing_open, raising=False)
    started = time.perf_counter()
    assert main(["verify", first.version_uri]) == 1
    out = capsys.readouterr().out
    assert time.perf_counter() - started < 10 and f"{SHARD0}: the store cannot return it" in out, out
    assert "Input/output error" in out
    sibling = publish_artifact(artifact_factory(k=5, weights_seed=7), root, settings)
    assert sibling.outcome == "created" and verify_version(sibling.version_uri, settings).ok
    shard = json.loads((Path(root) / manifest_key(first)).read_text())["files"][SHARD0]["sha256"]
    pointer = json.loads((Path(root) / ".blobs" / shard).read_text())
    assert pointer["key"] == f"{sibling.config_path}/{sibling.key}/{sibling.attempt}/{SHARD0}"  # rewritten
