"""Publishing against real SeaweedFS (and a local dir): the protocol, re-publish, races, dedup, restarts,
secrets and bad inputs. Bytes are counted by the S3 store's botocore `before-send` hook: the size of
every request body handed to the HTTP layer, retries included (`PublishResult.bytes_sent`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fusedspec.compile.documents.manifest import Manifest
from fusedspec.core.errors import StoreError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.listing import list_versions
from fusedspec.registry.publish import PublishResult, move_latest, publish_artifact
from fusedspec.registry.s3_store import S3Store
from fusedspec.registry.signing import generate_keys
from fusedspec.registry.store import PreconditionFailed
from fusedspec.registry.stores import open_store
from fusedspec.registry.verify import verify_version

MiB = 1 << 20
SMALL_PARTS: dict[str, Any] = {"part_size": 5 * MiB, "multipart_threshold": 8 * MiB}
CLUSTER_S3 = "http://seaweedfs-s3.storage.svc:8333"  # the store as pods would reach it (k8s refuses loopback)


def _objects(seaweed, bucket: str) -> dict[str, str]:  # noqa: ANN001
    client = seaweed.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _config_uri(root: str, result: PublishResult) -> str:
    return f"{root.rstrip('/')}/{result.config_path}"


# --- Must show 1: publish, ls, verify; an identical re-publish sends nothing -------------------------------


def test_publish_ls_verify_then_identical_republish_sends_nothing(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory, capsys,  # noqa: ANN001
        monkeypatch) -> None:
    artifact = artifact_factory(k=4, weight_mib=10)  # two 10 MiB shards: multipart with 5 MiB parts
    root = f"s3://{s3_bucket}/fused"
    store = open_store(root, s3_settings, **SMALL_PARTS)
    first = publish_artifact(artifact, root, s3_settings, store=store)
    total = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    assert first.created and first.latest_moved and first.files_uploaded == 8
    assert first.version_uri == f"{root}/{first.config_path}/{first.key}"
    assert first.files_uri == f"{first.version_uri}/{first.attempt}"
    assert first.config_path == "Qwen--Qwen3-32B/Qwen--Qwen3-1.7B/tp2-seq256-k4-bs1-float32"
    assert total <= first.bytes_sent < total + 64 * 1024
    manifest = Manifest.parse_bytes(store.get(f"{first.config_path}/{first.key}/manifest.json"), "manifest")
    assert manifest.validated and manifest.validation is not None and manifest.validation.prompts == 6
    assert manifest.models.target.commit == "1" * 40 and manifest.attempt == first.attempt
    assert manifest.tokenizer_hash is not None and manifest.tokenizer_hash.startswith("sha256:")
    assert all(entry.etag for entry in manifest.files.values())

    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", seaweed.region)
    assert main(["ls", root]) == 0
    listing = capsys.readouterr().out
    assert first.config_path in listing and f"* {first.key}" in listing
    assert main(["verify", _config_uri(root, first), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["via_latest"] and report["files_checked"] == 8 and \
        report["bytes_checked"] == total

    before = _objects(seaweed, s3_bucket)
    again = publish_artifact(artifact, root, s3_settings)
    print(f"first publish sent {first.bytes_sent} bytes for {total} bytes of files; re-publish sent "
          f"{again.bytes_sent}")
    assert (again.outcome, again.latest_moved, again.bytes_sent, again.files_uploaded) == \
        ("existing", False, 0, 0)
    assert again.version_uri == first.version_uri and again.differs == []
    assert _objects(seaweed, s3_bucket) == before  # nothing created, nothing rewritten


def test_local_directory_store_same_protocol(tmp_path: Path, artifact_factory) -> None:  # noqa: ANN001
    settings = Settings(work_dir=tmp_path)
    root = str(tmp_path / "artifacts")
    first = publish_artifact(artifact_factory(k=3), root, settings)
    assert first.created and verify_version(_config_uri(root, first), settings).ok
    again = publish_artifact(artifact_factory(k=3), root, settings)
    assert not again.created and again.bytes_sent == 0
    [config] = list_versions(root, settings)
    assert config.latest == first.key and [v.key for v in config.versions] == [first.key]
    assert not list((tmp_path / "artifacts").rglob(".*.tmp-*"))
    assert not [p for p in (tmp_path / "artifacts").rglob("*") if ".attempts" in p.parts and p.is_file()]


# --- Must show 5: racing publishers, racing LATEST moves -------------------------------------------------


def _in_threads(count: int, work) -> list:  # noqa: ANN001
    results: list = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


def test_two_publishers_racing_on_one_key(seaweed, s3_bucket: str, s3_settings: Settings,  # noqa: ANN001
                                          artifact_factory) -> None:
    artifact = artifact_factory(k=5)
    root = f"s3://{s3_bucket}/race"
    at_manifest = threading.Barrier(2, timeout=60)

    def publish(_i: int) -> PublishResult:
        # Both hold at the manifest write until the other is there too: a true race for create-only.
        return publish_artifact(
            artifact, root, s3_settings,
            on_step=lambda name: at_manifest.wait() if name == "before-manifest" else None)

    a, b = _in_threads(2, publish)
    assert a.version_uri == b.version_uri and a.key == b.key
    assert sorted([a.outcome, b.outcome]) == ["created", "lost"] and a.attempt == b.attempt
    assert sorted([a.latest_moved, b.latest_moved]) == [False, True]
    assert verify_version(_config_uri(root, a), s3_settings).ok
    manifests = [k for k in _objects(seaweed, s3_bucket) if k.endswith("manifest.json")]
    assert len(manifests) == 1
    assert not [k for k in _objects(seaweed, s3_bucket) if "/.attempts/" in f"/{k}"]  # both markers gone


def test_racing_latest_moves_lose_no_update(s3_bucket: str, s3_settings: Settings,
                                            artifact_factory) -> None:  # noqa: ANN001
    root = f"s3://{s3_bucket}/latest"
    artifacts = [artifact_factory(k=6, weights_seed=0, key=f"{i:x}" * 64) for i in range(4)]
    at_latest = threading.Barrier(4, timeout=60)
    results = _in_threads(4, lambda i: publish_artifact(
        artifacts[i], root, s3_settings,
        on_step=lambda name: at_latest.wait() if name == "before-latest" else None))
    assert all(r.created and r.latest_moved for r in results)  # each move happened, by compare-and-swap
    store = open_store(f"{root}/{results[0].config_path}", s3_settings)
    pointer = json.loads(store.get("LATEST"))
    assert sorted([pointer["key"], *pointer["history"]]) == sorted(r.key for r in results)  # no lost update
    report = verify_version(_config_uri(root, results[0]), s3_settings)
    assert report.ok and report.manifest is not None and report.manifest.key == pointer["key"]
    # A publisher re-run for a superseded key leaves LATEST alone.
    assert move_latest(store, "", results[0].key) is False


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_compare_and_swap_counter_under_contention(kind: str, tmp_path: Path,
                                                   request) -> None:  # noqa: ANN001
    if kind == "s3":
        seaweed = request.getfixturevalue("seaweed")
        uri, settings = f"s3://{request.getfixturevalue('s3_bucket')}/cas", seaweed.settings()
    else:
        uri, settings = str(tmp_path / "cas"), Settings(work_dir=tmp_path)

    def increment(_i: int) -> int:
        store, retries = open_store(uri, settings), 0
        for _ in range(10):
            while True:
                try:
                    data, etag = store.get_with_etag("counter")
                except FileNotFoundError:
                    data, etag = b"0", None
                try:
                    store.swap("counter", str(int(data) + 1).encode(), expected_etag=etag)
                    break
                except PreconditionFailed:
                    retries += 1
        return retries

    retries = _in_threads(4, increment)
    assert open_store(uri, settings).get("counter") == b"40"
    print(f"{kind}: 40 increments by 4 writers, {sum(retries)} compare-and-swap conflicts retried")


# --- Must show 6: a k-sweep with identical weights sends about one copy ------------------------------------


def test_k_sweep_sends_one_copy_of_the_weights(seaweed, s3_bucket: str, s3_settings: Settings,  # noqa: ANN001
                                               artifact_factory) -> None:
    root = f"s3://{s3_bucket}/sweep"
    artifacts = [artifact_factory(k=k, weight_mib=6) for k in (2, 3, 4, 5)]
    weights = sum(p.stat().st_size for p in (artifacts[0] / "weights").iterdir())
    other = sum(p.stat().st_size for a in artifacts for p in a.rglob("*")
                if p.is_file() and "weights" not in p.parts)
    results = [publish_artifact(a, root, s3_settings) for a in artifacts]
    sent = sum(r.bytes_sent for r in results)
    print("\n  k  uploaded  copied  bytes sent")
    for k, r in zip((2, 3, 4, 5), results, strict=True):
        print(f"  {k}  {r.files_uploaded:8d}  {r.files_copied:6d}  {r.bytes_sent:10d}")
    print(f"  total sent {sent} bytes = {sent / weights:.3f} x one copy of the weights ({weights} bytes); "
          f"4 full uploads would be {4 * weights + other} bytes")
    assert [r.files_copied for r in results] == [0, 4, 4, 4]  # two shards + two tokenizer files
    assert weights + other <= sent < weights + other + 128 * 1024
    assert all(verify_version(r.version_uri, s3_settings).ok for r in results)


# --- Must show 3: SeaweedFS stopped and restarted during a multipart upload --------------------------------


class _SlowProgress:
    """Slows the upload down (a pause per chunk boto3 reports, about 20 to a part) and signals once the first
    bytes are through, so a part is always in flight when the server goes away."""

    def __init__(self, pause: float) -> None:
        self.pause, self.first_part = pause, threading.Event()

    def begin(self, total_bytes: int, files: int) -> None: ...

    def advance(self, nbytes: int) -> None:
        self.first_part.set()
        time.sleep(self.pause)

    def end(self) -> None: ...


def _publish_across_a_restart(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory,  # noqa: ANN001
        retry_deadline: float) -> tuple[PublishResult | StoreError, S3Store, Path, str]:
    """Publish one 8-part file while SeaweedFS is stopped after the first part and started again a
    second later; the publish's result or its StoreError, with the store, artifact and root."""
    artifact = artifact_factory(k=4, tp=1, weight_mib=40)
    root = f"s3://{s3_bucket}/restart"
    store = open_store(root, s3_settings, max_concurrency=1, retry_deadline=retry_deadline, **SMALL_PARTS)
    assert isinstance(store, S3Store)
    progress = _SlowProgress(0.05)
    outcome: list[PublishResult | StoreError] = []

    def publish() -> None:
        try:
            outcome.append(publish_artifact(artifact, root, s3_settings, store=store, progress=progress))
        except StoreError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=publish)
    thread.start()
    assert progress.first_part.wait(60)
    seaweed.stop()  # mid-upload: later parts meet a dead endpoint
    time.sleep(1.0)  # the outage itself, longer than the short deadline below
    seaweed.start()
    thread.join(180)
    assert not thread.is_alive()
    progress.pause = 0
    return outcome[0], store, artifact, root


@pytest.mark.slow
def test_a_server_restart_mid_upload_is_retried_through(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory) -> None:  # noqa: ANN001
    outcome, store, _, _ = _publish_across_a_restart(seaweed, s3_bucket, s3_settings, artifact_factory, 120.0)
    assert isinstance(outcome, PublishResult), outcome
    assert store.retries > 0  # the restart really hit the upload
    assert verify_version(outcome.version_uri, s3_settings).ok


@pytest.mark.slow
def test_an_outage_longer_than_the_retry_deadline_fails_cleanly_and_a_rerun_completes(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory) -> None:  # noqa: ANN001
    outcome, store, artifact, root = _publish_across_a_restart(seaweed, s3_bucket, s3_settings,
                                                               artifact_factory, 0.5)
    assert isinstance(outcome, StoreError), outcome
    message = str(outcome)
    assert "did not answer" in message and "then re-run" in message and "\n" not in message, message
    # never over missing data
    assert not any(k.endswith("manifest.json") for k in _objects(seaweed, s3_bucket))
    result = publish_artifact(artifact, root, s3_settings, store=store)
    assert verify_version(result.version_uri, s3_settings).ok


# --- Must show 8: no secret in any output, log or manifest -----------------------------------------------


def _fusedspec(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fusedspec.flows.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=Path(__file__).parents[1])


@pytest.mark.slow
def test_secrets_appear_nowhere(seaweed, s3_bucket: str, artifact_factory,  # noqa: ANN001
                                neuron_artifact_factory) -> None:
    # signed: the neuron version's model.pt is native code, which k8s needs vouched for
    signing, verify = generate_keys()
    env = {**os.environ, **seaweed.env(), "AWS_SESSION_TOKEN": "", "HF_TOKEN": "hf_secret_token_for_test",
           "FUSEDSPEC_SIGNING_KEY": signing, "FUSEDSPEC_VERIFY_KEY": verify}
    root = f"s3://{s3_bucket}/secret"
    artifact = artifact_factory(k=4)
    runs = [_fusedspec(["publish", str(artifact), root], env)]
    version = json.loads(_fusedspec(["publish", str(artifact), root, "--json"], env).stdout)["version_uri"]
    served = json.loads(_fusedspec(["publish", str(neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512)),
                                    root, "--json"], env).stdout)["version_uri"]
    runs += [_fusedspec(["ls", root], env), _fusedspec(["verify", version, "--json"], env),
             _fusedspec(["k8s", served, "--s3-endpoint", CLUSTER_S3], env)]
    assert [r.returncode for r in runs] == [0, 0, 0, 0], [r.stderr for r in runs]
    wrong = {**env, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key[::-1]}
    runs += [_fusedspec(["verify", version, "--json"], wrong),
             _fusedspec(["publish", str(artifact), root], wrong)]
    assert [r.returncode for r in runs[-2:]] == [2, 2]
    texts = [r.stdout + r.stderr for r in runs]
    texts += [json.dumps(v) for v in _objects(seaweed, s3_bucket)]  # object keys
    client = seaweed.client()
    texts += [client.get_object(Bucket=s3_bucket, Key=k)["Body"].read().decode(errors="replace")
              for k in _objects(seaweed, s3_bucket)
              if k.endswith(("manifest.json", "LATEST")) or "/.blobs/" in k]
    secret_key = "".join(signing.strip().splitlines()[1:-1])  # the PEM's body
    for secret in (seaweed.secret_key, seaweed.secret_key[::-1], seaweed.access_key,
                   "hf_secret_token_for_test", secret_key):
        assert not any(secret in text for text in texts)


@pytest.mark.slow
def test_endpoint_urls_with_userinfo_are_refused_and_never_echoed(
        seaweed, s3_bucket: str, artifact_factory, neuron_artifact_factory,  # noqa: ANN001
        tmp_path: Path) -> None:
    """Issue 12, must show 6: a user:password@ in an endpoint URL is refused by every command, naming the
    variable, and neither the password nor the user name appears in any output, log file or object."""
    base = {**os.environ, **seaweed.env(), "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    root = f"s3://{s3_bucket}/userinfo"
    signing, verify = generate_keys()  # the neuron version's model.pt is native code: k8s needs it signed
    good = {**{k: v for k, v in base.items() if k not in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")},
            "FUSEDSPEC_SIGNING_KEY": signing, "FUSEDSPEC_VERIFY_KEY": verify}
    served = json.loads(_fusedspec(["publish", str(neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512)),
                                    root, "--json"], good).stdout)["version_uri"]
    before = _objects(seaweed, s3_bucket)
    host = seaweed.endpoint.removeprefix("http://")
    user, password = "fsuser-7q", "fs-pass-9x"  # neither is a word any output holds otherwise
    artifact = str(artifact_factory(k=4))
    commands = [["publish", artifact, root], ["ls", root], ["verify", served],
                ["k8s", served, "--s3-endpoint", CLUSTER_S3], ["gc", root],
                ["publish", artifact, root, "--json"], ["verify", served, "--json"]]
    variables = {"FUSEDSPEC_S3_ENDPOINT_URL": f"http://{user}:{password}@{host}",
                 "AWS_ENDPOINT_URL_S3": f"http://{user}:{password}@{host}/",
                 "HF_ENDPOINT": f"https://{user}:{password}@hub.example"}
    texts = []
    for name, url in variables.items():
        env = {**{k: v for k, v in good.items() if k != "FUSEDSPEC_S3_ENDPOINT_URL"}, name: url}
        if name == "HF_ENDPOINT":
            env["FUSEDSPEC_S3_ENDPOINT_URL"] = seaweed.endpoint
        for argv in commands:
            done = _fusedspec(argv, env)
            assert done.returncode == 2, (name, argv, done.stderr)
            assert name in done.stderr and "user name or password" in done.stderr, done.stderr
            if argv[-1] == "--json":
                assert json.loads(done.stdout)["exit_code"] == 2
            texts.append(done.stdout + done.stderr)
    # a secret in the query string is not refused (boto3 would not send it) but dropped, never written out
    env = {**good, "FUSEDSPEC_S3_ENDPOINT_URL": f"{seaweed.endpoint}/?token={password}"}
    done = _fusedspec(["k8s", served, "--s3-endpoint", f"{CLUSTER_S3}/?token={password}"], env)
    assert done.returncode == 0, done.stderr
    assert f"endpoint-url {CLUSTER_S3}" in done.stdout  # the endpoint itself reaches the mount
    texts.append(done.stdout + done.stderr)
    assert _objects(seaweed, s3_bucket) == before  # nothing was published, swept or repaired
    logs = tmp_path / "work" / "logs"
    texts += [p.read_text() for p in logs.iterdir()] if logs.exists() else []
    for secret in (password, user):
        assert not any(secret in text for text in texts), secret


# --- Must show 9: bad inputs are one clear line, exit 2, nothing written ----------------------------------


def _cli_error(capsys, argv: list[str]) -> tuple[int, str]:  # noqa: ANN001
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return code, err


def test_bad_inputs_exit_2_and_write_nothing(
        seaweed, s3_bucket: str, artifact_factory, tmp_path: Path, capsys,  # noqa: ANN001
        monkeypatch) -> None:
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", seaweed.region)
    artifact = artifact_factory(k=4)
    no_build = tmp_path / "half"
    no_build.mkdir()
    (no_build / "model.pt").write_bytes(b"x")
    cases = [
        (["publish", str(artifact), "s3://"], "names no bucket"),
        (["publish", str(artifact), "gs://bucket/x"], "unknown scheme"),
        (["publish", str(artifact), f"s3://{s3_bucket}/a/../b"], "'..' is not allowed"),
        (["publish", str(no_build), f"s3://{s3_bucket}/x"], "no build.json"),
        (["publish", str(tmp_path / "missing"), f"s3://{s3_bucket}/x"], "no such artifact directory"),
        (["publish", str(artifact), "s3://no-such-bucket-x/x"], "does not exist"),
        (["verify", f"s3://{s3_bucket}/nothing/here"], "nothing to verify"),
        (["k8s", str(tmp_path / "local")], "mounts S3 only"),
    ]
    for argv, words in cases:
        code, err = _cli_error(capsys, argv)
        assert code == 2 and err.startswith(f"fusedspec {argv[0]}: error:") and words in err, err
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    code, err = _cli_error(capsys, ["publish", str(artifact), f"s3://{s3_bucket}/x"])
    assert code == 2 and "did not answer" in err
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    code, err = _cli_error(capsys, ["publish", str(artifact), f"s3://{s3_bucket}/x"])
    assert code == 2 and "check the credentials" in err
    code, err = _cli_error(capsys, ["publish", str(no_build), str(tmp_path / "local-store")])
    assert code == 2
    assert _objects(seaweed, s3_bucket) == {} and not (tmp_path / "local-store").exists()
    assert "error" in json.loads(_json_error(capsys, ["verify", "gs://x/y", "--json"]))


def _json_error(capsys, argv: list[str]) -> str:  # noqa: ANN001
    assert main(argv) == 2
    return capsys.readouterr().out


def test_terminal_progress_reports_every_byte(tmp_path: Path, artifact_factory) -> None:  # noqa: ANN001
    from fusedspec.flows.commands.publish import RichProgress

    settings = Settings(work_dir=tmp_path)
    artifact = artifact_factory(k=2)
    progress = RichProgress()
    publish_artifact(artifact, str(tmp_path / "store"), settings, progress=progress)
    total = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    assert progress._bar.tasks[0].completed == total  # every byte was reported to the bar


def test_a_validated_publish_replaces_an_unvalidated_version_and_becomes_latest(
        tmp_path: Path, artifact_factory) -> None:  # noqa: ANN001
    settings = Settings(work_dir=tmp_path)
    root = str(tmp_path / "store")
    unchecked = publish_artifact(artifact_factory(k=3, validation=False), root, settings, unvalidated=True)
    assert unchecked.created and not unchecked.validated and not unchecked.latest_moved
    checked = publish_artifact(artifact_factory(k=3), root, settings)
    assert checked.key == unchecked.key and checked.validated and checked.latest_moved
    assert checked.attempt != unchecked.attempt and verify_version(_config_uri(root, checked), settings).ok
