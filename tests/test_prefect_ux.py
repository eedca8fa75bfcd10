"""What a platform team meets in Prefect, read where they read it: the REST API the UI and `prefect` CLI
use (GET /api/flow_runs/{id}, POST /api/logs/filter, POST /api/artifacts/filter, GET /ui-settings), on a
real server with real process workers.

- A bad parameter is refused when the run is created, naming the field; the form's schema carries the
  bounds and the help text, and is the schema `fusedspec plan` checks files against.
- An expected failure (a config that cannot plan, a tokenizer mismatch) ends Failed with the reason, one
  line, as its state message and its last line; no traceback in the logs, `--watch` or the worker's log.
- A build's near-tie reaches the run's logs once with its count, each stage of each build has a line with
  its duration and the table's stage times add up to the build's wall time, the one-line outcome is the
  last log line, and a re-run (every build reused) shows the same near-tie counts in its table.
- The README's server/worker/deploy/submit sequence, run verbatim on a port other than 4200 with no
  FUSEDSPEC_WORK_DIR: the UI is told the right API URL, and the run without a `publish` key leaves its
  versions in the default work dir's store (under XDG_CACHE_HOME), where `fusedspec verify` passes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.flow_runs import REPO, FlowEnv, flow_result, prefect, run_deployment
from tests.fixtures.prefect_server import PrefectServer
from tests.fixtures.servers import free_port, http_ok

pytestmark = pytest.mark.slow
FUSEDSPEC_LOGGER = "prefect.flow_runs"  # the flow's own lines (task lines come from prefect.task_runs)
OUTCOME = re.compile(r"^\d+ config\(s\): \d+ compiled, \d+ from reused programs, \d+ published, \d+ reused, "
                     r"\d+ failed; [\d,]+ bytes uploaded; versions under \S+")


def _messages(server: PrefectServer, flow_run_id: str) -> list[str]:
    return [log["message"] for log in server.logs(flow_run_id)]


def _table(server: PrefectServer, flow_run_id: str, which: str = "builds") -> list[dict[str, Any]]:
    table = next(a for a in server.artifacts(flow_run_id) if (a.get("key") or "").endswith(f"-{which}"))
    return (json.loads(table["data"])  # type: ignore[no-any-return]
            if isinstance(table["data"], str) else table["data"])


def _runs_of(server: PrefectServer, deployment: str) -> int:
    found = server.get(f"/deployments/name/{deployment}")
    return len(server.post("/flow_runs/filter", {"deployments": {"id": {"any_": [found["id"]]}}}))


# ---- refused at submit time, or failed with its reason ------------------------------------------


def test_a_bad_parameter_is_refused_when_the_run_is_created_naming_the_field(deployed: PrefectServer,
                                                                               flow_env: FlowEnv) -> None:
    from fusedspec.compile.runconfig import run_config_schema

    deployment = deployed.get("/deployments/name/compile-fused/local")
    assert deployment["enforce_parameter_schema"] is True
    schema = deployment["parameter_openapi_schema"]
    definitions = schema["definitions"]
    ours = run_config_schema()  # one schema: what `fusedspec plan` checks a file against
    assert definitions == {**ours["definitions"],
                           "RunConfig": {k: v for k, v in ours.items() if k != "definitions"}}
    # a choice, not a text box
    assert definitions["RunConfig"]["properties"]["backend"]["enum"] == ["cpu", "neuron"]
    assert definitions["MatrixConfig"]["properties"]["speculation_length"]["items"]["minimum"] == 2
    assert definitions["MatrixConfig"]["properties"]["speculation_length"]["minItems"] == 1
    help_text = {name: definitions["RunConfig"]["properties"][name].get("description")
                 for name in ("target", "draft")}
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


def _other_tokenizer(draft: Path, into: Path) -> Path:
    """A copy of the draft whose tokenizer stops where the target's goes on (a different eos token)."""
    shutil.copytree(draft, into)
    settings = json.loads((into / "tokenizer_config.json").read_text())
    settings["eos_token"] = "<|endoftext|>"
    (into / "tokenizer_config.json").write_text(json.dumps(settings))
    return into


@pytest.mark.parametrize("mistake", ["missing-target", "tokenizer-mismatch"])
def test_an_expected_failure_ends_failed_with_its_reason_and_no_traceback(
        mistake: str, warm_flow_env: FlowEnv, worker: subprocess.Popen, tmp_path: Path) -> None:
    """Must show 3, on a real process worker: the reason is the run's state message, its error line and the
    last line before Prefect's own; no traceback in the run's logs, in `--watch`, or in the worker's log."""
    flow_env = warm_flow_env
    worker_log = flow_env.work_dir / "worker.log"
    start = worker_log.stat().st_size if worker_log.exists() else 0
    if mistake == "missing-target":
        missing = tmp_path / "no-such-checkpoint"
        config, expected = flow_env.config(target=str(missing)), "target: "
    else:
        draft = _other_tokenizer(flow_env.draft, tmp_path / "draft-other-tokenizer")
        config, expected = flow_env.config(draft=str(draft)), "eos"
    run = run_deployment(flow_env, config)
    assert run.code == 1, run.output[-3000:]

    state = flow_env.server.flow_run(run.flow_run_id)["state"]
    message = state["message"]
    assert state["type"] == "FAILED" and expected in message, message
    if mistake == "missing-target":
        assert message.startswith("target: ") and str(missing) in message, message
    assert "\n" not in message and "Traceback" not in message and "\\n" not in message, message
    logs = flow_env.server.logs(run.flow_run_id)
    errors = [log["message"] for log in logs if log["level"] >= 40]
    assert errors and errors[0].endswith(message), errors
    ours = [log["message"] for log in logs if not log["message"].startswith("Finished in state")]
    assert ours[-1] == errors[0], ours[-3:]  # the reason is the last line before Prefect's own
    assert message in run.output, "`--watch` shows the reason (the run's logs are streamed)"
    for where, text in (("the run's logs", "\n".join(log["message"] for log in logs)),
                        ("--watch", run.output),
                        ("the worker's log", worker_log.read_text(errors="replace")[start:])):
        assert "Traceback" not in text and "Engine execution exited" not in text, f"{where}:\n{text[-3000:]}"
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
    versions = {o.slug: o.version_uri for o in flow_result(flow_env.api_url, first.flow_run_id).outcomes}
    store = open_store(flow_env.uri, flow_env.settings)
    recorded = {}
    for slug, row in rows.items():
        config_path, key = versions[slug].removeprefix(f"{flow_env.uri}/").rsplit("/", 1)
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
    _every_second_of_each_build_is_in_a_stage(flow_env.server, first.flow_run_id, rows,
                                              _table(flow_env.server, first.flow_run_id, "stages"), messages)
    own = [log["message"] for log in logs if log["name"] == FUSEDSPEC_LOGGER
           and not log["message"].startswith("Finished in state")]
    assert OUTCOME.match(own[-1]) and f"versions under {flow_env.uri}" in own[-1], own[-3:]
    assert own[-1].startswith("1 config(s): 1 compiled, 0 from reused programs, 1 published, 0 reused, "
                              "0 failed"), own[-1]
    assert own[-1] in first.output, "`--watch` prints the outcome line"

    again = run_deployment(flow_env, config)
    assert again.code == 0, again.output[-3000:]
    rerun = {row["config"]: row for row in _table(flow_env.server, again.flow_run_id)}
    assert {slug: row["status"] for slug, row in rerun.items()} == {slug: "reused" for slug in rows}
    assert {slug: row["near-ties"] for slug, row in rerun.items()} == recorded


STAGES = ("claim", "download", "compile", "validate", "publish")


def _every_second_of_each_build_is_in_a_stage(server: PrefectServer, flow_run_id: str, rows: dict[str, Any],
                                              stage_rows: list[dict[str, Any]], messages: list[str]) -> None:
    """Must show 2: the run's logs hold a line per stage per build with its duration (and sizes), and the
    stages table's times add up to the build's wall time, its task run's as Prefect measured it, within
    10%."""
    task_runs = {r["name"]: r
                 for r in server.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})}
    for slug, row in rows.items():
        lines = [m for m in messages if re.match(rf"{re.escape(slug)}: [a-z]+ [\d.]+ s( \(|$)", m)]
        assert [line.split()[1] for line in lines] == list(STAGES), lines
        assert "MB" in lines[1] and "MB" in lines[2] and "sent" in lines[4], lines  # what each stage moved
        stages = {r["stage"]: r["seconds"] for r in stage_rows if r["config"] == slug}
        assert list(stages) == list(STAGES), stage_rows
        total = sum(float(seconds) for seconds in stages.values())
        assert total == pytest.approx(row["seconds"], abs=0.05 * len(stages)), row
        wall = task_runs[f"build {slug}"]["total_run_time"]
        assert abs(total - wall) <= 0.1 * wall, \
            f"{slug}: stages add up to {total:.1f} s of a {wall:.1f} s build"


# ---- the README, verbatim -----------------------------------------------------------------------


def _readme() -> Any:
    """docs/screenshots.py, whose `readme_try_out` and `own` read and adapt the README's block (one place)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshots", REPO / "docs" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    readme = _readme()
    block = readme.own(readme.readme_try_out(), "PORT=4200", f"PORT={port}")
    block = readme.own(block, "$PWD/.work/prefect-server", str(tmp_path / "prefect-home"))
    block = readme.own(block, "/abs/target", str(tiny_target))
    block = readme.own(block, "/abs/draft", str(tiny_drafts["perturbed"]))
    block = readme.own(block, ".work/try.yaml", str(tmp_path / "try.yaml"), times=2)
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
        shell = subprocess.Popen(["bash", str(script)], cwd=REPO, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
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
    created = readme.CREATED.search(output)  # what `fusedspec submit` printed
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
    summary = flow_result(api_url, flow_run_id)  # the flow's result: its RunSummary
    assert summary.store == str(store) and summary.counts.published == 2
    assert summary.advice.cost_model.cost_ratio == 0.1, "the README's config advises as its screenshots show"
    markdown = next(a["data"] for a in server.artifacts(flow_run_id)
                    if (a.get("key") or "").endswith("-summary"))
    for o in summary.outcomes:  # the version is where the summary says, after the worker's temp dir is gone
        version = Path(o.version_uri or "")
        assert version.is_relative_to(store) and (version / "manifest.json").is_file(), o
        assert any(o.version_uri in m for m in messages), "the run's logs name each version"
        assert f"- `{o.slug}` published: `{o.version_uri}`" in markdown, "the UI's summary names each version"
        verified = subprocess.run([str(Path(sys.executable).with_name("fusedspec")), "verify", str(version)],
                                  env=env, capture_output=True, text=True, timeout=300)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    built = {path.name for path in (cache / "fusedspec" / "builds").iterdir()}
    assert {o.key for o in summary.outcomes} <= built, \
        "the builds are in the default work dir, not the worker's temp dir"
