"""The stages of one build, timed back to back, so every second of a build is in one of them.

    clock = StageClock(slug)
    with clock.stage("download") as note:     # logs `SLUG: download 3.2 s (target 38 MB, draft 38 MB)`
        ...; note("target 38 MB, draft 38 MB")
    clock.times                               # [StageTime(stage="download", seconds=3.2, detail=...)]

A stage starts where the last one ended (not where its block was entered), so the stages add up to the
build's wall time whatever runs between two blocks. Each line goes to the `fusedspec.pipeline` logger as
the stage ends: the run's logs and the terminal (flows.logs); a stage that raised is logged as failed,
with its time, before the error becomes the build's outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("fusedspec.pipeline")


class StageTime(BaseModel):
    """One stage of a build: its name, seconds and what it moved (sizes, counts), as the table shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    seconds: float
    detail: str = ""


class StageClock:
    def __init__(self, slug: str) -> None:
        self.slug = slug
        self.times: list[StageTime] = []
        self._last = time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[Callable[[str], None]]:
        details: list[str] = []
        failed = True
        try:
            yield details.append
            failed = False
        finally:
            now = time.perf_counter()
            seconds, self._last = now - self._last, now
            detail = "; ".join(details)
            self.times.append(StageTime(stage=name, seconds=round(seconds, 2), detail=detail))
            said = f" ({detail})" if detail else ""
            log.info("%s: %s %s%s%s", self.slug, name, format_seconds(seconds), said,
                     " - failed" if failed else "")


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) of the regular files under `path`."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)
