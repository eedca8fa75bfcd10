"""compile-fused as users run it: `prefect deploy` from prefect.yaml, a process work pool and a worker
(started here), `prefect deployment run compile-fused/local --param config=... --watch`. The run
leaves its table and plot artifacts, the versions land in SeaweedFS and pass `fusedspec verify`;
fan-out over compile-one runs publishes the keys the plan names; a worker killed in the middle of
a matrix costs only what was missing on the re-run."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flow_runs import FlowEnv
from tests.fixtures.prefect_server import prefect_cli
from tests.fixtures.servers import start_process, stop_process

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
POOL = "fusedspec-local"


def _prefect(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([prefect_cli(), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def deployed(prefect_server: Any) -> dict[str, str]:
    env = prefect_server.env
    created = _prefect(["work-pool", "create", POOL, "--type", "process"], env)
    assert created.returncode == 0 or "already exists" in created.stdout + created.stderr, created.stderr
    done = _prefect(["--no-prompt", "deploy", "--name", "compile-fused/local", "--name", "compile-one/local"], env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return env


def _start_worker(env: FlowEnv) -> subprocess.Popen:
    log = env.work_dir / "worker.log"
    proc = start_process([prefect_cli(), "worker", "start", "--pool", POOL, "--limit", "4"], log,
                         {**env.env, "PREFECT_WORKER_QUERY_SECONDS": "1"}, cwd=REPO)
    time.sleep(3)
    return proc


@pytest.fixture
def worker(deployed: dict[str, str], warm_flow_env: FlowEnv) -> Iterator[subprocess.Popen]:
    """A worker whose flow runs use the shared warm work dir (builds cached by content)."""
    proc = _start_worker(warm_flow_env)
    yield proc
    stop_process(proc)


@pytest.fixture
def cold_worker(deployed: dict[str, str], flow_env: FlowEnv) -> Iterator[subprocess.Popen]:
    """A worker on a fresh work dir: every build is compiled from scratch."""
    proc = _start_worker(flow_env)
    yield proc
    stop_process(proc)


def _run_deployment(flow_env: FlowEnv, config: dict[str, Any], *, watch: bool = True) -> tuple[int, str, str]:
    args = ["deployment", "run", "compile-fused/local", "--param", f"config={json.dumps(config)}"]
    done = _prefect([*args, "--watch", "--watch-timeout", "900"] if watch else args, flow_env.env, timeout=1000)
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    assert match, done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode, match.group(1), done.stdout + done.stderr


def _artifacts(api_url: str, flow_run_id: str) -> list[dict[str, Any]]:
    body = json.dumps({"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).encode()
    request = urllib.request.Request(f"{api_url}/artifacts/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_deployment_run_publishes_verified_versions_with_ui_artifacts(
        warm_flow_env: FlowEnv, worker: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.cli import main

    flow_env = warm_flow_env
    code, run_id, output = _run_deployment(flow_env, flow_env.config())
    assert code == 0, output[-3000:]
    artifacts = {a["key"].rsplit("-", 1)[-1]: a for a in _artifacts(flow_env.api_url, run_id) if a.get("key")}
    table = artifacts["builds"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert sorted(r["config"] for r in rows) == ["tp1-seq64-k3-bs1-float32", "tp1-seq64-k4-bs1-float32"]
    assert all(r["status"] == "published" for r in rows)
    assert "k advice" in artifacts["summary"]["data"] and "data:image/png;base64," in artifacts["summary"]["data"]
    assert all(a["description"] for a in artifacts.values())
    keys = flow_env.published_keys()
    assert len(keys) == 2
    flow_env.use_env(monkeypatch)
    for row in rows:
        assert row["version"].startswith("s3://")
        assert main(["verify", row["version"]]) == 0


def test_compile_one_fan_out_publishes_the_planned_keys(warm_flow_env: FlowEnv, worker: subprocess.Popen,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    flow_env = warm_flow_env
    from compile.runconfig import run_config_from_dict
    from compile.settings import load_settings
    from flows.planning import plan_run

    config = flow_env.config(fan_out={"mode": "deployment", "deployment": "compile-one/local"})
    flow_env.use_env(monkeypatch)
    expected = {b.key for b in plan_run(run_config_from_dict(config), load_settings()).builds}
    code, _, output = _run_deployment(flow_env, config)
    assert code == 0, output[-3000:]
    assert flow_env.published_keys() == expected


def test_killed_worker_costs_only_what_was_missing(flow_env: FlowEnv, cold_worker: subprocess.Popen,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    config = flow_env.config()
    _run_deployment(flow_env, config, watch=False)
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
