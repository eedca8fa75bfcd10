"""What a platform team meets in Prefect, read where they read it: the REST API the UI and `prefect` CLI
use (GET /api/flow_runs/{id}, POST /api/logs/filter, POST /api/artifacts/filter, GET /ui-settings), on a
real server with real process workers.

- A bad parameter is refused when the run is created, naming the field; the form's schema carries the
  bounds and the help text.
- A run that cannot plan ends Failed with the reason, one line, as its state message and first log line.
- A build's near-tie reaches the run's logs once with its count, the one-line outcome is the last log line,
  and a re-run (every build reused) shows the same near-tie counts in its table.
- The README's server/worker/deploy/run sequence, run verbatim on a port other than 4200 with no
  FUSEDSPEC_WORK_DIR: the UI is told the right API URL, and the run without a `publish` key leaves its
  versions in the default work dir's store (under XDG_CACHE_HOME), where `fusedspec verify` passes them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flow_runs import REPO, FlowEnv, prefect, run_deployment
from tests.fixtures.prefect_server import PrefectServer
from tests.fixtures.servers import free_port, http_ok

pytestmark = pytest.mark.slow
FUSEDSPEC_LOGGER = "prefect.flow_runs"  # the flow's own lines (task lines come from prefect.task_runs)
OUTCOME = re.compile(r"^\d+ config\(s\): \d+ compiled, \d+ published, \d+ reused, \d+ failed; [\d,]+ bytes "
                     r"uploaded; versions under \S+")


def _messages(server: PrefectServer, flow_run_id: str) -> list[str]:
    return [log["message"] for log in server.logs(flow_run_id)]


def _table(server: PrefectServer, flow_run_id: str) -> list[dict[str, Any]]:
    table = next(a for a in server.artifacts(flow_run_id) if (a.get("key") or "").endswith("-builds"))
    return json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]  # type: ignore[no-any-return]


def _runs_of(server: PrefectServer, deployment: str) -> int:
    found = server.get(f"/deployments/name/{deployment}")
    return len(server.post("/flow_runs/filter", {"deployments": {"id": {"any_": [found["id"]]}}}))


# ---- refused at submit time, or failed with its reason ------------------------------------------


def test_a_bad_parameter_is_refused_when_the_run_is_created_naming_the_field(deployed: PrefectServer,
                                                                               flow_env: FlowEnv) -> None:
    deployment = deployed.get("/deployments/name/compile-fused/local")
    assert deployment["enforce_parameter_schema"] is True
    schema = deployment["parameter_openapi_schema"]
    definitions = schema["definitions"]
    assert definitions["MatrixConfig"]["properties"]["speculation_length"]["items"]["minimum"] == 2
    assert definitions["MatrixConfig"]["properties"]["speculation_length"]["minItems"] == 1
    help_text = {name: definitions["RunConfig"]["properties"][name].get("description") for name in ("target", "draft")}
    help_text["publish.uri"] = definitions["PublishConfig"]["properties"]["uri"].get("description")
    assert all(help_text.values()), f"the deployment form has no help for {help_text}"
    assert "hf://" in help_text["target"] and "s3://" in help_text["publish.uri"]

    before = _runs_of(deployed, "compile-fused/local")
    config = flow_env.config(matrix={"speculation_length": [1]})
    done = prefect(["deployment", "run", "compile-fused/local", "--param", f"config={json.dumps(config)}"],
                   flow_env.env, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "config.matrix.speculation_length[0]" in output and "minimum of 2" in output, output
    assert _runs_of(deployed, "compile-fused/local") == before, "a refused run must not be created"


def test_a_run_that_cannot_plan_fails_with_the_reason_as_its_state_message(
        warm_flow_env: FlowEnv, worker: subprocess.Popen, tmp_path: Path) -> None:
    flow_env = warm_flow_env
    missing = tmp_path / "no-such-checkpoint"
    run = run_deployment(flow_env, flow_env.config(target=str(missing)))
    assert run.code == 1, run.output[-3000:]

    state = flow_env.server.flow_run(run.flow_run_id)["state"]
    message = state["message"]
    assert state["type"] == "FAILED"
    assert message.startswith("target: ") and str(missing) in message, message
    assert "\n" not in message and "Traceback" not in message and "\\n" not in message, message
    errors = [log["message"] for log in flow_env.server.logs(run.flow_run_id) if log["level"] >= 40]
    assert errors and errors[0] == f"the run config cannot run: {message}", errors
    assert message in run.output, "`--watch` shows the reason (the run's logs are streamed)"
    assert flow_env.published_keys() == set()


# ---- warnings and the outcome in the run's logs; the re-run's table -----------------------------


def test_near_ties_reach_the_run_logs_once_with_a_count_and_a_rerun_shows_the_same_counts(
        flow_env: FlowEnv, cold_worker: subprocess.Popen) -> None:
    """bfloat16 on the tiny pair gives a genuine near-tie (no fault injected): at the first token of one
    prompt the reference's two best logits are equal in bfloat16 (their float32 margin, 0.008, is below
    bfloat16's resolution there), and the fused artifact picks the other one. A cold work dir makes sure
    the builds are validated in this run (a validated build would be reused without warnings)."""
    from fusedspec.registry.publish import read_published_validation
    from fusedspec.registry.stores import open_store
    from fusedspec.registry.versions import version_state

    config = flow_env.config(matrix={"speculation_length": [3], "dtype": ["bfloat16"]})
    first = run_deployment(flow_env, config)
    assert first.code == 0, first.output[-3000:]
    rows = {row["config"]: row for row in _table(flow_env.server, first.flow_run_id)}
    store = open_store(flow_env.uri, flow_env.settings)
    recorded = {}
    for slug, row in rows.items():
        config_path, key = row["version"].removeprefix(f"{flow_env.uri}/").rsplit("/", 1)
        manifest = version_state(store, config_path, key).manifest
        assert manifest is not None, row
        document = read_published_validation(store, manifest)
        assert document is not None, row
        recorded[slug] = document.greedy.counts.near_ties
        assert row["near-ties"] == recorded[slug], (row, document.greedy.summary)
    assert any(recorded.values()), ("no near-tie happened on this machine, so this test shows nothing; "
                                    f"validation.json counts: {recorded}")

    logs = flow_env.server.logs(first.flow_run_id)
    messages = [log["message"] for log in logs]
    for slug, count in recorded.items():
        ties = [m for m in messages if m.startswith(f"{slug}: near-tie tolerated:")]
        if count == 0:
            assert not ties, ties
            continue
        assert len(ties) == 1, f"{slug}: one line for all its near-ties, got {ties}"
        assert ties[0].endswith(f"({count} NearTieWarning in this build)" if count == 1 else
                                f"({count} NearTieWarning in this build; the first is shown)"), ties[0]
    own = [log["message"] for log in logs if log["name"] == FUSEDSPEC_LOGGER
           and not log["message"].startswith("Finished in state")]
    assert OUTCOME.match(own[-1]) and f"versions under {flow_env.uri}" in own[-1], own[-3:]
    assert own[-1].startswith("1 config(s): 1 compiled, 1 published, 0 reused, 0 failed"), own[-1]
    assert own[-1] in first.output, "`--watch` prints the outcome line"

    again = run_deployment(flow_env, config)
    assert again.code == 0, again.output[-3000:]
    rerun = {row["config"]: row for row in _table(flow_env.server, again.flow_run_id)}
    assert {slug: row["status"] for slug, row in rerun.items()} == {slug: "reused" for slug in rows}
    assert {slug: row["near-ties"] for slug, row in rerun.items()} == recorded


# ---- the README, verbatim -----------------------------------------------------------------------


def readme_server_section() -> str:
    """The first bash block of the README's Prefect section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Prefect: server, worker, deployments"):]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "the README's Prefect section has no bash block"
    return match.group(1)


def _own(block: str, old: str, new: str) -> str:
    """Substitute something the test must own (a port, a path); the README must still say it once."""
    assert block.count(old) == 1, f"the README's Prefect block should contain {old!r} once"
    return block.replace(old, new)


@pytest.fixture
def readme_shell(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """Whatever the README block starts in the background (server, worker) lives in the shell's process
    group; the group is stopped here, worker and server together."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.3)
        else:
            os.killpg(proc.pid, signal.SIGKILL)


def test_readme_sequence_verbatim_on_another_port_publishes_to_the_default_store(
        tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        readme_shell: list[subprocess.Popen]) -> None:
    port = free_port()
    block = readme_server_section()
    block = _own(block, "PORT=4200", f"PORT={port}")
    block = _own(block, "$PWD/.work/prefect-home", str(tmp_path / "prefect-home"))
    block = _own(block, "/abs/target", str(tiny_target))
    block = _own(block, "/abs/draft", str(tiny_drafts["perturbed"]))
    script = tmp_path / "readme.sh"
    script.write_text("set -e\n" + block)
    cache = tmp_path / "xdg-cache"
    # A user's shell: no test server settings and no FUSEDSPEC_WORK_DIR (the default work dir is the
    # point); XDG_CACHE_HOME keeps that default inside this test. Polling faster only saves time.
    env = {name: value for name, value in os.environ.items()
           if name not in ("FUSEDSPEC_WORK_DIR", "PREFECT_HOME", "PREFECT_API_URL", "PREFECT_UI_API_URL")}
    env.update({"XDG_CACHE_HOME": str(cache), "PREFECT_WORKER_QUERY_SECONDS": "1",
                "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"})
    log = tmp_path / "readme.log"
    with open(log, "wb") as out:
        shell = subprocess.Popen(["bash", str(script)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        readme_shell.append(shell)
        code = shell.wait(timeout=900)
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui-settings", timeout=10) as response:
        ui = json.loads(response.read())
    api_url = f"http://127.0.0.1:{port}/api"
    assert ui["api_url"] == api_url, ui
    assert http_ok(f"{api_url}/health")

    server = PrefectServer(api_url=api_url, home=tmp_path / "prefect-home", env=env)
    created = re.search(r"Created flow run .*?\n└── UUID:\s*([0-9a-f-]{36})", output)
    assert created, output[-4000:]
    flow_run_id = created.group(1)
    assert server.flow_run(flow_run_id)["state"]["type"] == "COMPLETED"
    store = cache / "fusedspec" / "store"
    messages = _messages(server, flow_run_id)
    outcome = [m for m in messages if OUTCOME.match(m)]
    assert outcome and outcome[-1].endswith(f"versions under {store}"), messages[-5:]
    assert outcome[-1] in output, "`--watch` printed the outcome line"
    rows = _table(server, flow_run_id)
    assert len(rows) == 2 and all(row["status"] == "published" for row in rows), rows
    for row in rows:  # the version is where the summary says, after the worker's temp dir is gone
        version = Path(row["version"])
        assert version.is_relative_to(store) and (version / "manifest.json").is_file(), row
        assert any(row["version"] in m for m in messages), "the run's logs name each version"
        verified = subprocess.run([str(Path(sys.executable).with_name("fusedspec")), "verify", row["version"]],
                                  env=env, capture_output=True, text=True, timeout=300)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    built = {path.name[:12] for path in (cache / "fusedspec" / "builds").iterdir()}
    assert {row["key"] for row in rows} <= built, "the builds are in the default work dir, not the worker's temp dir"

    summary = _flow_result(api_url, flow_run_id)  # the flow's result: its RunSummary
    assert summary.store == str(store) and summary.counts.published == 2
    assert sorted(o.version_uri for o in summary.outcomes) == sorted(row["version"] for row in rows)


def _flow_result(api_url: str, flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
        assert state is not None
        return state.result()
