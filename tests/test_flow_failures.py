"""A build that raises an unexpected error is that build's failed outcome, named with its stage and reason,
and the run still produces its table and publishes every other build: in local, Dask and deployment
fan-out alike (the modes once disagreed: local lost the whole run's report, deployment did not).

The crashes come from the test backend (tests/support/fault_backend.py, backend `cpu-faults`): a
RuntimeError at compile, or at loading the artifact for validation, which no real input causes on demand.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flow_runs import FAULT_PLUGIN, FlowEnv
from tests.fixtures.prefect_server import prefect_cli
from tests.fixtures.servers import start_process, stop_process

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
POOL = "fusedspec-local"

SOUND = "tp1-seq64-k3-bs1-float32"
CRASHES = {"tp1-seq64-k4-bs1-float32": "compile-crash", "tp1-seq64-k5-bs1-float32": "load-crash"}
# One fault list for every mode: it is part of the backend's toolchain, so the sound build has one key in
# all three and the warm work dir compiles and validates it once.
FAULTS = ",".join(f"{fault}:{slug}" for slug, fault in CRASHES.items())


@pytest.fixture(scope="module")
def compile_one_deployed(prefect_server: Any) -> None:
    """The compile-one deployment on a process work pool (what fan_out.mode=deployment runs), deployed
    where the fault plugin is configured: its parameter schema, which the server enforces, names the
    backends of the host that deployed it, so `cpu-faults` is one of them (on top of cpu and neuron)."""
    env = {**prefect_server.env, "FUSEDSPEC_BACKEND_PLUGINS": FAULT_PLUGIN, "PYTHONPATH": str(REPO)}
    for args in (["work-pool", "create", POOL, "--type", "process"],
                 ["--no-prompt", "deploy", "--name", "compile-one/local"]):
        done = subprocess.run([prefect_cli(), *args], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0 or "already exists" in done.stdout + done.stderr, \
            done.stdout + done.stderr


@contextmanager
def _worker(flow_env: FlowEnv) -> Iterator[None]:
    """A worker started with the run's environment, the fault plugin included, and the repository on the
    path: compile-one runs in a temporary directory and imports tests.support.fault_backend by name.
    No wait for it to come up: the parent's run_deployment waits for the runs it schedules."""
    proc = start_process([prefect_cli(), "worker", "start", "--pool", POOL, "--limit", "2"],
                         flow_env.work_dir / "worker-faults.log", {**flow_env.env, "PYTHONPATH": str(REPO)},
                         cwd=REPO)
    try:
        yield
    finally:
        stop_process(proc)


def _latest(api_url: str, key: str) -> Any:
    with urllib.request.urlopen(f"{api_url}/artifacts/{key}/latest", timeout=30) as response:
        data = json.loads(response.read())["data"]
    return json.loads(data) if isinstance(data, str) and data.startswith("[") else data


@pytest.mark.parametrize("mode, k, stage", [("local", 4, "compile"), ("dask", 5, "validate"),
                                           ("deployment", 5, "validate")])
def test_an_unexpected_error_fails_that_build_alone(
        mode: str, k: int, stage: str, warm_flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.artifacts import artifact_key
    from fusedspec.flows.planning import plan_drafts

    flow_env = warm_flow_env
    flow_env.use_faults(monkeypatch, FAULTS)
    crashed = f"tp1-seq64-k{k}-bs1-float32"  # k4 crashes compiling, k5 loading for validation
    config = flow_env.config(backend="cpu-faults", matrix={"speculation_length": [3, k]},
                             fan_out={"mode": mode, "max_workers": 2})
    if mode == "deployment":
        request.getfixturevalue("compile_one_deployed")
        with _worker(flow_env):
            summary = flow_env.run_inprocess(config, monkeypatch)
    else:
        summary = flow_env.run_inprocess(config, monkeypatch)

    outcomes = {o["slug"]: o for o in summary["outcomes"]}
    assert {slug: o["status"] for slug, o in outcomes.items()} == {SOUND: "published", crashed: "failed"}, \
        summary["text"]
    verb = CRASHES[crashed].split("-")[0]
    reason = f"unexpected RuntimeError: injected {verb} crash for {crashed}"
    assert (outcomes[crashed]["failed_stage"], outcomes[crashed]["reason"]) == (stage, reason)
    assert f"failed: {crashed} ({stage})" in summary["failed"]  # the run's one-line outcome names it
    assert not (stage == "compile" and outcomes[crashed]["compiled"])  # a crashed compile made nothing
    crashed_row = next(line for line in summary["text"].splitlines() if line.strip().startswith(crashed))
    assert f"failed    {outcomes[crashed]['key'][:12]}" in crashed_row and f"{stage}: {reason}" in crashed_row

    assert flow_env.published_keys() == {outcomes[SOUND]["key"]}  # nothing of the crashed build

    # The same in the Prefect UI, as this run left it: the table's status, the summary's reason and version.
    flow_env.use_env(monkeypatch)
    plans = plan_drafts(run_config_from_dict(config), load_settings())
    rows = {row["config"]: row for row in _latest(flow_env.api_url, artifact_key(plans, "builds"))}
    assert rows[crashed]["status"] == f"failed ({stage})" and rows[SOUND]["status"] == "published"
    summary = _latest(flow_env.api_url, artifact_key(plans, "summary"))
    assert f"- `{crashed}` failed: {stage}: {reason}" in summary, summary
    assert f"- `{SOUND}` published: `{outcomes[SOUND]['version_uri']}`" in summary, summary
