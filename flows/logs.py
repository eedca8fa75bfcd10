"""Route what fusedspec's own code logs and warns during a build into the Prefect run's logs, once each.

The pipeline logs through the standard logging module (loggers under `fusedspec`) and validation warns
through the warnings module (a near-tie, fused steps that differ from the prediction), so it works
without Prefect. Inside `run_logs(run_logger, label)`, for the thread that
entered the block (a build runs in one task thread; several builds may run at once in one process):

    log records     INFO and up go to the run logger as they come: the UI, `prefect flow-run logs`,
                    `--watch`, and the worker's terminal once (through Prefect's console handler)
    warnings        collected, and logged when the block ends: each distinct warning ONCE, with how many
                    times the build raised it (13 near-ties are one line that says 13, not a flood)

Records and warnings of threads outside any block go where they would go without this module. The two
routers (a handler on the project's root loggers, a `warnings.showwarning` hook) are installed by the first
block and pick the block by thread, so two builds running at once never see each other's records, and no
warnings state is swapped in and out per build (`warnings.catch_warnings` is process-wide, not per thread:
two builds validating at once in it could lose each other's warnings).
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ROOTS = ("fusedspec",)  # every logger of this project is under the product namespace
# Our own warnings are never silenced by Python's once-per-location rule (a second build must warn about
# its near-tie too); the blocks deduplicate them per build instead.
OWN_MODULES = r"fusedspec(\.|$)"


@dataclass
class _Warned:
    """One distinct warning of a block: the first message and how often it came. `kind` is set for a
    warning class of this project (one warning per prompt, each text different: one line for all)."""

    message: str
    kind: str | None
    count: int = 0

    def describe(self) -> str:
        if self.kind is None:
            return f"{self.message} (seen {_times(self.count)} in this build)"
        if self.count == 1:
            return f"{self.message} (1 {self.kind} in this build)"
        return f"{self.message} ({self.count} {self.kind} in this build; the first is shown)"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


@dataclass
class _Block:
    run_logger: Any
    label: str
    warned: dict[str, _Warned] = field(default_factory=dict)  # by kind, or by text

    def warn(self, message: str, kind: str | None = None) -> None:
        entry = self.warned.setdefault(kind or message, _Warned(message=message, kind=kind))
        entry.count += 1

    def flush(self) -> None:
        prefix = f"{self.label}: " if self.label else ""
        for entry in self.warned.values():
            self.run_logger.warning("%s%s", prefix, entry.describe())
        self.warned.clear()


_blocks: dict[int, _Block] = {}  # thread ident -> its block
_install_lock = threading.Lock()
_routing = False
_previous_showwarning: Any = None
_showing = threading.local()  # inside the previous hook: never call it twice in one warning


class _Router(logging.Handler):
    """On each project root logger (which no longer propagates): the record to its thread's block, or on
    to the root logger's handlers as propagation would have sent it."""

    def emit(self, record: logging.LogRecord) -> None:
        block = _blocks.get(record.thread or 0)
        if block is None:
            root = logging.getLogger()
            if record.levelno >= root.getEffectiveLevel():
                root.handle(record)
            return
        if record.levelno == logging.WARNING:
            block.warn(record.getMessage())
        else:
            block.run_logger.log(record.levelno, "%s", record.getMessage())


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    block = _blocks.get(threading.get_ident())
    if block is not None:
        own = re.match(OWN_MODULES, category.__module__) is not None
        block.warn(str(message), kind=category.__name__ if own else None)
        return
    if getattr(_showing, "active", False):  # a hook installed after ours handed the warning back to us
        warnings._showwarning_orig(message, category, filename, lineno, file, line)  # type: ignore[attr-defined]
        return
    _showing.active = True
    try:
        _previous_showwarning(message, category, filename, lineno, file, line)
    finally:
        _showing.active = False


def _install() -> None:
    """The routers, (re)installed at each block: a `warnings.catch_warnings` block entered before ours
    (pytest wraps every test in one) puts its own warnings state back when it exits."""
    global _routing, _previous_showwarning
    with _install_lock:
        if not _routing:
            router = _Router(logging.INFO)
            for name in ROOTS:
                source = logging.getLogger(name)
                source.addHandler(router)
                source.propagate = False
                if source.level == logging.NOTSET or source.level > logging.INFO:
                    source.setLevel(logging.INFO)
            _routing = True
        # UserWarning only: near-ties and steps warnings are; ResourceWarnings a collection happens to
        # attribute to our modules stay ignored, as Python ignores them by default (an existing equal
        # filter is replaced, not repeated)
        warnings.filterwarnings("always", category=UserWarning, module=OWN_MODULES)
        if warnings.showwarning is not _show_warning:
            _previous_showwarning, warnings.showwarning = warnings.showwarning, _show_warning


@contextmanager
def run_logs(run_logger: Any, label: str = "") -> Iterator[None]:
    """Within the block, this thread's project log records go to `run_logger` and its warnings are
    logged there at the end, once each with a count, prefixed with `label` (the build's slug)."""
    _install()
    ident = threading.get_ident()
    outer = _blocks.get(ident)
    block = _Block(run_logger=run_logger, label=label)
    _blocks[ident] = block
    try:
        yield
    finally:
        if outer is None:
            del _blocks[ident]
        else:
            _blocks[ident] = outer
        block.flush()
