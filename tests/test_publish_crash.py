"""Crash safety: a publisher process killed with SIGKILL at any point of the protocol never leaves a version
that a reader (ls, verify, LATEST) sees as complete when it is not; a re-run completes it, and afterwards
nothing of the killed attempt remains: no object, no unfinished multipart upload, no temp file, no marker.

The publisher runs in a subprocess (the real `publish_artifact`, against real SeaweedFS and a directory
store). Its `on_step` and progress hooks write a marker file and stop at a named point ("attempt",
"upload:<file>", "part:<n>" = after the n-th piece of data went out, "before-manifest", "committed", ...),
so the kill lands exactly there. The "random" trials draw their moment from a seeded generator over the
same points and over every piece of data, so each run tries the same moments: deterministic, unlike
killing after a random time, and it still covers moments inside the multipart upload. Trials run four at
a time, each on its own version.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fusedspec.core.errors import StoreError
from fusedspec.core.settings import Settings
from fusedspec.registry.listing import list_versions
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.stores import open_store
from fusedspec.registry.verify import verify_version
from tests.support.store_checks import leftovers

CHILD = r"""
import sys, time
from pathlib import Path
from fusedspec.core.settings import load_settings
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.stores import open_store

artifact, uri, pause_at, marker = sys.argv[1:5]
settings = load_settings()
store = open_store(uri, settings, part_size=5 << 20, multipart_threshold=5 << 20, max_concurrency=1)

def hold(name):
    if name == pause_at:
        Path(marker).write_text(name)
        time.sleep(600)

class Progress:
    pieces = 0
    def begin(self, total_bytes, files): pass
    def advance(self, nbytes):
        Progress.pieces += 1
        hold(f"part:{Progress.pieces}")
    def end(self): pass

publish_artifact(Path(artifact), uri, settings, store=store, on_step=hold, progress=Progress())
Path(marker + ".done").write_text("done")
"""

# Files go out in sorted order: build.json, two programs, two tokenizer files, validation.json (one piece
# each), then the 6 MiB shard as a 5 + 1 MiB multipart upload: "part:7" falls inside it.
SHARD = "weights/tp0_sharded_checkpoint.safetensors"
NAMED = ["hashed", "attempt", "upload:build.json", "part:3", "stored:tokenizer.json", "part:7",
         f"stored:{SHARD}", "before-manifest", "committed", "before-latest"]
PIECES = 8


def _moments() -> list[str]:
    rng = random.Random(1234)
    drawn = [rng.choice(NAMED + [f"part:{n}" for n in range(1, PIECES + 1)]) for _ in range(10)]
    return NAMED + drawn


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"publisher exited {process.returncode} before {path.name}: "
                                 f"{process.stderr.read().decode() if process.stderr else ''}")
        assert time.monotonic() < deadline, f"publisher never reached {path.name}"
        time.sleep(0.02)


def _readers_see_only_complete_versions(root: str, config: str, key: str, settings: Settings) -> bool:
    """Everything a reader can see of a killed publish is consistent; True when its version is complete."""
    store = open_store(root, settings)
    has_manifest = store.head(f"{config}/{key}/manifest.json") is not None
    try:
        listed = {v.key for entry in list_versions(root, settings) for v in entry.versions}
    except StoreError:  # a directory store killed before its first write: ls refuses the missing root
        assert store.uri.local_root is not None and not store.uri.local_root.exists()
        listed = set()
    assert (key in listed) == has_manifest  # ls shows a version exactly when it is committed
    try:
        report = verify_version(f"{root}/{config}/{key}", settings)
        assert report.ok == has_manifest, report.problems  # and then every byte matches its manifest
    except StoreError:
        assert not has_manifest  # nothing of this version stored yet
    if store.head(f"{config}/LATEST") is not None:
        assert json.loads(store.get(f"{config}/LATEST"))["key"] == key and has_manifest
    return has_manifest


def _trial(trial: int, moment: str, root: str, settings: Settings, env: dict[str, str],
           make_artifact, tmp_path: Path) -> tuple[str, bool]:  # noqa: ANN001
    root = f"{root}/t{trial}"  # each trial its own store root: LATEST and listings are its own
    artifact = make_artifact(tmp_path / f"artifact-{trial}", k=4, tp=1, weight_mib=6,
                             weights_seed=100 + trial, key=f"{trial:04d}".ljust(64, "c"))
    marker = tmp_path / f"marker-{trial}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(artifact), root, moment, str(marker)],
                             env=env, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        _wait_for(marker, child)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    config, key = _config_and_key(artifact)
    complete = _readers_see_only_complete_versions(root, config, key, settings)

    rerun = publish_artifact(artifact, root, settings)
    assert rerun.key == key and verify_version(rerun.version_uri, settings).ok
    store = open_store(root, settings)
    assert json.loads(store.get(f"{config}/LATEST"))["key"] == key  # LATEST moved to it
    assert leftovers(store, config, key, rerun.attempt) == []  # nothing of the killed attempt
    return moment, complete


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "local"])
def test_kill_9_at_every_point_leaves_nothing_after_a_rerun(kind: str, artifact_factory,  # noqa: ANN001
                                                            tmp_path: Path, request) -> None:
    from tests.fixtures.fake_artifacts import make_artifact

    if kind == "s3":
        seaweed = request.getfixturevalue("seaweed")
        root, settings = (f"s3://{request.getfixturevalue('s3_bucket')}/crash",
                          request.getfixturevalue("s3_settings"))
        env = {**os.environ, **seaweed.env()}
    else:
        root, settings = str(tmp_path / "store"), Settings(work_dir=tmp_path / "work")
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    moments = _moments()
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(
            lambda item: _trial(item[0], item[1], root, settings, env, make_artifact, tmp_path),
            enumerate(moments)))
    stages = Counter("complete" if done else "not committed" for _moment, done in outcomes)
    print(f"\n{kind}: {len(outcomes)} kill -9 trials; the version was {dict(stages)} when killed; every "
          "re-run completed it and left nothing of the killed attempt")
    assert len(outcomes) >= 20
    assert stages["complete"] >= 2 and stages["not committed"] >= 10  # both sides of the commit were hit


def _config_and_key(artifact: Path) -> tuple[str, str]:
    from fusedspec.compile.backend import read_build_description
    from fusedspec.registry.publish import config_path_of

    description = read_build_description(artifact)
    return config_path_of(description), description.key


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_gc_lists_then_removes_a_killed_publishers_attempt_and_upload(
        kind: str, artifact_factory, tmp_path: Path, request, capsys, monkeypatch) -> None:  # noqa: ANN001
    from fusedspec.flows.cli import main
    from tests.fixtures.fake_artifacts import make_artifact

    if kind == "s3":
        seaweed = request.getfixturevalue("seaweed")
        root, settings = (f"s3://{request.getfixturevalue('s3_bucket')}/gc",
                          request.getfixturevalue("s3_settings"))
        env = {**os.environ, **seaweed.env()}
        monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    else:
        root, settings = str(tmp_path / "store"), Settings(work_dir=tmp_path / "work")
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    artifact = make_artifact(tmp_path / "artifact", k=4, tp=1, weight_mib=6, weights_seed=9)
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(artifact), root, "part:7", str(marker)],
                             env=env, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        _wait_for(marker, child)  # inside the shard's upload: one part sent, the upload unfinished
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    config, key = _config_and_key(artifact)
    store = open_store(root, settings)
    version = f"{config}/{key}"
    [upload] = store.list_uploads(version)
    objects = [o.key for o in store.list(version)]
    [attempt] = {k[len(version) + 1:].split("/", 1)[0] for k in objects}
    assert objects and upload.key.startswith(f"{version}/{attempt}/")

    assert main(["gc", root, "--dry-run", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["store"]
    assert listed["attempts"] == [f"{version}/{attempt}"] and listed["uploads"] == [upload.key]
    assert [o.key for o in store.list(version)] == objects and store.list_uploads(version) == [upload]

    assert main(["gc", root, "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["store"]
    assert removed["attempts"] == listed["attempts"] and removed["uploads"] == listed["uploads"]
    assert removed["markers"] == [f".attempts/{version}/{attempt}.json"]
    assert store.list(version) == [] and store.list_uploads(version) == [] and \
        store.list(f".attempts/{version}") == []
    assert main(["gc", root]) == 0 and "removed 0 attempt(s)" in capsys.readouterr().out


# A publisher that stops inside its shard's upload (piece 7, as above) until told to go on: a live publish
# in flight, renewing its marker, for as long as a test needs.
HELD = r"""
import sys, time
from pathlib import Path
from fusedspec.core.settings import load_settings
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.stores import open_store

artifact, uri, marker, release = sys.argv[1:5]
settings = load_settings()
store = open_store(uri, settings, part_size=5 << 20, multipart_threshold=5 << 20, max_concurrency=1)

class Progress:
    pieces = 0
    def begin(self, total_bytes, files): pass
    def advance(self, nbytes):
        Progress.pieces += 1
        if Progress.pieces == 7:
            Path(marker).write_text("in flight")
            while not Path(release).exists():
                time.sleep(0.05)
    def end(self): pass

print(publish_artifact(Path(artifact), uri, settings, store=store, progress=Progress()).version_uri)
"""

GC = r"""
import json, sys
from fusedspec.core.settings import load_settings
from fusedspec.registry.gc import collect_store
print(json.dumps(collect_store(sys.argv[1], load_settings()).to_json()))
"""


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_gc_on_a_host_whose_clock_is_ahead_destroys_no_live_publish(kind: str, tmp_path: Path,
                                                                    request) -> None:  # noqa: ANN001
    """A gc on a host 700 s ahead took every live publisher elsewhere for dead (its heartbeat looked older
    than the 600 s lease) and destroyed 3 of 3 publishes in flight on S3 (NoSuchUpload)."""
    from tests.fixtures.fake_artifacts import make_artifact
    from tests.support.skewed_clock import run_skewed

    if kind == "s3":
        seaweed = request.getfixturevalue("seaweed")
        root, settings = (f"s3://{request.getfixturevalue('s3_bucket')}/skew",
                          request.getfixturevalue("s3_settings"))
        env = {**os.environ, **seaweed.env()}
    else:
        root, settings = str(tmp_path / "store"), Settings(work_dir=tmp_path / "work")
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    release = tmp_path / "release"
    publishers = []
    for n in range(3):
        artifact = make_artifact(tmp_path / f"artifact-{n}", k=4 + n, tp=1, weight_mib=6, weights_seed=40 + n)
        marker = tmp_path / f"in-flight-{n}"
        child = subprocess.Popen([sys.executable, "-c", HELD, str(artifact), root, str(marker), str(release)],
                                 env=env, cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        publishers.append((child, marker))
    try:
        for child, marker in publishers:
            _wait_for(marker, child)
        store = open_store(root, settings)
        in_flight = store.list_uploads()
        assert len(in_flight) == 3
        swept = json.loads(run_skewed(700, GC, root, env=env).stdout)
        assert swept["attempts"] == [] and swept["uploads"] == [], swept  # nothing of a live publish
        assert store.list_uploads() == in_flight
    finally:
        release.write_text("go")
        outputs = [child.communicate(timeout=120) for child, _ in publishers]
    for (child, _), (out, err) in zip(publishers, outputs, strict=True):
        assert child.returncode == 0, err.decode()  # each finished its upload: nothing was aborted under it
        assert verify_version(out.decode().strip(), settings).ok


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_gc_leaves_no_orphan_upload_temp_file_or_empty_directory(kind: str, tmp_path: Path,
                                                                 request) -> None:  # noqa: ANN001
    """gc left the temp files of killed writers outside attempts, unfinished uploads of a committed attempt
    (its publisher gone), and the empty directories of the attempts it removed."""
    from tests.fixtures.fake_artifacts import make_artifact

    if kind == "s3":
        seaweed, bucket = request.getfixturevalue("seaweed"), request.getfixturevalue("s3_bucket")
        root, settings = f"s3://{bucket}/tidy", request.getfixturevalue("s3_settings")
        env = {**os.environ, **seaweed.env()}
    else:
        root, settings = str(tmp_path / "store"), Settings(work_dir=tmp_path / "work")
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    artifact = make_artifact(tmp_path / "artifact", k=4, tp=1, weight_mib=6, weights_seed=60)
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(artifact), root, "part:7", str(marker)],
                             env=env, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        _wait_for(marker, child)
        os.kill(child.pid, signal.SIGKILL)  # inside its shard: an attempt, a marker, an unfinished upload
    finally:
        child.wait(30)
    kept = publish_artifact(make_artifact(tmp_path / "other", k=5, tp=1, weight_mib=1, weights_seed=61), root,
                            settings)
    attempt_dir = f"{kept.config_path}/{kept.key}/{kept.attempt}"
    if kind == "s3":  # a part upload its publisher could not abort, in the committed attempt
        seaweed.client().create_multipart_upload(Bucket=bucket, Key=f"tidy/{attempt_dir}/weights/retried")
    else:  # temp files of writers killed long ago (outside attempts) and a moment ago (kept: it may be live)
        config_dir = Path(root) / kept.config_path
        for name, age in ((".LATEST.tmp-0123456789ab", 3600), (".LATEST.tmp-fresh0123456", 0)):
            (config_dir / name).write_text("{")
            os.utime(config_dir / name, (time.time() - age, time.time() - age))
    assert main_gc(root, env) == 0
    store = open_store(root, settings)
    assert store.list_uploads() == ([] if kind == "s3"
                                    else [u for u in store.list_uploads() if "fresh" in u.key])
    assert verify_version(kept.version_uri, settings).ok
    if kind == "local":
        empty = [p for p in Path(root).rglob("*") if p.is_dir() and not any(p.iterdir())]
        assert empty == [] and len(store.list_uploads()) == 1


def main_gc(root: str, env: dict[str, str]) -> int:
    return subprocess.run([sys.executable, "-m", "fusedspec.flows.cli", "gc", root], env=env, timeout=120,
                          cwd=Path(__file__).parents[1], capture_output=True).returncode
