"""`fusedspec run CONFIG [--json]`: the whole compile-fused flow, in this process.

The config is planned here first (every problem at once, in a second, before Prefect starts), then the
flow runs on the plan's pinned config: Hub models at their commits, paths absolute, the store resolved.
Prefect runs in its ephemeral mode unless PREFECT_API_URL points at a server (then the run shows in that
server's UI). Exit 0 when every config is published or reused, 1 when any failed (the others are still
published) or the tokenizers differ, 2 for bad input (nothing compiled).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fusedspec.compile.runconfig import RunConfig
from fusedspec.core.errors import CheckFailed, InputError, TokenizerMismatchError
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import plan_file

HELP = "the whole compile-fused flow, locally"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--json", action="store_true", help="print the run summary as one JSON document")


class RunFailed(CheckFailed):
    """Some builds failed: the summary says which (`report`); everything that passed is published."""


def run_flow(config: RunConfig, *, show_progress: bool) -> Any:
    """Run compile-fused in this process; its RunSummary. A run with failed builds raises RunFailed
    carrying the summary; a run its plan or tokenizer gate refused raises that stage's error."""
    from fusedspec.flows.compile_fused import compile_fused
    from fusedspec.flows.progress import show_in_terminal
    from fusedspec.flows.summary import FlowFailure, RunSummary

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
    plan = plan_file(args.config, settings)
    try:
        summary, code = run_flow(plan.config, show_progress=not args.json), 0
    except RunFailed as exc:
        summary, code = exc.report, exc.exit_code
    if args.json:
        print(json.dumps({"ok": code == 0, **summary.model_dump(mode="json", exclude={"text"})}, indent=2))
    else:
        print(summary.text)
    return code
