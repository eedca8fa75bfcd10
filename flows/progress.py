"""Progress of a run for whoever watches it: a Prefect progress artifact on the run the user opened, and a
terminal progress bar when the run was started from the command line (`show_in_terminal`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
    """Matrix progress: `advance(label)` after each finished build."""

    def __init__(self, artifact_id: Any, total: int) -> None:
        self.artifact_id, self.total, self.done = artifact_id, total, 0
        if _terminal:
            _terminal(0, total, "compile-fused")

    @classmethod
    def create(cls, plan: Any) -> RunProgress:
        """A progress artifact on the current flow run (the parent run the user opened)."""
        from prefect.artifacts import create_progress_artifact

        from fusedspec.flows.artifacts import artifact_key

        total = len(plan.builds)
        artifact_id = create_progress_artifact(progress=0.0, key=artifact_key(plan, "progress"),
                                               description=f"builds finished, of {total}")
        return cls(artifact_id, total)

    @classmethod
    def attach(cls, artifact_id: Any, total: int) -> RunProgress:
        """Advance a progress artifact created by another (the parent) flow run."""
        return cls(artifact_id, total)

    def advance(self, label: str) -> None:
        from prefect.artifacts import update_progress_artifact

        self.done += 1
        update_progress_artifact(self.artifact_id, progress=100.0 * self.done / max(self.total, 1))  # type: ignore[arg-type]
        if _terminal:
            _terminal(self.done, self.total, label)
