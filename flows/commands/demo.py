"""`fusedspec demo [--publish URI] [--json]`: the main job on the embedded defaults (`make demo`).

Versions go to the work dir's store (FUSEDSPEC_WORK_DIR/store: `.work/store` under `make demo`) unless
`--publish` names another; a relative directory is taken from the current directory. The run goes to the
Prefect server PREFECT_API_URL names, if any; else to Prefect's temporary server, with a home of its own
(FUSEDSPEC_WORK_DIR/demo/prefect-home, whatever PREFECT_HOME says) and time to start on a busy host."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publish", default=None, metavar="URI",
                        help="where to publish: s3://bucket/prefix or a directory (default: the work dir's "
                             "store, FUSEDSPEC_WORK_DIR/store)")
    parser.add_argument("--json", action="store_true", help="print the run summary as one JSON document")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from fusedspec.demo import demo_config, demo_models
    from fusedspec.flows.commands.run import RunFailed, run_flow
    from fusedspec.flows.planning import RunPlans, check_publish_store, plan_run

    started = time.perf_counter()
    # A store the run could not publish to is refused before the models are made (the plan checks it
    # again; a relative directory is resolved against the current one there).
    check_publish_store(args.publish or str(settings.default_store), settings)
    if not args.json:
        print("fusedspec demo: making the tiny Qwen3 pair with the real Qwen3 tokenizer ...", flush=True)
    target, draft = demo_models(settings)
    plan = plan_run(demo_config(target, draft, args.publish), settings, base_dir=Path.cwd())
    if not args.json:
        print(f"target {target}\ndraft  {draft}\nmatrix: tp 1,2 x k 3,5 (seq_len 256, batch 1, float32) "
              f"-> publish to {plan.publish_uri}", flush=True)
    code = 0
    try:
        summary = run_flow(plan.config, show_progress=not args.json, prefect_home=settings.work_dir / "demo" /
                           "prefect-home", plans=RunPlans(config=plan.config, plans=(plan,)),
                           settings=settings)
    except RunFailed as exc:
        summary, code = exc.report, exc.exit_code
    seconds = time.perf_counter() - started
    if args.json:
        print(json.dumps({**summary.model_dump(mode="json", exclude={"text"}), "seconds": round(seconds, 1)},
                         indent=2))
    else:
        print(summary.text)
        print(f"demo finished in {seconds:.0f}s; versions are under {plan.publish_uri}; run it again: "
              "nothing is compiled or uploaded twice")
    return code
