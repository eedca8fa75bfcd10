"""Shared test setup. Fixture modules live in tests/fixtures/ (one per real component: the Qwen3
tokenizer and tiny checkpoints, the local Hub endpoint, SeaweedFS, Prefect) and are loaded here.

Everything a test writes goes under the work dir (FUSEDSPEC_WORK_DIR, set by the Makefile) or
pytest's tmp_path; servers are started once per session and stopped by PID.
"""

from __future__ import annotations

import signal
from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)


def pytest_configure(config: object) -> None:
    """A SIGTERM (a CI timeout, `kill`) ends the session like Ctrl-C: pytest then tears the session
    fixtures down, so the servers they started are stopped instead of outliving the run."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
