"""`fusedspec run CONFIG [--json]`: the whole compile-fused flow, in this process.

The config is planned here first (every problem at once, in a second, before Prefect starts), then the
flow runs on the plan's pinned config (Hub models at their commits, paths absolute, the store resolved),
handed these plans and this command's settings, so it plans nothing again.
Prefect runs in its ephemeral mode unless PREFECT_API_URL points at a server (then the run shows in that
server's UI); its temporary server is given EPHEMERAL_STARTUP_SECONDS to start (Prefect's own 20 s is
too short on a busy 2-core host), and if it still does not start, the message names the setting. Exit 0 when
every config is published or reused, 1 when any failed (the others are still published) or the tokenizers
differ, 2 for bad input (nothing compiled).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from fusedspec.compile.runconfig import RunConfig
from fusedspec.core.errors import CheckFailed, FusedspecError, InputError, TokenizerMismatchError
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import RunPlans, plan_file

EPHEMERAL_STARTUP_SECONDS = 180  # the temporary server's start, seen at 20-60 s on a loaded 2-core host


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--json", action="store_true", help="print the run summary as one JSON document")


class RunFailed(CheckFailed):
    """Some builds failed: the summary says which (`report`); everything that passed is published."""


@contextmanager
def prefect_for_this_run(home: Path | None = None) -> Iterator[None]:
    """Prefect's settings for a run in this process. With PREFECT_API_URL: that server, as it is. Without:
    Prefect's temporary server, given time to start on a busy host and, when `home` is given, a home of its
    own (a temporary server in a running server's home writes into its database: "database is locked")."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        yield
        return
    timeout = max(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), EPHEMERAL_STARTUP_SECONDS)
    updates: dict[Any, Any] = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: timeout}
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
        updates[PREFECT_HOME] = home
    with temporary_settings(updates=updates):
        try:
            yield
        except RuntimeError as exc:
            if "ephemeral Prefect API server" not in str(exc):
                raise
            raise FusedspecError(
                f"Prefect's temporary server did not start within {timeout} s "
                "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): the host is busy. Raise that setting, "
                "or start a server (README: Prefect) and set PREFECT_API_URL") from None


def run_flow(config: RunConfig, *, show_progress: bool, prefect_home: Path | None = None,
             plans: RunPlans | None = None, settings: Settings | None = None) -> Any:
    """Run compile-fused in this process; its RunSummary. A run with failed builds raises RunFailed
    carrying the summary; a run its plan or tokenizer gate refused raises that stage's error. With
    `settings` (and `plans` of `config`), the flow takes them instead of loading and planning again."""
    from fusedspec.flows.compile_fused import Handed, compile_fused, handing
    from fusedspec.flows.progress import show_in_terminal
    from fusedspec.flows.summary import FlowFailure, RunSummary

    handed = handing(Handed(settings=settings, plans=plans)) if settings is not None else nullcontext()
    with prefect_for_this_run(prefect_home), handed:
        if show_progress:
            with show_in_terminal():
                state = compile_fused(config, return_state=True)
        else:
            state = compile_fused(config, return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, RunSummary):
        return result
    if isinstance(result, FlowFailure):
        if isinstance(result.outcome, RunSummary):
            raise RunFailed(result.message, report=result.outcome)
        stopped = result.outcome
        if stopped.stage == "tokenizer-gate":
            raise TokenizerMismatchError(stopped.reason)
        raise (InputError if stopped.exit_code == 2 else CheckFailed)(stopped.reason)
    if isinstance(result, BaseException):
        raise result
    raise CheckFailed(f"the run ended {state.type.value}: {state.message}")


def run(args: argparse.Namespace, settings: Settings) -> int:
    plans = plan_file(args.config, settings)
    try:
        summary, code = run_flow(plans.config, show_progress=not args.json, plans=plans, settings=settings), 0
    except RunFailed as exc:
        summary, code = exc.report, exc.exit_code
    if args.json:
        print(json.dumps({"ok": code == 0, **summary.model_dump(mode="json", exclude={"text"})}, indent=2))
    else:
        print(summary.text)
    return code
