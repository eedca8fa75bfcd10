"""What the compile-fused pipeline itself costs: cold run, unchanged re-run, re-run with one k added.

    nice -n 19 .venv/bin/python bench/pipeline_cost.py [--matrices demo,big] [--skip-workers2]

On the tiny pair (demo.models: 2-layer Qwen3 target, draft = target + 2% noise, real Qwen3
tokenizer), the flow (flows.commands.run.run_flow, Prefect ephemeral mode) runs on the demo matrix (4
configs, demo.demo_config) and on a bigger one (tp [1,2] x k [2..7] = 12 configs, a 2-prompt file,
8 new tokens), publishing to a local directory store. Each scenario group runs in its own child process
with a fresh work dir and store, so "cold" really is cold (no builds, no reference cache); Prefect's
ephemeral API is started by a throw-away flow before the clock starts, so its ~10 s start-up is not
charged to the first run. Models are local directories, so bytes downloaded is 0 by construction.

Prints one table; asserts nothing about time. Goals (issue 8): unchanged re-run compiles nothing and
uploads nothing in < 5% of the cold time; adding one k compiles and uploads only that config.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BIG_KS = [2, 3, 4, 5, 6, 7]
RESULTS = "results.jsonl"
PROMPTS = [  # one structured, one open prompt: enough for the gate, cheap for 12 configs
    {"id": "count", "class": "sequence", "text": "Continue: 1, 2, 3, 4, 5,", "variants": ["raw"]},
    {"id": "story", "class": "story", "text": "Once upon a time", "variants": ["raw"]},
]


def config_dict(matrix: str, models: Path, store: Path, ks: list[int], workers: int) -> dict[str, Any]:
    """The run config of one scenario, as plain data (the child validates it into a RunConfig)."""
    from fusedspec.demo import demo_config

    target, draft = models / "tiny-qwen3-target", models / "tiny-qwen3-draft"
    if matrix == "demo":
        data = demo_config(target, draft, str(store)).model_dump(mode="json")
        data["matrix"]["speculation_length"] = ks
    else:
        prompts = models / "bench-prompts.jsonl"
        data = {"target": str(target), "draft": str(draft), "backend": "cpu",
                "matrix": {"tp_degree": [1, 2], "seq_len": [128], "speculation_length": ks, "batch_size": [1],
                           "dtype": ["float32"]},
                "validation": {"prompts": str(prompts), "max_new_tokens": 8, "cost_ratio": 0.1},
                # the pipeline's cost, as measured before AOTI was the default
                "compile": {"aot_inductor": False},
                "publish": {"uri": str(store)}}
    data["fan_out"] = {"mode": "local", "max_workers": workers}
    return data


# ---- child: one scenario group in a fresh work dir ---------------------------------------------------

def child(spec: dict[str, Any]) -> None:
    """Run the group's configs in order in this process, printing one JSON line per run."""
    from prefect import flow

    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.flows.commands.run import run_flow

    @flow(name="bench-warm-up")
    def warm_up() -> int:
        return 1

    warm_up()  # start Prefect's ephemeral API before any clock runs
    for label, data in spec["runs"]:
        config = run_config_from_dict(data, source=label)
        started = time.perf_counter()
        summary = run_flow(config, show_progress=False)
        seconds = time.perf_counter() - started
        line = json.dumps({"label": label, "seconds": seconds, "counts": summary["counts"]})
        with Path(spec["results"]).open("a") as sink:  # kept even if a later run of the group fails
            sink.write(line + "\n")


def run_group(name: str, runs: list[tuple[str, dict[str, Any]]],
              work: Path) -> tuple[list[dict[str, Any]], str]:
    """A child process with FUSEDSPEC_WORK_DIR = a fresh `work`: the results of the runs that finished,
    and the last line of the error that stopped the group ("" when all finished)."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "tmp").mkdir(parents=True)
    env = dict(os.environ, FUSEDSPEC_WORK_DIR=str(work), TMPDIR=str(work / "tmp"),
               PREFECT_HOME=str(work / "prefect-home"),
               # a fresh Prefect home migrates its SQLite database first; under `nice` on a busy
               # 2-core host that outlasts the default ephemeral start-up timeout
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300")
    done = subprocess.run([sys.executable, __file__, "--child",
                           json.dumps({"runs": runs, "results": str(work / RESULTS)})],
                          env=env, capture_output=True, text=True)
    results, error = read_group(work), ""
    if done.returncode != 0:
        (work / "stderr.log").write_text(done.stderr)
        errors = [line for line in done.stderr.splitlines() if "Error" in line and not line.startswith(" ")]
        error = (f"{name} stopped (exit {done.returncode}): {(errors or ['?'])[-1][:300]}; see "
                 f"{work / 'stderr.log'}")
        print(error, flush=True)
    return results, error


def read_group(work: Path) -> list[dict[str, Any]]:
    path = work / RESULTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


# ---- parent: models, scenarios, table ------------------------------------------------------------------

def make_models(root: Path) -> Path:
    from fusedspec.demo import DRAFT_NOISE
    from fusedspec.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir

    tokenizer = qwen3_tokenizer_dir(root)
    target = make_tiny_qwen3(root / "tiny-qwen3-target", tokenizer, seed=1)
    derive_draft(target, root / "tiny-qwen3-draft", noise=DRAFT_NOISE, seed=3)
    (root / "bench-prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return root


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| matrix | run | workers | configs | compiles | bytes downloaded | bytes uploaded | files "
             "uploaded | wall s | / cold (same workers) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["counts"]
        lines.append(f"| {r['matrix']} | {r['label']} | {r['workers']} | {c['configs']} | {c['compiled']} | "
                     f"0 | {c['bytes_uploaded']:,} | {c['files_uploaded']} | {r['seconds']:.1f} | "
                     f"{r['ratio']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--matrices", default="demo,big")
    parser.add_argument("--skip-workers2", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table of the groups already run")
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0

    from fusedspec.core.settings import load_settings

    base = load_settings().work_dir / "bench" / "pipeline-cost"
    models = make_models(base / "models")
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    matrices = args.matrices.split(",")
    plan = [(m, 1) for m in matrices] + ([] if args.skip_workers2 else [(m, 2) for m in matrices])
    for matrix, workers in plan:
        ks = [3, 5] if matrix == "demo" else BIG_KS
        work = base / f"{matrix}-w{workers}"
        store = work / "store"
        runs = [("cold", config_dict(matrix, models, store, ks, workers))]
        if workers == 1:
            runs += [("unchanged re-run", config_dict(matrix, models, store, ks, 1)),
                     (f"re-run + k={max(ks) + 1}", config_dict(matrix, models, store, ks + [max(ks) + 1], 1))]
        if args.report_only:
            results = read_group(work)
        else:
            results, error = run_group(f"{matrix}-w{workers}", runs, work)
            errors += [error] if error else []
        cold_w1 = next((r["seconds"] for r in read_group(base / f"{matrix}-w1") if r["label"] == "cold"),
                       None)
        for r in results:
            cold = cold_w1 if workers == 2 else results[0]["seconds"]
            r.update(matrix=matrix, workers=workers,
                     ratio="n/a" if cold is None else f"{r['seconds'] / cold:.3f}"
                     + (" (vs 1 worker)" if workers == 2 else ""))
            rows.append(r)
        print(table(rows), flush=True)
    print()
    print(table(rows))
    for error in errors:
        print(f"FAILED: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
