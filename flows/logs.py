"""Route what fusedspec's own modules log during a task into the Prefect run's logs.

The pipeline logs through `logging.getLogger("fusedspec...")` (near-ties, steps that differ from the
prediction, unexpected errors with their trace), so it works without Prefect. Inside a task, `run_logs`
forwards those records to the run logger: they show in the UI and in `prefect flow-run logs`, not only on
the worker's terminal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ROOT = "fusedspec"


class _Forward(logging.Handler):
    def __init__(self, target: Any) -> None:
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.log(record.levelno, "%s", record.getMessage())


@contextmanager
def run_logs(run_logger: Any) -> Iterator[None]:
    """Forward fusedspec's log records (INFO and up) to `run_logger` for the block."""
    source = logging.getLogger(ROOT)
    handler = _Forward(run_logger)
    previous = source.level
    source.addHandler(handler)
    source.setLevel(min(previous or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.setLevel(previous)
