"""Hostile content in a store, as someone with write access to it could leave (issue 11: "try to break it as an
attacker"): manifests naming paths outside their version, LATEST naming a path, content-index pointers out of
the store, a version copied under another config, a manifest naming another attempt, gc pointed at the wrong
directory. Each is refused (a failed check naming what is wrong) or harmless (ignored, then repaired by the
next publish). On real SeaweedFS and on a directory store. Signed manifests: tests/test_signing.py.
"""

from __future__ import annotations

import json
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
    assert again.outcome == "existing" and again.latest_moved  # a broken pointer is replaced, by compare-and-swap
    assert verify_version(config_uri, store_site.settings).ok


@pytest.mark.parametrize("target", ["../../../etc/passwd", "/etc/passwd", "..", ".blobs/../../x"])
def test_a_content_pointer_out_of_the_store_is_ignored(store_site: StoreSite, artifact_factory, target: str) -> None:  # noqa: ANN001
    first = publish_artifact(artifact_factory(k=4, weights_seed=5), store_site.root, store_site.settings)
    shard = json.loads(store_site.raw_get(manifest_key(first)))["files"][SHARD0]["sha256"]
    edit_json(store_site, f".blobs/{shard}", lambda pointer: pointer.update(key=target))
    sibling = publish_artifact(artifact_factory(k=5, weights_seed=5), store_site.root, store_site.settings)
    assert sibling.outcome == "created" and (sibling.files_copied, sibling.files_uploaded) == (3, 5)
    assert verify_version(sibling.version_uri, store_site.settings).ok


def test_a_version_copied_under_another_config_is_refused(store_site: StoreSite, artifact_factory) -> None:  # noqa: ANN001
    """A copied manifest keeps a valid signature, so where it lies is checked: a k=4 build copied under the
    k=5 config, LATEST pointed at it, must not pass for the k=5 build (to verify, or to `fusedspec k8s`)."""
    k4 = publish_artifact(artifact_factory(k=4), store_site.root, store_site.settings)
    k5 = publish_artifact(artifact_factory(k=5), store_site.root, store_site.settings)
    store = store_site.store()
    for info in store.list(f"{k4.config_path}/{k4.key}"):
        rest = info.key[len(k4.config_path) + 1:]
        store_site.raw_put(f"{k5.config_path}/{rest}", store.get(info.key)) if store_site.kind == "local" else \
            store_site.client.copy_object(Bucket=store_site.bucket, Key=f"{store_site.prefix}/{k5.config_path}/{rest}",
                                          CopySource={"Bucket": store_site.bucket,
                                                      "Key": f"{store_site.prefix}/{info.key}"})
    edit_json(store_site, f"{k5.config_path}/LATEST", lambda pointer: pointer.update(key=k4.key))
    for uri in (f"{store_site.root}/{k5.config_path}", f"{store_site.root}/{k5.config_path}/{k4.key}"):
        report = verify_version(uri, store_site.settings, quick=True)
        assert not report.ok and any("copied from another config" in p for p in report.problems), report.problems
    assert verify_version(k4.version_uri, store_site.settings).ok  # the original is fine where it is
    if store_site.kind == "s3":
        from fusedspec.registry.k8s import render_k8s

        with pytest.raises(StoreError, match="copied from another config"):
            render_k8s(f"{store_site.root}/{k5.config_path}", store_site.settings)


def test_a_manifest_naming_another_attempt_fails_and_is_replaced(store_site: StoreSite, artifact_factory) -> None:  # noqa: ANN001
    """Y's manifest edited to name X's attempt: attempts live under their own version, so it names a
    directory Y does not have, and nothing of X is read for Y."""
    x = publish_artifact(artifact_factory(k=4, weights_seed=1), store_site.root, store_site.settings)
    y_artifact = artifact_factory(k=5, weights_seed=1)
    y = publish_artifact(y_artifact, store_site.root, store_site.settings)
    edit_json(store_site, manifest_key(y), lambda manifest: manifest.update(attempt=x.attempt))
    report = verify_version(y.version_uri, store_site.settings)
    assert not report.ok and all(p.endswith("missing from the store") for p in report.problems)
    assert publish_artifact(y_artifact, store_site.root, store_site.settings).outcome == "repaired"
    assert verify_version(y.version_uri, store_site.settings).ok and verify_version(x.version_uri, store_site.settings).ok


def test_gc_given_a_directory_above_or_below_the_store_root_removes_nothing(store_site: StoreSite,
                                                                            artifact_factory) -> None:  # noqa: ANN001
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


def test_an_artifact_file_no_manifest_could_name_is_refused_before_sending(store_site: StoreSite,
                                                                           artifact_factory) -> None:  # noqa: ANN001
    artifact = artifact_factory(k=4)
    (artifact / "programs" / "my notes.txt").write_text("x")
    with pytest.raises(ArtifactError, match="my notes.txt.*not a relative path of plain names"):
        publish_artifact(artifact, store_site.root, store_site.settings)
    if store_site.kind == "s3":
        assert store_site.client.list_objects_v2(Bucket=store_site.bucket).get("KeyCount", 0) == 0
    else:
        assert not Path(store_site.root).exists()
