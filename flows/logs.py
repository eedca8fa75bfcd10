"""What fusedspec's own code logs and warns during a build, in the Prefect run's logs.

The pipeline logs through the standard logging module (loggers under `fusedspec`) and validation warns
through the warnings module (a near-tie, fused steps that differ from the prediction), so it works
without Prefect.

    log records     Prefect's own mechanism: `PREFECT_LOGGING_EXTRA_LOGGERS=fusedspec` gives the `fusedspec`
                    loggers Prefect's API handler, which files each record under the flow or task run of
                    the thread that logged it (the UI, `prefect flow-run logs`, `--watch`); the terminal
                    gets it from Prefect's console handler. core.settings.export_prefect_settings sets it
                    for this process and its children, prefect.yaml for deployments' flow runs.
    warnings        `run_logs(run_logger, label)`: collected per build and logged when the build ends, each
                    distinct warning ONCE with how many times the build raised it (13 near-ties are one
                    line that says 13, not a flood). This is why this module is more than the setting:
                    Prefect would log every warning as it comes.

Warnings of threads outside any block go where they would go without this module. The hook picks the
block by thread, so two builds running at once never see each other's warnings, and no warnings state is
swapped in and out per build (`warnings.catch_warnings` is process-wide, not per thread: two builds
validating at once in it could lose each other's warnings).
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

ROOT = "fusedspec"  # every logger of this project is under the product namespace
# Our own warnings are never silenced by Python's once-per-location rule (a second build must warn about
# its near-tie too); the blocks deduplicate them per build instead.
OWN_MODULES = r"fusedspec(\.|$)"


def route_to_prefect() -> None:
    """The `fusedspec` loggers at INFO with Prefect's API handler. PREFECT_LOGGING_EXTRA_LOGGERS attaches it
    when Prefect sets up logging; a process that imported Prefect before that setting was made (a test
    session, a script) gets the same handlers here, copied from Prefect's `prefect.extra` as Prefect does."""
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG, setup_logging

    if not PROCESS_LOGGING_CONFIG:
        setup_logging()
    logger = logging.getLogger(ROOT)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    for handler in logging.getLogger("prefect.extra").handlers:
        if handler not in logger.handlers:
            logger.addHandler(handler)


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
_previous_showwarning: Any = None
_showing = threading.local()  # inside the previous hook: never call it twice in one warning


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
    """The hook, (re)installed at each block: a `warnings.catch_warnings` block entered before ours (pytest
    wraps every test in one) puts its own warnings state back when it exits."""
    global _previous_showwarning
    with _install_lock:
        # UserWarning only: near-ties and steps warnings are; ResourceWarnings a collection happens to
        # attribute to our modules stay ignored, as Python ignores them by default (an existing equal
        # filter is replaced, not repeated)
        warnings.filterwarnings("always", category=UserWarning, module=OWN_MODULES)
        if warnings.showwarning is not _show_warning:
            _previous_showwarning, warnings.showwarning = warnings.showwarning, _show_warning


@contextmanager
def run_logs(run_logger: Any, label: str = "") -> Iterator[None]:
    """Within the block, this thread's warnings are logged to `run_logger` at the end, once each with a
    count, prefixed with `label` (the build's slug)."""
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
