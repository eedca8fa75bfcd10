"""`fusedspec submit CONFIG --deployment NAME [--watch] [--json]`: a YAML run config sent to a deployment.

The config is planned here first, as `fusedspec plan` plans it (every problem at once, exit 2, no run
created), then one flow run of the deployment (FLOW/DEPLOYMENT, default compile-fused/local) is created
on the Prefect server PREFECT_API_URL names, with the plan's pinned config as its `config` parameter:
Hub models at their commits, local paths absolute, the store resolved. The server checks that parameter
against the deployment's schema, the one the plan checked, and a refusal is printed in its words (exit 2).

With --watch, the run's logs are printed as they arrive until it ends: exit 0 when it completed, 1 when
it failed (its state message, the reason, is the last line). Without it, the command returns once the
run is created and prints where to follow it. Ctrl-C stops the watching, never the run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from fusedspec.core.errors import CheckFailed, InputError
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import plan_file

DEFAULT_DEPLOYMENT = "compile-fused/local"
POLL_SECONDS = 2.0
SETTLE_POLLS = 3  # after the run ended, logs still in flight are awaited for this many quiet polls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--deployment", default=DEFAULT_DEPLOYMENT, metavar="NAME",
                        help="the FLOW/DEPLOYMENT to run (default "
                             f"{DEFAULT_DEPLOYMENT}; `prefect deploy` makes it)")
    parser.add_argument("--watch", action="store_true",
                        help="print the run's logs until it ends; exit 1 if it fails")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    plans = plan_file(args.config, settings)
    api_url = _api_url()
    from fusedspec.flows.artifacts import describe_run

    flow_run = _create(args.deployment, plans.config.model_dump(mode="json"), describe_run(plans.config),
                       api_url)
    url = _ui_url(api_url, str(flow_run.id))
    if not args.json:
        print(f"created flow run {flow_run.name!r} ({flow_run.id}) of {args.deployment} on {api_url}\n"
              f"  UI: {url}", flush=True)
    if not args.watch:
        if args.json:
            print(json.dumps({"ok": True, "flow_run_id": str(flow_run.id), "name": flow_run.name, "url": url,
                              "state": flow_run.state.type.value if flow_run.state else None}))
        return 0
    state = _watch(flow_run.id, echo=not args.json)
    ok = state.is_completed()
    if args.json:
        print(json.dumps({"ok": ok, "flow_run_id": str(flow_run.id), "name": flow_run.name, "url": url,
                          "state": state.type.value, "message": state.message}))
    elif not ok:
        print(f"flow run {flow_run.name!r} ended {state.type.value}: {state.message}", flush=True)
    return 0 if ok else CheckFailed.exit_code


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise InputError("fusedspec submit sends the run to a Prefect server, and PREFECT_API_URL is not "
                         "set; export PREFECT_API_URL=http://HOST:PORT/api (README: Prefect), or run it here "
                         "with `fusedspec run CONFIG`")
    return str(url)


def _ui_url(api_url: str, flow_run_id: str) -> str:
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value() or api_url.removesuffix("/api")
    return f"{str(base).rstrip('/')}/runs/flow-run/{flow_run_id}"


def _create(deployment: str, config: dict[str, Any], name: str, api_url: str) -> Any:
    """The new flow run, or InputError with the server's reason
    (an unknown deployment, a refused parameter)."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    try:
        return run_deployment(deployment, parameters={"config": config}, flow_run_name=name, timeout=0,
                              as_subflow=False)
    except ObjectNotFound:
        raise InputError(f"--deployment {deployment}: no such deployment on {api_url}; create it with "
                         f"`prefect --no-prompt deploy --name {deployment}` (prefect.yaml)") from None
    except PrefectHTTPStatusError as exc:
        detail = _detail(exc)
        raise InputError(f"the server refused the run of {deployment}: {detail}") from None
    except (OSError, ConnectionError) as exc:
        raise InputError(f"cannot reach the Prefect server at {api_url} "
                         f"({type(exc).__name__}); is it running?") \
            from None


def _detail(exc: Any) -> str:
    try:
        return str(exc.response.json().get("detail", exc))
    except ValueError:
        return str(exc)


def _watch(flow_run_id: Any, *, echo: bool) -> Any:
    """Print the run's logs (its tasks' too) as they arrive, oldest first, until it is final; its state."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    seen = 0
    quiet = 0
    with get_client(sync_client=True) as client:
        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        while True:
            state = client.read_flow_run(flow_run_id).state
            logs = client.read_logs(log_filter=log_filter, offset=seen, limit=200, sort=LogSort.TIMESTAMP_ASC)
            seen += len(logs)
            for log in logs:
                if echo:
                    print(f"{log.timestamp:%H:%M:%S} {_level(log.level):<7} {log.message}", flush=True)
            final = state is not None and state.is_final()
            quiet = quiet + 1 if final and not logs else 0
            if quiet >= SETTLE_POLLS:
                return state
            if len(logs) < 200:
                time.sleep(POLL_SECONDS if not final else POLL_SECONDS / 2)


def _level(level: int) -> str:
    import logging

    return logging.getLevelName(level)
