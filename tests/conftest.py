"""Shared test setup. Fixture modules live in tests/fixtures/ (one per real component: the Qwen3
tokenizer and tiny checkpoints, the local Hub endpoint, SeaweedFS, Prefect) and are loaded here.

Everything a test writes goes under the work dir (FUSEDSPEC_WORK_DIR, set by the Makefile) or
pytest's tmp_path; servers are started once per session and stopped by PID.

`make test` runs the suite in three pytest-xdist workers on a 2-core host: two kept both cores 86%
busy, since many tests wait on servers, workers and polls, and a third fills those gaps (bench/RESULTS.md).
Each worker is a session of its own, with its own servers and a work dir of its own under the run's
(tests look at what their work dir holds); the checkpoints the fixtures make are made once for all, in
the run's work dir (tests/support/workers.py).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fusedspec.core.memory import tune_collector
from tests.support import workers

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow tests first, the rest in their order after. The workers take files in this order
    (the Makefile's --no-loadscope-reorder; xdist would start with the files of most tests), so the long
    ones start at once and the many short ones fill the end: a real-model test started last had kept one
    worker busy for minutes after the other finished."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def pytest_configure(config: object) -> None:
    """A SIGTERM (a CI timeout, `kill`) ends the session like Ctrl-C: pytest then tears the session
    fixtures down, so the servers they started are stopped instead of outliving the run. The collector runs
    as in a `fusedspec` process, whose work the tests run in-process too (core/memory.py)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    tune_collector()
    workers.use_own_work_dir()
