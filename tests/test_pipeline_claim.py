"""A worker whose build claim was taken over does not publish (issue 11): it stops before the publish
stage, and the worker that took the claim over publishes. Time is an injected clock (registry.claims), so
the lease runs out when the test says; the build itself is an artifact already in the work dir (a finished
compile is reused, not redone; a hand-made one, so its build.json names other models than the plan),
published unvalidated, so the test is about the claim alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.core.errors import ArtifactError
from fusedspec.core.settings import Settings
from fusedspec.flows.pipeline import ConfigOutcome, _build
from fusedspec.flows.planning import plan_run
from fusedspec.flows.stages import StageClock
from fusedspec.registry.claims import claim_key, try_claim
from fusedspec.registry.stores import open_store
from tests.fixtures.fake_artifacts import make_artifact


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_worker_whose_claim_was_taken_over_does_not_publish(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                              tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    config = run_config_from_dict({
        "target": str(tiny_target), "draft": str(tiny_drafts["cut"]), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                   "dtype": ["float32"]}, "compile": {"aot_inductor": False},
        "publish": {"uri": str(tmp_path / "store"), "unvalidated": True}})
    plan = plan_run(config, settings)
    [planned] = plan.builds
    make_artifact(settings.builds_dir / planned.key, key=planned.key, validation=False)  # compiled earlier
    store = open_store(plan.publish_uri, settings)
    clock = Clock(1_000.0)

    slow = try_claim(store, planned.key, "worker-a", lease_seconds=30, clock=clock)
    assert slow is not None
    clock.now += 31  # worker-a renewed nothing for longer than its lease (a long pause, a lost network)
    taker = try_claim(store, planned.key, "worker-b", lease_seconds=30, clock=clock)
    assert taker is not None
    assert not slow.renew() and slow.lost  # worker-a's next heartbeat learns the claim is gone

    stopped = ConfigOutcome.of(plan, planned, "failed")
    with pytest.raises(ArtifactError, match="claim .* was lost .* stops before publishing"):
        _build(plan, planned, settings, store, slow, stopped, StageClock(planned.slug))
    assert stopped.failed_stage == "publish" and stopped.status == "failed"
    assert [o.key for o in store.list() if o.key.endswith("manifest.json")] == []  # nothing published

    published = ConfigOutcome.of(plan, planned, "failed")
    # the claim's holder does publish
    _build(plan, planned, settings, store, taker, published, StageClock(planned.slug))
    assert published.status == "published" and published.version_uri is not None
    [manifest] = [o.key for o in store.list() if o.key.endswith("manifest.json")]
    assert manifest.endswith(f"/{planned.key}/manifest.json")
    slow.release()
    assert store.head(claim_key(planned.key)) is not None  # the old holder cannot drop the new holder's claim
