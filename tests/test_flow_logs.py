"""flows.logs: what a build warns reaches its own run logger, each warning once with a count, also when two
builds run at once in one process (as local fan-out runs them, one thread each); what it logs reaches
its own task run's logs through Prefect's extra-loggers mechanism, on a real Prefect server.

The run loggers of the first two tests are real `logging.Logger`s collecting their records (a Prefect run
logger is a logging adapter; the end-to-end path through a worker is in tests/test_prefect_ux.py)."""

from __future__ import annotations

import logging
import threading
import time
import warnings

from fusedspec.flows.logs import run_logs
from fusedspec.validate.greedy import NearTieWarning, StepsMismatchWarning


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def run_logger(name: str) -> tuple[logging.Logger, Collected]:
    logger = logging.getLogger(f"test-run-logger.{name}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    collected = Collected()
    logger.addHandler(collected)
    return logger, collected


def a_build(slug: str, near_ties: int, started: threading.Barrier) -> None:
    """What validation does for one build: a near-tie warning per prompt, the same library warning twice,
    and a steps warning."""
    started.wait()
    for prompt in range(near_ties):
        warnings.warn(f"near-tie tolerated: p{prompt} of {slug}", NearTieWarning, stacklevel=1)
    # a library's warning, from two places (Python's default filter shows each place's once)
    warnings.warn(f"program x of {slug}: exported again", RuntimeWarning, stacklevel=1)
    warnings.warn(f"program x of {slug}: exported again", RuntimeWarning, stacklevel=1)
    warnings.warn(f"{slug}: measured fused steps differ", StepsMismatchWarning, stacklevel=1)


def test_two_builds_at_once_each_log_their_own_warnings_once_with_a_count() -> None:
    loggers = {slug: run_logger(slug) for slug in ("tp1-k3", "tp1-k4")}
    started = threading.Barrier(2)

    def build(slug: str, near_ties: int) -> None:
        with run_logs(loggers[slug][0], label=slug):
            a_build(slug, near_ties, started)

    threads = [threading.Thread(target=build, args=("tp1-k3", 3)),
               threading.Thread(target=build, args=("tp1-k4", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    k3, k4 = loggers["tp1-k3"][1].lines, loggers["tp1-k4"][1].lines
    assert k3 == [
        (logging.WARNING, "tp1-k3: near-tie tolerated: p0 of tp1-k3 (3 NearTieWarning in this build; the "
                          "first is shown)"),
        (logging.WARNING, "tp1-k3: program x of tp1-k3: exported again (seen 2 times in this build)"),
        (logging.WARNING, "tp1-k3: tp1-k3: measured fused steps differ (1 StepsMismatchWarning in this "
                          "build)"),
    ]
    assert k4[0] == (logging.WARNING, "tp1-k4: near-tie tolerated: p0 of tp1-k4 (1 NearTieWarning in this "
                                      "build)")
    assert all("tp1-k3" not in line for _, line in k4), "a build must not see another build's records"


def test_outside_a_build_records_and_warnings_go_where_they_would_without_it(caplog: object) -> None:
    import pytest

    assert isinstance(caplog, pytest.LogCaptureFixture)
    logger, collected = run_logger("finished")
    with run_logs(logger, label="done"):
        pass
    with pytest.warns(NearTieWarning, match="after the build too"):
        warnings.warn("after the build too", NearTieWarning, stacklevel=1)
    assert collected.lines == []


def test_what_two_builds_log_at_once_is_filed_under_each_ones_task_run(prefect_server: object) -> None:
    """The pipeline's records (a stage line) reach the Prefect run through PREFECT_LOGGING_EXTRA_LOGGERS,
    each under the task run of the thread that logged it, with no router of ours in between."""
    from prefect import flow, task
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from fusedspec.flows.logs import route_to_prefect
    from tests.fixtures.prefect_server import PrefectServer

    assert isinstance(prefect_server, PrefectServer)
    route_to_prefect()  # as compile_fused does when it is imported
    started = threading.Barrier(2)

    @task(task_run_name="build {slug}")
    def build(slug: str) -> None:
        started.wait(timeout=60)
        logging.getLogger("fusedspec.pipeline").info("%s: compile 1.0 s (1.0 MB in 1 files)", slug)

    @flow(name="two-builds-logging")
    def two_builds() -> str:
        from prefect.runtime import flow_run

        futures = [build.submit(slug) for slug in ("tp1-k3", "tp1-k4")]
        for future in futures:
            future.result()
        return str(flow_run.id)

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        flow_run_id = two_builds()
    deadline = time.monotonic() + 30
    while True:  # logs are sent in batches: wait for both lines
        logs = [log for log in prefect_server.logs(flow_run_id) if log["name"] == "fusedspec.pipeline"]
        if len(logs) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    by_task = {log["message"].split(":")[0]: log["task_run_id"] for log in logs}
    assert sorted(by_task) == ["tp1-k3", "tp1-k4"], logs
    names = {slug: prefect_server.get(f"/task_runs/{task_run_id}")["name"]
             for slug, task_run_id in by_task.items()}
    assert names == {"tp1-k3": "build tp1-k3", "tp1-k4": "build tp1-k4"}
