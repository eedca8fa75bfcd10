"""`fusedspec demo [--publish URI] [--json]`: the main job on the embedded defaults (`make demo`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from compile.settings import Settings

HELP = "the main job on the embedded defaults (what `make demo` runs)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publish", default="artifacts", metavar="URI",
                        help="where to publish (a directory or s3://bucket/prefix; default ./artifacts)")
    parser.add_argument("--json", action="store_true", help="print the run summary as one JSON document")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from flows.commands.run import RunFailed, run_flow
    from flows.demo import demo_config, demo_models
    from flows.planning import check_publish_store

    started = time.perf_counter()
    # The flow runs in no directory of its own, so a directory store is made absolute here (against the
    # user's), and a store the run could not publish to is refused before the models are made.
    publish = args.publish if "://" in args.publish else str(Path(args.publish).absolute())
    check_publish_store(publish, settings)
    if not args.json:
        print("fusedspec demo: making the tiny Qwen3 pair with the real Qwen3 tokenizer ...", flush=True)
    target, draft = demo_models(settings)
    config = demo_config(target, draft, publish)
    if not args.json:
        print(f"target {target}\ndraft  {draft}\nmatrix: tp 1,2 x k 3,5 (seq_len 256, batch 1, float32) "
              f"-> publish to {publish}", flush=True)
    try:
        summary, code = run_flow(config, show_progress=not args.json), 0
    except RunFailed as exc:  # some builds failed: the summary says which
        summary, code = exc.report, exc.exit_code
    seconds = time.perf_counter() - started
    if args.json:
        print(json.dumps({"ok": code == 0, **summary.model_dump(mode="json", exclude={"text"}),
                          "seconds": round(seconds, 1)}, indent=2))
    else:
        print(summary.text)
        print(f"demo finished in {seconds:.0f}s; run it again: nothing is compiled or uploaded twice")
    return code
