"""compile-fused as users run it: `prefect deploy` from prefect.yaml, a process work pool and a worker
(started here), `prefect deployment run compile-fused/local --param config=... --watch`. The run
leaves its table and plot artifacts, the versions land in SeaweedFS and pass `fusedspec verify`;
fan-out over compile-one runs publishes the keys the plan names; a worker killed in the middle of
a matrix costs only what was missing on the re-run; a re-run with another cost ratio advises with it;
`fusedspec submit` sends a YAML run config to the deployment and follows it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.flow_runs import FlowEnv, flow_result, run_deployment
from tests.fixtures.servers import stop_process

pytestmark = pytest.mark.slow


def test_deployment_run_publishes_verified_versions_with_ui_artifacts(
        warm_flow_env: FlowEnv, worker: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusedspec.flows.cli import main

    flow_env = warm_flow_env
    run = run_deployment(flow_env, flow_env.config())
    assert run.code == 0, run.output[-3000:]
    # what the user opens: the run named after the pair and matrix, its artifacts on it (progress too)
    assert flow_env.server.flow_run(run.flow_run_id)["name"] == \
        "tiny-target+tiny-draft-perturbed tp1 k3,4 (2 builds)"
    artifacts = {a["key"].rsplit("-", 1)[-1]: a for a in flow_env.server.artifacts(run.flow_run_id)
                 if a.get("key")}
    assert set(artifacts) == {"builds", "stages", "summary", "progress"}
    assert all(a["description"] for a in artifacts.values()), "every artifact says what it is"
    assert all(a["key"].startswith("fusedspec-tiny-target-") and "-tiny-draft-perturbed-" in a["key"]
               for a in artifacts.values()), "artifact keys are per model pair"
    assert float(artifacts["progress"]["data"]) == 100.0
    table = artifacts["builds"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert sorted(r["config"] for r in rows) == ["tp1-seq64-k3-bs1-float32", "tp1-seq64-k4-bs1-float32"]
    assert all(r["status"] == "published" and r["work"] in ("compile", "reuse programs", "publish build")
               for r in rows)  # the warm work dir may hold the builds already (publish build)
    # the table fits a 1400 px window: numbers only (and what each build did); the version URIs are in the
    # summary
    assert list(rows[0]) == ["config", "status", "work", "tokens/step", "predicted", "speedup", "near-ties",
                             "seconds"]
    summary = artifacts["summary"]["data"]
    versions = dict(re.findall(r"^- `([^`]+)` published: `([^`]+)`$", summary, re.M))
    assert sorted(versions) == sorted(r["config"] for r in rows), summary
    assert "k advice" in summary and "![predicted speedup vs k](data:image/png;base64," in summary
    keys = flow_env.published_keys()
    assert len(keys) == 2
    flow_env.use_env(monkeypatch)
    for version in versions.values():
        assert version.startswith("s3://") and version.rsplit("/", 1)[-1] in keys
        assert main(["verify", version]) == 0


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
    # The worker and the flow run it spawned, mid-matrix. Prefect starts a flow run in a session of its own,
    # which a kill of the worker's group misses: seen alive, it published the second version after the kill.
    spawned = psutil.Process(cold_worker.pid).children(recursive=True)
    stop_process(cold_worker, sig=signal.SIGKILL)
    for process in spawned:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(spawned, timeout=30)
    before = flow_env.published_keys()
    assert len(before) == 1, "the kill should land after the first version and before the second"

    summary = flow_env.run_inprocess(config, monkeypatch)
    reused = {o["key"] for o in summary["outcomes"] if o["status"] == "reused"}
    built = [o for o in summary["outcomes"] if o["status"] == "published"]
    assert reused == before and len(built) == 2 - len(before), summary["text"]
    assert summary["counts"]["compiled"] <= len(built)
    assert flow_env.published_keys() == {o["key"] for o in summary["outcomes"]}


def test_a_rerun_with_another_cost_ratio_advises_with_it(warm_flow_env: FlowEnv,
                                                         worker: subprocess.Popen) -> None:
    """Must show 1: the second run reuses both builds, and its advice is its own: every prediction re-scored
    from the stored acceptance at c = 0.4 (speedup = tokens / (steps (1 + k c))), not the first run's 0.1."""
    flow_env = warm_flow_env
    first = run_deployment(flow_env, flow_env.config())  # validation.cost_ratio 0.1
    assert first.code == 0, first.output[-3000:]
    second = run_deployment(flow_env, flow_env.config(validation={"cost_ratio": 0.4}))
    assert second.code == 0, second.output[-3000:]
    before, after = (flow_result(flow_env.api_url, first.flow_run_id),
                     flow_result(flow_env.api_url, second.flow_run_id))
    assert after.counts.reused == 2 and after.counts.compiled == 0, after.text
    assert before.advice.cost_model.cost_ratio == 0.1 and after.advice.cost_model.cost_ratio == 0.4
    for outcome in after.outcomes:
        assert outcome.advice is not None and outcome.advice.cost_model.cost_ratio == 0.4, outcome.slug
        for cls in outcome.advice.classes:
            for row in cls.by_k:
                assert row.speedup == pytest.approx(row.tokens / (row.steps * (1 + row.k * 0.4))), \
                    (cls.cls, row)
    line = "k advice among the built ks (draft/target step cost c = 0.400, verify slope b = 0.000; given)"
    assert line in after.text and line in second.output, after.text
    slower = {r.cls: r.predicted_speedup for r in after.recommendations}
    assert all(slower[r.cls] < r.predicted_speedup for r in before.recommendations if r.predicted_speedup), \
        (before.recommendations, after.recommendations)


def test_submit_sends_a_yaml_run_config_to_the_deployment_and_follows_it(
        warm_flow_env: FlowEnv, worker: subprocess.Popen, tmp_path: Path) -> None:
    import sys

    import yaml

    flow_env = warm_flow_env
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(flow_env.config(matrix={"speculation_length": [3]})))
    fusedspec = str(Path(sys.executable).with_name("fusedspec"))
    done = subprocess.run([fusedspec, "submit", str(config), "--deployment", "compile-fused/local",
                           "--watch"], env=flow_env.env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    created = re.search(r"created flow run '([^']+)' \(([0-9a-f-]{36})\) of compile-fused/local", done.stdout)
    assert created and created.group(1) == "tiny-target+tiny-draft-perturbed tp1 k3 (1 build)", \
        done.stdout[:2000]
    assert flow_env.server.flow_run(created.group(2))["state"]["type"] == "COMPLETED"
    assert re.search(r"tp1-seq64-k3-bs1-float32: claim [\d.]+ s", done.stdout), done.stdout[-3000:]
    assert re.search(r"1 config\(s\): .* versions under s3://", done.stdout), done.stdout[-3000:]

    # refused here, before any run is created, in the plan's words
    config.write_text(yaml.safe_dump(flow_env.config(matrix={"speculation_length": [1]})))
    refused = subprocess.run([fusedspec, "submit", str(config), "--watch"], env=flow_env.env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "matrix.speculation_length[0]: 1 is less than the minimum of 2" in \
        refused.stderr, refused.stderr
    assert "created flow run" not in refused.stdout
