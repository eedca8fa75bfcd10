"""Work dirs under pytest-xdist: each worker its own, the fixtures' checkpoints shared.

A worker's tests see only their own work dir (FUSEDSPEC_WORK_DIR/workers/<worker>), as a serial
session's do; the checkpoints that tests/fixtures/models.py and real_models.py make (minutes for the
real ones, and a pip install into the venv) are made once, under a lock, in the run's work dir.
Without xdist both are the one work dir. The session builds of tests/fixtures/cpu_artifacts.py and the
warm flow work dir are shared by all workers too (`run_dir`): every build is compiled once per run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fusedspec.core.files import file_lock
from fusedspec.core.settings import load_settings

SHARED = "FUSEDSPEC_TEST_SHARED_DIR"


def use_own_work_dir() -> None:
    """In an xdist worker: FUSEDSPEC_WORK_DIR becomes the worker's own, the run's is kept as SHARED."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and SHARED not in os.environ:
        run = load_settings().work_dir
        os.environ[SHARED] = str(run)
        os.environ["FUSEDSPEC_WORK_DIR"] = str(run / "workers" / worker)


@contextmanager
def shared_dir(name: str) -> Iterator[Path]:
    """`<run's work dir>/<name>`, held exclusively for the block: one worker makes what is missing, the
    others wait and then find it made."""
    root = Path(os.environ.get(SHARED) or load_settings().work_dir) / name
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".lock"):
        yield root


def run_dir(factory: pytest.TempPathFactory, name: str) -> Path:
    """A session fixture's directory for the whole run: under xdist one all workers share (in the run's
    basetemp), so a build one worker compiled is found by the other (builds are keyed by content and
    locked while made, as for two runs on one host), else a new directory as tmp_path_factory makes."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return factory.mktemp(name)
    root = factory.getbasetemp().parent / name
    root.mkdir(exist_ok=True)
    return root
