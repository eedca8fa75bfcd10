"""Progress of a run for whoever watches it: a Prefect progress artifact in the UI, and a terminal
progress bar when the run was started from the command line (the CLI installs one with `show_in_terminal`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

TerminalHook = Callable[[int, int, str], None]  # (done, total, label)
_terminal: TerminalHook | None = None


@contextmanager
def show_in_terminal() -> Iterator[None]:
    """Draw a rich progress bar for runs started inside this block (same process)."""
    global _terminal
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False) as bar:
        task_id = bar.add_task("configs", total=None)

        def hook(done: int, total: int, label: str) -> None:
            bar.update(task_id, completed=done, total=total, description=label)

        _terminal = hook
        try:
            yield
        finally:
            _terminal = None


class RunProgress:
    """Matrix progress: `advance(label)` after each finished config."""

    def __init__(self, total: int, *, key: str) -> None:
        from prefect.artifacts import create_progress_artifact

        self.total, self.done = total, 0
        self.artifact_id = create_progress_artifact(progress=0.0, key=key,
                                                    description=f"configs finished of {total}")
        if _terminal:
            _terminal(0, total, "compile-fused")

    def advance(self, label: str) -> None:
        from prefect.artifacts import update_progress_artifact

        self.done += 1
        update_progress_artifact(self.artifact_id, progress=100.0 * self.done / max(self.total, 1))  # type: ignore[arg-type]
        if _terminal:
            _terminal(self.done, self.total, label)
