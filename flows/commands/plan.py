"""`fusedspec plan CONFIG [--json]`: check a run config against both models and print its builds with keys.

Order: load the config, pin the target and each draft (commit + file hashes), fetch their configs only (never
the weights), read both architectures, check the whole matrix, and compute each build's keys with the
backend's toolchain (version key, graph key, weight key: compile/content_key.py). Each build then says what a
run would do: reuse its version from the store, publish its build from the work dir, reuse the programs of its
graph key (shard weights only), or compile; with `matrix.top_per_class`, a build the k advice cached by an
earlier run leaves out says so (without that advice, a note says that a run computes it first). Every problem
found (either model reference, the matrix) is reported at once, exit 2. Local model paths in a config are
relative to the config file's directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fusedspec.core.settings import Settings
from fusedspec.flows.planning import plan_file, short_name, sweep_notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def plan(config_path: Path, settings: Settings) -> dict[str, Any]:
    """The plan as plain data, or MatrixError with every problem of the config and its models."""
    from fusedspec.flows.matrix_advice import limit_notes, matrix_limit
    from fusedspec.flows.pipeline import plan_work

    plans = plan_file(Path(config_path), settings)
    run_plan, target = plans.plans[0], plans.target
    work: dict[str, tuple[str, str]] = {w.key: (w.action, w.detail) for plan in plans.plans
                                        for w in plan_work(plan, settings)}
    limit = matrix_limit(plans, settings, compute=False)  # the cached advice only: a plan reads no weights
    for plan, b in plans.builds:
        left = limit.left_out_of(plan.config.drafts[0], b.slug) if limit is not None else None
        if left is not None:
            work[b.key] = ("left out", f"by the k advice: {left.reason}")
    return {
        "ok": True,
        "config": str(config_path),
        "backend": run_plan.config.backend,
        "target": {"ref": target.ref.text, **target.identity(),
                   "model_type": run_plan.target_arch.model_type},
        "drafts": [{"ref": plan.draft.ref.text, **plan.draft.identity(),
                    "model_type": plan.draft_arch.model_type}
                   for plan in plans.plans],
        "toolchain": run_plan.toolchain,
        "code_version": run_plan.code_version,
        "options": run_plan.options,
        "store": run_plan.publish_uri,
        "prompts": {"source": run_plan.prompt_set.source, "count": len(run_plan.prompt_set.prompts),
                    "hash": run_plan.prompt_set.hash},
        "builds": [{"slug": b.slug, "draft": plan.config.drafts[0], "label": b.label,
                    "spec": b.spec.to_json(), "key": b.key, "graph_key": b.graph_key,
                    "weight_key": b.weight_key, "action": work[b.key][0],
                    "action_detail": work[b.key][1]} for plan, b in plans.builds],
        "top_per_class": None if limit is None else limit.model_dump(mode="json"),
        "notes": sweep_notes(run_plan) + limit_notes(plans, limit),
    }


def run(args: argparse.Namespace, settings: Settings) -> int:
    result = plan(args.config, settings)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for role, model in (("target", result["target"]), *(("draft", draft) for draft in result["drafts"])):
        pinned = f"commit {model['commit']}" if model["commit"] else "local directory"
        print(f"{role}: {model['ref']} ({model['model_type']}, {pinned}, {len(model['files'])} files hashed)")
    tools = ", ".join(f"{k} {v}" for k, v in sorted(result["toolchain"].items()))
    print(f"backend: {result['backend']} (code version {result['code_version']}; {tools})")
    print(f"store: {result['store']} (reachable); prompts: {result['prompts']['count']} from "
          f"{result['prompts']['source']}")
    print()
    several = len(result["drafts"]) > 1
    header = ("#", *(("draft",) if several else ()), "tp", "seq_len", "k", "batch", "dtype", "version key",
              "graph key", "action")
    rows = [(str(i), *((short_name(b["draft"]),) if several else ()), str(b["spec"]["tp_degree"]),
             str(b["spec"]["seq_len"]), str(b["spec"]["speculation_length"]), str(b["spec"]["batch_size"]),
             b["spec"]["dtype"], b["key"], b["graph_key"][:12], b["action"])
            for i, b in enumerate(result["builds"], 1)]
    widths = [max(len(r[c]) for r in (header, *rows)) for c in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print()
    for i, b in enumerate(result["builds"], 1):
        print(f"{i}: {b['action']}: {b['action_detail']}")
    counts = {action: sum(b["action"] == action for b in result["builds"])
              for action in ("compile", "reuse programs", "publish build", "reuse version", "left out")}
    print(f"\n{len(rows)} build(s): " + ", ".join(f"{n} {a}" for a, n in counts.items() if n)
          + "; no weights downloaded")
    for note in result["notes"]:
        print(f"note: {note}")
    return 0
