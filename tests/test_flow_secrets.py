"""No secret crosses a flow boundary (issue 24, must show 6): after a Dask run in this process and a
deployment run on a process worker, both with a Hub token and a manifest signing key in their environment,
nothing the Prefect API holds about them names either: not a flow or task run's parameters, name or state,
not an artifact, a log line, a deployment or a variable; nor the results their processes persisted.
(The dask fan-out once passed Settings as a subflow parameter, which the API stored with the run.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flow_runs import FlowEnv, run_deployment, start_worker
from tests.fixtures.prefect_server import PrefectServer
from tests.fixtures.servers import stop_process

pytestmark = pytest.mark.slow
TOKEN = "hf_" + "NoSuchTokenEverLeaves" * 2


@pytest.fixture
def secret_env(warm_flow_env: FlowEnv,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FlowEnv, list[str]]]:
    """The warm flow env with HF_TOKEN and FUSEDSPEC_SIGNING_KEY set here and for the worker; the secrets."""
    from fusedspec.registry.signing import generate_keys

    private_pem, _ = generate_keys()
    body = "".join(private_pem.strip().splitlines()[1:-1])  # the key material, without the PEM armour
    secrets = {"HF_TOKEN": TOKEN, "FUSEDSPEC_SIGNING_KEY": private_pem}
    warm_flow_env.env.update(secrets)
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    yield warm_flow_env, [TOKEN, body, body[:24]]


def _everything(server: PrefectServer, since: str) -> dict[str, Any]:
    """All the API holds about the runs created since `since`: flow runs (subflows too), their task runs,
    artifacts and logs, and every deployment and variable."""
    flow_runs = server.post("/flow_runs/filter", {"flow_runs": {"expected_start_time": {"after_": since}}})
    ids = [run["id"] for run in flow_runs]
    return {
        "flow_runs": [server.flow_run(i) for i in ids],
        "task_runs": server.post("/task_runs/filter", {"flow_runs": {"id": {"any_": ids}}}),
        "artifacts": [artifact for i in ids for artifact in server.artifacts(i)],
        "logs": [log for i in ids for log in server.logs(i)],
        "deployments": server.post("/deployments/filter", {}),
        "variables": server.post("/variables/filter", {}),
    }


def _stored_results(*homes: Path) -> str:
    texts = []
    for home in homes:
        for path in (home / "storage").glob("*") if (home / "storage").is_dir() else []:
            texts.append(path.read_bytes().decode("latin-1"))
    return "\n".join(texts)


def test_the_prefect_api_holds_no_secret_after_a_dask_run_and_a_deployment_run(
        secret_env: tuple[FlowEnv, list[str]], deployed: PrefectServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_HOME

    flow_env, secrets = secret_env
    since = datetime.now(UTC).isoformat()
    dask = flow_env.run_inprocess(flow_env.config(fan_out={"mode": "dask", "max_workers": 2}), monkeypatch)
    assert dask["counts"]["failed"] == 0 and dask["counts"]["published"] == 2, dask["text"]
    worker = start_worker(flow_env.env, flow_env.work_dir / "worker-secrets.log")
    try:
        run = run_deployment(flow_env, flow_env.config(validation={"cost_ratio": 0.3}))
    finally:
        stop_process(worker)
    assert run.code == 0, run.output[-3000:]
    time.sleep(2)  # the last log batches

    held = _everything(deployed, since)
    names = {run["name"] for run in held["flow_runs"]}
    assert any(name.startswith("tiny-target+") for name in names) and len(held["flow_runs"]) >= 3, names
    assert any(run["parameters"] for run in held["flow_runs"]), "the API holds the runs' parameters"
    dump = json.dumps(held)
    stored = _stored_results(deployed.home, Path(str(PREFECT_HOME.value())))
    for secret in secrets:
        assert secret not in dump, f"the Prefect API holds a secret ({secret[:6]}...)"
        assert secret not in stored, "a persisted result holds a secret"
        assert secret not in run.output
    assert [r["name"] for r in held["flow_runs"] if "settings" in r["parameters"]] == [], \
        "a flow run took Settings as a parameter"
