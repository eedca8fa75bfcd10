"""Crash safety: a publisher process killed with SIGKILL at chosen and at random moments never leaves a
version that a reader (ls, verify, LATEST) sees as complete when it is not, and a re-run completes it.

The publisher runs in a subprocess (the real `publish_artifact` against SeaweedFS). Its `on_step` and
progress hooks write a marker file and stop at a named point ("upload:<file>", "part:<n>" = after the
n-th piece of data went out, mid multipart upload, "before-manifest", "before-latest"), so the kill lands
exactly there; random trials kill at a random time after the publisher has started, with parts slowed
down a little so that random moments fall inside the uploads.
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
from pathlib import Path

import pytest

from compile.errors import StoreError
from compile.settings import Settings
from registry.listing import list_versions
from registry.publish import publish_artifact
from registry.stores import open_store
from registry.verify import verify_version

CHILD = r"""
import sys, time
from pathlib import Path
from compile.settings import load_settings
from registry.publish import publish_artifact
from registry.stores import open_store

artifact, uri, pause_at, marker, slow = sys.argv[1:6]
settings = load_settings()
store = open_store(uri, settings, part_size=5 << 20, multipart_threshold=5 << 20, max_concurrency=2)

def hold(name):
    if name == "hashed":
        Path(marker + ".started").write_text("started")
    if name == pause_at:
        Path(marker).write_text(name)
        time.sleep(600)

class Progress:
    pieces = 0
    def begin(self, total_bytes, files): pass
    def advance(self, nbytes):
        Progress.pieces += 1
        hold(f"part:{Progress.pieces}")
        time.sleep(float(slow))
    def end(self): pass

publish_artifact(Path(artifact), uri, settings, store=store, on_step=hold, progress=Progress())
Path(marker + ".done").write_text("done")
"""

# Files are published in sorted order: 4 top-level files, 2 programs, then the one shard (parts of 5 + 1 MiB):
# "part:7" is the moment its first part is through and the multipart upload is still open.
NAMED = ["upload:weights/tp0_sharded_checkpoint.safetensors", "part:7", "part:7",
         "stored:weights/tp0_sharded_checkpoint.safetensors", "before-manifest", "before-latest"]


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"publisher exited {process.returncode} before {path.name}: "
                                 f"{process.stderr.read().decode() if process.stderr else ''}")
        assert time.monotonic() < deadline, f"publisher never reached {path.name}"
        time.sleep(0.02)


def _stage(store, seaweed, bucket: str, config: str, key: str) -> str:  # noqa: ANN001
    """Where the publish was when it died, read from the store (and its open multipart uploads)."""
    version = f"{config}/{key}"
    names = {o.key[len(version) + 1:] for o in store.list(version)}
    uploads = seaweed.client().list_multipart_uploads(Bucket=bucket, Prefix=f"crash/{version}/").get("Uploads", [])
    latest = store.get(f"{config}/LATEST").decode() if store.head(f"{config}/LATEST") else ""
    if "manifest.json" in names:
        return "complete" if key in latest else "manifest, LATEST not moved"
    if len(names) >= 7:
        return "all files, no manifest"
    if uploads:
        return "mid multipart upload"
    return "during uploads" if names else "nothing stored"


def _readers_see_only_complete_versions(root: str, config: str, key: str, settings: Settings) -> None:
    store = open_store(root, settings)
    has_manifest = store.head(f"{config}/{key}/manifest.json") is not None
    listed = {v.key for entry in list_versions(root, settings) for v in entry.versions}
    assert (key in listed) == has_manifest  # ls shows a version exactly when it is complete
    try:
        report = verify_version(f"{root}/{config}/{key}", settings)
        assert report.ok == has_manifest, report.problems  # and then every byte matches its manifest
    except StoreError:
        assert not has_manifest  # nothing of this version stored yet
    latest = store.head(f"{config}/LATEST")
    if latest is None:
        assert not listed  # no LATEST only while nothing of this config is complete
    elif json.loads(store.get(f"{config}/LATEST"))["key"] == key:
        assert has_manifest  # LATEST names this version only once it is complete (verified above)
    else:
        by_latest = verify_version(f"{root}/{config}", settings)
        assert by_latest.ok, by_latest.problems  # LATEST only ever names complete versions


@pytest.mark.slow
def test_kill_9_at_chosen_and_random_moments(seaweed, s3_bucket: str, s3_settings: Settings,
                                             artifact_factory, tmp_path: Path) -> None:  # noqa: ANN001
    rng = random.Random(1234)
    root = f"s3://{s3_bucket}/crash"
    env = {**os.environ, **seaweed.env()}
    plans = [(name, None) for name in NAMED * 2] + [(None, rng.uniform(0.0, 1.2)) for _ in range(6)]
    stages: Counter[str] = Counter()
    for trial, (pause_at, delay) in enumerate(plans):
        artifact = artifact_factory(k=4, tp=1, weight_mib=6, weights_seed=100 + trial,
                                    key=f"{trial:04d}".ljust(64, "c"))
        marker = tmp_path / f"marker-{trial}"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(artifact), root, pause_at or "", str(marker), "0.05"],
            env=env, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if pause_at is not None:
                _wait_for(marker, child)
            else:
                _wait_for(marker.with_name(marker.name + ".started"), child)
                time.sleep(delay or 0.0)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.wait(30)
        store = open_store(root, s3_settings)
        config, key = _config_and_key(artifact)
        stage = _stage(store, seaweed, s3_bucket, config, key)
        stages[stage] += 1
        _readers_see_only_complete_versions(root, config, key, s3_settings)

        rerun = publish_artifact(artifact, root, s3_settings)
        assert rerun.key == key and verify_version(rerun.version_uri, s3_settings).ok
        assert json.loads(store.get(f"{config}/LATEST"))["key"] == key  # LATEST moved to it
    print(f"\n{len(plans)} kill -9 trials, stage reached when killed: {dict(stages)}")
    assert stages["mid multipart upload"] >= 4 and stages["all files, no manifest"] >= 4
    assert stages["manifest, LATEST not moved"] >= 2


def _config_and_key(artifact: Path) -> tuple[str, str]:
    build = json.loads((artifact / "build.json").read_text())
    spec = build["spec"]
    slug = f"tp{spec['tp_degree']}-seq{spec['seq_len']}-k{spec['speculation_length']}-bs{spec['batch_size']}-{spec['dtype']}"
    return f"Qwen--Qwen3-32B/Qwen--Qwen3-1.7B/{slug}", build["key"]
