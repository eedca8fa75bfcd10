"""Provenance (issue 11, must show 5): manifests signed with Ed25519, checked by `fusedspec verify` when a
verify key is configured, wired into the serving pod's init container by `fusedspec k8s`; the private key
never printed. Through the CLI (`flows.cli.main`, settings from the environment as a user sets them),
against real SeaweedFS. The refusal of a crafted `.pt2` is tests/test_program_archive.py.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from fusedspec.flows.cli import main
from tests.support.store_checks import StoreSite

KEY_ENV = ("FUSEDSPEC_SIGNING_KEY", "FUSEDSPEC_SIGNING_KEY_FILE", "FUSEDSPEC_VERIFY_KEY",
           "FUSEDSPEC_VERIFY_KEY_FILE")


@pytest.fixture
def cli(seaweed, monkeypatch, capsys):  # noqa: ANN001, ANN201
    """Run `fusedspec ARGS` with the given key settings (and no others); (exit code, stdout, stderr).
    Every output is kept in `cli.outputs` for the check that no private key was ever printed."""
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", seaweed.region)

    def run(*args: str, **keys: str) -> tuple[int, str, str]:
        for name in KEY_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in keys.items():
            monkeypatch.setenv(name, value)
        code = main(list(args))
        out, err = capsys.readouterr()
        run.outputs.append(out + err)  # type: ignore[attr-defined]
        return code, out, err

    run.outputs = []  # type: ignore[attr-defined]
    return run


def secrets_of(key_dir: Path) -> list[str]:
    """Text that would show a private key: each base64 line of its PEM body."""
    return [line for line in (key_dir / "signing-key.pem").read_text().splitlines()
            if not line.startswith("-----")]


def test_signed_versions_verify_only_under_their_key(cli, s3_bucket: str, seaweed,  # noqa: ANN001
                                                     artifact_factory, neuron_artifact_factory,
                                                     tmp_path: Path) -> None:
    site = StoreSite("s3", f"s3://{s3_bucket}/signed", seaweed.settings(), seaweed.client(), s3_bucket,
                     "signed")
    code, out, _ = cli("keygen", str(tmp_path / "a"), "--json")
    key_a = json.loads(out)["key_id"]
    code_b, out_b, _ = cli("keygen", str(tmp_path / "b"))
    assert code == code_b == 0 and key_a not in out_b
    assert stat.S_IMODE((tmp_path / "a" / "signing-key.pem").stat().st_mode) == 0o600
    # never overwritten: versions signed with it would not verify
    assert cli("keygen", str(tmp_path / "a"))[0] == 2
    sign_a = {"FUSEDSPEC_SIGNING_KEY_FILE": str(tmp_path / "a" / "signing-key.pem")}
    verify_a = {"FUSEDSPEC_VERIFY_KEY_FILE": str(tmp_path / "a" / "verify-key.pem")}
    verify_b = {"FUSEDSPEC_VERIFY_KEY": (tmp_path / "b" / "verify-key.pem").read_text()}  # the value itself

    code, out, _ = cli("publish", str(artifact_factory(k=4)), site.root, "--json", **sign_a)
    signed = json.loads(out)
    assert code == 0 and signed["outcome"] == "created"
    manifest = json.loads(site.raw_get(f"{signed['config_path']}/{signed['key']}/manifest.json"))
    assert manifest["signature"]["key_id"] == key_a

    code, out, _ = cli("verify", signed["version_uri"], **verify_b)  # signed by A, verified with B: refused
    assert code == 1 and f"signed by key {key_a}" in out and "not by the configured verify key" in out
    code, out, _ = cli("verify", signed["version_uri"], **verify_a)
    assert code == 0 and f"signed by {key_a}" in out
    assert cli("verify", signed["version_uri"], "--quick", **verify_a)[0] == 0

    code, out, _ = cli("publish", str(artifact_factory(k=5)), site.root, "--json")  # no signing key: unsigned
    unsigned = json.loads(out)
    code, out, _ = cli("verify", unsigned["version_uri"], "--json", **verify_a)
    report = json.loads(out)
    assert code == 1 and report["signer"] is None and "unsigned" in report["problems"][0]
    assert cli("verify", unsigned["version_uri"])[0] == 0  # no verify key: the store is trusted as before

    # A signed manifest changed afterwards (here: made to say it passed no gate) no longer verifies.
    key = f"{signed['config_path']}/{signed['key']}/manifest.json"
    site.raw_put(key, json.dumps({**manifest, "created_at": "2020-01-01T00:00:00Z"}).encode())
    code, out, _ = cli("verify", signed["version_uri"], **verify_a)
    assert code == 1 and "does not match its content: it was altered" in out

    # The serving pod's init container gets the public key (and only that) when one is configured.
    code, out, _ = cli("publish", str(neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512)), site.root,
                       "--json", **sign_a)
    served = json.loads(out)["version_uri"]
    code, text, _ = cli("k8s", served, "--s3-endpoint", "http://seaweedfs-s3.storage.svc:8333", **verify_a)
    assert code == 0
    [deployment] = [d for d in yaml.safe_load_all(text) if d["kind"] == "Deployment"]
    [init] = deployment["spec"]["template"]["spec"]["initContainers"]
    assert {"name": "FUSEDSPEC_VERIFY_KEY",
            "value": (tmp_path / "a" / "verify-key.pem").read_text().strip()} in init["env"]
    # without a verify key, no pod could trust the version's native model.pt: refused, naming the key to set
    code, text, err = cli("k8s", served, "--s3-endpoint", "http://seaweedfs-s3.storage.svc:8333")
    assert code == 2 and not text and "no verify key is configured" in err

    printed = "\n".join(cli.outputs)
    objects = [site.raw_get(o["Key"][len("signed/"):]).decode(errors="replace")
               for o in site.client.list_objects_v2(Bucket=s3_bucket, Prefix="signed/")["Contents"]
               if o["Key"].endswith(("manifest.json", "LATEST", "build.json"))]
    for secret in secrets_of(tmp_path / "a") + secrets_of(tmp_path / "b"):
        assert secret not in printed and not any(secret in text for text in objects)


def test_a_bad_signing_key_is_refused_before_anything_is_sent(cli, s3_bucket: str, seaweed,  # noqa: ANN001
                                                              artifact_factory) -> None:
    not_a_key = "c2VjcmV0LWJ1dC1ub3QtYS1rZXk="  # base64 of 21 bytes: not an Ed25519 seed
    code, _, err = cli("publish", str(artifact_factory(k=4)), f"s3://{s3_bucket}/x",
                       FUSEDSPEC_SIGNING_KEY=not_a_key)
    assert code == 2 and "FUSEDSPEC_SIGNING_KEY is not an Ed25519 private key" in err and not_a_key not in err
    assert seaweed.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0


def _keyed(site: StoreSite, **keys: str):  # noqa: ANN202 - Settings
    from fusedspec.core.settings import Settings

    base = site.settings
    return Settings(work_dir=base.work_dir, s3_endpoint_url=base.s3_endpoint_url, aws_region=base.aws_region,
                    **keys)


def test_signing_is_turned_on_and_rotated_for_existing_versions(store_site: StoreSite,
                                                                artifact_factory) -> None:  # noqa: ANN001
    """Re-publishing with a signing key said "existing" and left the manifest unsigned, while verify said
    "publish it again signed"; a new key (rotation) was the same."""
    from fusedspec.registry.publish import publish_artifact
    from fusedspec.registry.signing import generate_keys, key_id, load_verify_key
    from fusedspec.registry.verify import verify_version

    (old_private, old_public), (new_private, new_public) = generate_keys(), generate_keys()
    artifact = artifact_factory(k=4)
    unsigned = publish_artifact(artifact, store_site.root, store_site.settings)
    report = verify_version(unsigned.version_uri, _keyed(store_site, verify_key=old_public))
    assert not report.ok and "publish it again signed" in report.problems[0]

    signed = publish_artifact(artifact, store_site.root, _keyed(store_site, signing_key=old_private))
    assert signed.outcome == "re-signed" and signed.attempt == unsigned.attempt and signed.files_uploaded == 0
    assert verify_version(f"{store_site.root}/{signed.config_path}",
                          _keyed(store_site, verify_key=old_public)).ok

    rotated = publish_artifact(artifact, store_site.root, _keyed(store_site, signing_key=new_private))
    assert rotated.outcome == "re-signed" and rotated.attempt == unsigned.attempt
    report = verify_version(rotated.version_uri, _keyed(store_site, verify_key=new_public))
    assert report.ok and report.signer == key_id(load_verify_key(new_public))
    assert not verify_version(rotated.version_uri, _keyed(store_site, verify_key=old_public)).ok
    again = publish_artifact(artifact, store_site.root, _keyed(store_site, signing_key=new_private))
    assert again.outcome == "existing" and again.bytes_sent == 0  # signed by this key already: nothing to do


def test_a_version_is_not_re_signed_from_an_artifact_that_differs(store_site: StoreSite,
                                                                  artifact_factory) -> None:  # noqa: ANN001
    """A signature vouches for bytes: a publisher whose files are not the version's cannot sign it."""
    from fusedspec.core.errors import ArtifactError
    from fusedspec.registry.publish import publish_artifact
    from fusedspec.registry.signing import generate_keys

    private, _public = generate_keys()
    key = "d" * 64
    publish_artifact(artifact_factory(k=4, weights_seed=1, key=key), store_site.root, store_site.settings)
    with pytest.raises(ArtifactError, match="cannot sign"):
        publish_artifact(artifact_factory(k=4, weights_seed=2, key=key), store_site.root,
                         _keyed(store_site, signing_key=private))
