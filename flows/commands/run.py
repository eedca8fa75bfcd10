"""`fusedspec run CONFIG [--json]`: the whole compile-fused flow, in this process.

Prefect runs in its ephemeral mode unless PREFECT_API_URL points at a server (then the run shows in
that server's UI). Exit 0 when every config is published or reused, 1 when any failed its gate (the
others are still published), 2 for bad input (nothing compiled).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from compile.errors import CheckFailed, FusedspecError
from compile.runconfig import RunConfig, load_run_config
from compile.settings import Settings
from flows.planning import plan_run, with_local_paths_resolved

HELP = "the whole compile-fused flow, locally"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--json", action="store_true", help="print the run summary as one JSON document")


def run_flow(config: RunConfig, *, show_progress: bool) -> dict[str, Any]:
    """Run compile-fused in this process; the summary, or the FusedspecError that stopped the run (a
    CheckFailed carries the summary as its report)."""
    from flows.compile_fused import compile_fused
    from flows.progress import show_in_terminal

    if show_progress:
        with show_in_terminal():
            state = compile_fused(config, return_state=True)
    else:
        state = compile_fused(config, return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[no-any-return]


def run(args: argparse.Namespace, settings: Settings) -> int:
    config = with_local_paths_resolved(load_run_config(args.config), args.config.resolve().parent)
    plan_run(config, settings)  # bad input fails here in a second, before Prefect starts (configs only)
    try:
        summary = run_flow(config, show_progress=not args.json)
        code = 0
    except CheckFailed as exc:
        if not isinstance(exc.report, dict) or "counts" not in exc.report:
            raise
        summary, code = exc.report, 1
    except FusedspecError:
        raise
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "text"}, indent=2, default=str))
    else:
        print(summary["text"])
    return code
