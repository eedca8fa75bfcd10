"""flows.logs: what a build logs and warns reaches its own run logger, and each warning once with a count,
also when two builds run at once in one process (as local fan-out runs them, one thread each).

The run loggers here are real `logging.Logger`s collecting their records (a Prefect run logger is a
logging adapter; the end-to-end path through a worker is in tests/test_prefect_ux.py)."""

from __future__ import annotations

import logging
import threading
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
    """What validation does for one build: a near-tie warning per prompt, an info line, the same library
    warning twice, and a steps warning."""
    pipeline = logging.getLogger("fusedspec.pipeline")
    started.wait()
    for prompt in range(near_ties):
        warnings.warn(f"near-tie tolerated: p{prompt} of {slug}", NearTieWarning, stacklevel=1)
    pipeline.info("%s: compiled", slug)
    logging.getLogger("fusedspec.compile.cpu.export").warning("program x of %s: exported again", slug)
    logging.getLogger("fusedspec.compile.cpu.export").warning("program x of %s: exported again", slug)
    warnings.warn(f"{slug}: measured fused steps differ", StepsMismatchWarning, stacklevel=1)


def test_two_builds_at_once_each_log_their_own_warnings_once_with_a_count() -> None:
    loggers = {slug: run_logger(slug) for slug in ("tp1-k3", "tp1-k4")}
    started = threading.Barrier(2)

    def build(slug: str, near_ties: int) -> None:
        with run_logs(loggers[slug][0], label=slug):
            a_build(slug, near_ties, started)

    threads = [threading.Thread(target=build, args=("tp1-k3", 3)), threading.Thread(target=build, args=("tp1-k4", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    k3, k4 = loggers["tp1-k3"][1].lines, loggers["tp1-k4"][1].lines
    assert k3 == [
        (logging.INFO, "tp1-k3: compiled"),
        (logging.WARNING, "tp1-k3: near-tie tolerated: p0 of tp1-k3 (3 NearTieWarning in this build; the first is shown)"),
        (logging.WARNING, "tp1-k3: program x of tp1-k3: exported again (seen 2 times in this build)"),
        (logging.WARNING, "tp1-k3: tp1-k3: measured fused steps differ (1 StepsMismatchWarning in this build)"),
    ]
    assert k4[1] == (logging.WARNING, "tp1-k4: near-tie tolerated: p0 of tp1-k4 (1 NearTieWarning in this build)")
    assert all("tp1-k3" not in line for _, line in k4), "a build must not see another build's records"


def test_outside_a_build_records_and_warnings_go_where_they_would_without_it(caplog: object) -> None:
    import pytest

    assert isinstance(caplog, pytest.LogCaptureFixture)
    logger, collected = run_logger("finished")
    with run_logs(logger, label="done"):
        pass
    logging.getLogger("fusedspec.pipeline").warning("after the build")
    with pytest.warns(NearTieWarning, match="after the build too"):
        warnings.warn("after the build too", NearTieWarning, stacklevel=1)
    assert collected.lines == []
    assert "after the build" in caplog.text
