"""compile-fused as users run it: `prefect deploy` from prefect.yaml, a process work pool and a worker
(started here), `prefect deployment run compile-fused/local --param config=... --watch`. The run
leaves its table and plot artifacts, the versions land in SeaweedFS and pass `fusedspec verify`;
fan-out over compile-one runs publishes the keys the plan names; a worker killed in the middle of
a matrix costs only what was missing on the re-run."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.fixtures.flow_runs import FlowEnv, run_deployment
from tests.fixtures.servers import stop_process

pytestmark = pytest.mark.slow


def test_deployment_run_publishes_verified_versions_with_ui_artifacts(
        warm_flow_env: FlowEnv, worker: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusedspec.flows.cli import main

    flow_env = warm_flow_env
    run = run_deployment(flow_env, flow_env.config())
    assert run.code == 0, run.output[-3000:]
    # what the user opens: the run named after the pair and matrix, its artifacts on it (progress too)
    assert flow_env.server.flow_run(run.flow_run_id)["name"] == "tiny-target+tiny-draft-perturbed tp1 k3,4 (2 builds)"
    artifacts = {a["key"].rsplit("-", 1)[-1]: a for a in flow_env.server.artifacts(run.flow_run_id) if a.get("key")}
    assert set(artifacts) == {"builds", "summary", "progress"}
    assert all(a["description"] for a in artifacts.values()), "every artifact says what it is"
    assert all(a["key"].startswith("fusedspec-tiny-target-") and "-tiny-draft-perturbed-" in a["key"]
               for a in artifacts.values()), "artifact keys are per model pair"
    assert float(artifacts["progress"]["data"]) == 100.0
    table = artifacts["builds"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert sorted(r["config"] for r in rows) == ["tp1-seq64-k3-bs1-float32", "tp1-seq64-k4-bs1-float32"]
    assert all(r["status"] == "published" for r in rows)
    # the table fits: a short key, the numbers before the long version URI, which comes last
    assert list(rows[0]) == ["config", "key", "status", "tokens/step", "predicted", "speedup",
                             "decode predicted / measured", "near-ties", "compile s", "version"]
    assert all(len(r["key"]) == 12 and r["key"] in r["version"] for r in rows)
    summary = artifacts["summary"]["data"]
    assert "k advice" in summary and "![predicted speedup vs k](data:image/png;base64," in summary
    keys = flow_env.published_keys()
    assert len(keys) == 2
    flow_env.use_env(monkeypatch)
    for row in rows:
        assert row["version"].startswith("s3://")
        assert main(["verify", row["version"]]) == 0


def test_compile_one_fan_out_publishes_the_planned_keys(warm_flow_env: FlowEnv, worker: subprocess.Popen,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    flow_env = warm_flow_env
    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.planning import plan_run

    config = flow_env.config(fan_out={"mode": "deployment", "deployment": "compile-one/local"})
    flow_env.use_env(monkeypatch)
    expected = {b.key for b in plan_run(run_config_from_dict(config), load_settings()).builds}
    run = run_deployment(flow_env, config)
    assert run.code == 0, run.output[-3000:]
    assert flow_env.published_keys() == expected


def test_killed_worker_costs_only_what_was_missing(flow_env: FlowEnv, cold_worker: subprocess.Popen,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    config = flow_env.config()
    run_deployment(flow_env, config, watch=False)
    deadline = time.monotonic() + 600
    while not flow_env.published_keys() and time.monotonic() < deadline:
        time.sleep(0.5)
    stop_process(cold_worker, sig=signal.SIGKILL)  # the worker and the flow run it spawned, mid-matrix
    before = flow_env.published_keys()
    assert len(before) == 1, "the kill should land after the first version and before the second"

    summary = flow_env.run_inprocess(config, monkeypatch)
    reused = {o["key"] for o in summary["outcomes"] if o["status"] == "reused"}
    built = [o for o in summary["outcomes"] if o["status"] == "published"]
    assert reused == before and len(built) == 2 - len(before), summary["text"]
    assert summary["counts"]["compiled"] <= len(built)
    assert flow_env.published_keys() == {o["key"] for o in summary["outcomes"]}
