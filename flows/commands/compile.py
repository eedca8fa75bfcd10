"""`fusedspec compile CONFIG [--key K] [--dry-run] [--json]`: build every config of a run config locally.

Order: plan the run (pin both models, check the whole matrix, compute keys: flows.planning, the same
keys `fusedspec plan` prints), then download both checkpoints once and build each config (or only
--key) with compile.build.build_artifact into the work dir. A build whose key is already there is
reused, not redone; a build whose graph key has programs (in the work dir, or trusted in the run's store)
only shards its weights. --dry-run downloads no weights: it says per build whether it would compile or
reuse programs, asks the backend what it would write and in which steps, and prints that as plain data,
with the backend's note when the matrix has several k (flows.planning.sweep_notes). Nothing is published.

A run config with `matrix.top_per_class` first runs the k advice on the downloaded models and compiles only
the builds it keeps (flows.matrix_advice), printing what it left out and why; its dry run shows what the
advice cached by an earlier run or compile leaves out, or says that the advice runs first. `--key` builds the
build it names, kept or not: the user chose it.

A run config with several drafts builds each draft's matrix; its dry run compares them as `--draft` does.
`--dry-run --draft A --draft B` plans the run config once per draft given, in place of the config's own,
and puts each draft's cost ratio for every build side by side: the cost half of the (draft, k) ranking,
before anything is compiled or any weights downloaded. The other half, each draft's acceptance, needs the
weights: the printout names the `fusedspec advise` command that measures it and ranks the drafts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import get_backend
from fusedspec.compile.build import build_artifact, is_complete, planned_work, remove_stale_staging
from fusedspec.compile.runconfig import DEFAULT_MAX_NEW_TOKENS
from fusedspec.core.errors import ConfigError, InputError
from fusedspec.core.settings import Settings
from fusedspec.flows.matrix_advice import limit_lines, limit_notes, limited, matrix_limit
from fusedspec.flows.planning import PlannedBuild, RunPlan, RunPlans, plan_file, sweep_notes
from fusedspec.validate.cost_model import FORMULA
from fusedspec.validate.matrix_limit import MatrixLimit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--key", metavar="K",
                        help="build only the config with this content key (or a unique prefix)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be built; download and write nothing")
    parser.add_argument("--draft", action="append", default=None, metavar="MODEL",
                        help="with --dry-run: plan once per draft given (in place of the config's) and "
                             "compare their cost ratios; repeat")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def select_builds(plans: RunPlans, key: str | None) -> list[tuple[RunPlan, PlannedBuild]]:
    if key is None:
        return list(plans.builds)
    matches = [(plan, b) for plan, b in plans.builds if b.key.startswith(key)]
    if len(matches) != 1:
        known = ", ".join(f"{b.label}={b.key[:12]}" for _, b in plans.builds)
        what = "matches no build" if not matches else f"matches {len(matches)} builds"
        raise InputError(f"--key {key} {what} of this run config (builds: "
                         f"{known}); `fusedspec plan` lists the keys")
    return matches


def dry_run(plan: RunPlan, builds: list[PlannedBuild], settings: Settings) -> dict[str, Any]:
    from fusedspec.flows.pipeline import plan_work
    from fusedspec.validate.step_costs import planned_cost_model

    backend = get_backend(plan.config.backend)
    work = {w.key: w for w in plan_work(plan, settings)}
    # the backend reads configs only: point it at the fetched config dirs, not the (absent) weights
    target = dataclasses.replace(plan.target, local_dir=plan.target_config_dir)
    draft = dataclasses.replace(plan.draft, local_dir=plan.draft_config_dir)
    return {
        "ok": True,
        "dry_run": True,
        "notes": sweep_notes(plan),
        "builds": [
            {"slug": b.slug, "label": b.label, "draft": plan.config.drafts[0], "key": b.key,
             "graph_key": b.graph_key, "exists": is_complete(settings.builds_dir / b.key),
             "action": work[b.key].action, "action_detail": work[b.key].detail,
             **backend.dry_run(b.spec, target, draft, settings.builds_dir / b.key, keys=b.all_keys,
                               options=plan.options, reuse_programs=work[b.key].action == "reuse programs"),
             # the k advice's cost model and where its numbers will come from (a stated model for neuron)
             "cost_model": planned_cost_model(plan.config.backend, b.spec, plan.target_arch, plan.draft_arch,
                                               plan.options, given=plan.cost_ratio)}
            for b in builds
        ],
    }


def compile_all(plan: RunPlan, builds: list[PlannedBuild], settings: Settings,
                progress: Any = None) -> dict[str, Any]:
    """Download both models once, then build each config; returns where each artifact is."""
    from fusedspec.flows.pipeline import fetch_store_programs
    from fusedspec.registry.download import download_model
    from fusedspec.registry.stores import open_store

    download_model(plan.target, settings)
    download_model(plan.draft, settings)
    store = open_store(plan.publish_uri, settings)
    results = []
    for planned in builds:
        started = time.perf_counter()
        fetch_store_programs(store, plan, planned, settings)
        if progress is not None:
            doing = {"built": "reusing", "programs": "sharding weights for", "compile": "compiling"}
            progress(f"{doing[planned_work(settings, planned.all_keys)]} {planned.label} "
                     f"({planned.key[:12]})")
        built = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options,
                               keys=planned.all_keys)
        results.append({"slug": planned.slug, "label": planned.label, "draft": plan.config.drafts[0],
                        "key": planned.key, "graph_key": planned.graph_key, "artifact": str(built.path),
                        "work": built.work, "reused": built.work == "built",
                        "seconds": round(time.perf_counter() - started, 2)})
    return {"ok": True, "dry_run": False, "builds": results}


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.draft:
        return compare_drafts(args, settings)
    plans = plan_file(args.config, settings)
    limit = None
    if args.key is None and plans.config.matrix.top_per_class is not None:
        limit = matrix_limit(plans, settings, compute=not args.dry_run)  # a dry run downloads nothing
    if plans.several() and args.dry_run and args.key is None:
        return compare(args, [(plan.config.drafts[0], plan) for plan in plans.plans], settings,
                       limited_by=(plans, limit))
    remove_stale_staging(settings)  # staging of killed compiles (a compile at work keeps its own)
    if limit is not None and not args.dry_run:
        if not args.json:
            print("\n".join(limit_lines(limit, several=plans.several())))
        plans = limited(plans, limit)
    chosen = select_builds(plans, args.key)
    results = []
    for plan in plans.plans:
        builds = [planned for of, planned in chosen if of is plan]
        if builds:
            results.append(dry_run(plan, builds, settings) if args.dry_run else
                           compile_all(plan, builds, settings, progress=None if args.json else print))
    result = {**results[0], "builds": [b for r in results for b in r["builds"]]}
    if plans.config.matrix.top_per_class is not None and args.key is None:
        result = with_limit(result, plans, limit)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print_result(result)
    return 0


def with_limit(result: dict[str, Any], plans: RunPlans, limit: MatrixLimit | None) -> dict[str, Any]:
    """The result with what matrix.top_per_class leaves out: a dry run's builds marked, a compile's listed."""
    left = {(o.draft, o.slug): o for o in limit.left_out} if limit is not None else {}
    builds = [{**b, "action": "left out",
               "action_detail": f"by the k advice: {left[b['draft'], b['slug']].reason}"}
              if (b["draft"], b["slug"]) in left else b for b in result["builds"]]
    return {**result, "builds": builds, "notes": result.get("notes", []) + limit_notes(plans, limit),
            "top_per_class": limit.model_dump(mode="json") if limit is not None else None}


def print_result(result: dict[str, Any]) -> None:
    for build in result["builds"]:
        if result["dry_run"] and build["action"] == "left out":
            print(f"{build['label']}  {build['key'][:12]}  left out, {build['action_detail']}")
        elif result["dry_run"]:
            size = build["weights_bytes"] / 2**20
            print(f"{build['label']}  {build['key'][:12]}  {build['action']} ({build['action_detail']}): "
                  f"{build['out_dir']} ({len(build['files'])} files, {size:.1f} MiB of weights)")
            cost = build["cost_model"]
            numbers = ("" if cost["cost_ratio"] is None
                       else f"c = {cost['cost_ratio']:.3f}, b = {cost['verify_slope']:g}: ")
            print(f"  k advice cost model: {numbers}{cost['source']}")
            if "steps" in build and build["action"] != "publish build":  # (built already: nothing to do)
                print("  steps: " + ", ".join(step["step"] for step in build["steps"]))
            for warning in build.get("warnings", []):  # the host's toolchain, where a compile would differ
                print(f"  warning: {warning}", file=sys.stderr)
        else:
            done = {"built": "reused", "programs": "weights sharded, programs reused", "compile": "compiled"}
            state = done[build["work"]] + ("" if build["reused"] else f" in {build['seconds']:.1f} s")
            print(f"{build['label']}  {state}: {build['artifact']}")
    for note in result.get("notes", []):
        print(f"note: {note}")


def compare_drafts(args: argparse.Namespace, settings: Settings) -> int:
    """The dry run once per --draft, and each draft's cost ratio per build side by side."""
    if not args.dry_run:
        raise ConfigError("--draft compares drafts in a dry run: add --dry-run. A run compiles the drafts of "
                          "its config: list there the drafts the comparison keeps")
    if args.key is not None:
        raise ConfigError("--key and --draft: the content keys differ per draft; give one of them")
    refs = [ref if "://" in ref else str(Path(ref).resolve()) for ref in args.draft]  # as typed: from here
    if len(set(refs)) != len(refs):
        raise ConfigError(f"--draft {next(r for r in args.draft if args.draft.count(r) > 1)} is given twice: "
                          "name each draft once")
    return compare(args, [(given, plan_file(args.config, settings, draft=ref).plans[0])
                          for ref, given in zip(refs, args.draft, strict=True)], settings)


def compare(args: argparse.Namespace, drafts: list[tuple[str, RunPlan]], settings: Settings,
            limited_by: tuple[RunPlans, MatrixLimit | None] | None = None) -> int:
    """The dry run of each draft's plan, and each draft's cost ratio per build side by side; for a run config
    with matrix.top_per_class (`limited_by`: its plans and the cached limit), what the limit leaves out."""
    per_draft = {given: (plan, dry_run(plan, list(plan.builds), settings)) for given, plan in drafts}
    if limited_by is not None and limited_by[0].config.matrix.top_per_class is not None:
        per_draft = {given: (plan, with_limit(result, *limited_by))
                     for given, (plan, result) in per_draft.items()}
    target = next(iter(per_draft.values()))[0].config.target
    advise = (f"fusedspec advise --target {shlex.quote(target)} "
              + " ".join(f"--draft {shlex.quote(d)}" for d in per_draft)
              + advise_flags([plan for plan, _ in per_draft.values()],
                             limited_by[0].config.matrix.top_per_class if limited_by is not None else None)
              + " (downloads the weights: each draft's acceptance per class, then every (draft, k) ranked)")
    costs = [{"slug": build["slug"],
              "cost": {given: _cost(result, build["slug"]) for given, (_, result) in per_draft.items()}}
             for build in next(iter(per_draft.values()))[1]["builds"]]
    doc = {"ok": True, "dry_run": True,
           "drafts": [{"draft": given, **result} for given, (_, result) in per_draft.items()],
           "ranking_inputs": {"cost_ratio_per_build": costs, "acceptance": advise,
                              "speedup": f"{FORMULA}, per draft with its own c"}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for given, (_, result) in per_draft.items():
        print(f"=== draft {given}")
        print_result(result)
    print(f"\n=== the ranking's inputs: each draft's cost ratio c per build ({FORMULA})")
    for row in costs:
        print(f"{row['slug']}  " + "  ".join(f"{given}: {_describe(c)}" for given, c in row["cost"].items()))
    sources = {c["source"] for row in costs for c in row["cost"].values()}
    print("c from: " + "; ".join(sorted(sources)))
    print(f"acceptance: {advise}")
    return 0


def advise_flags(plans: list[RunPlan], top_per_class: int | None) -> str:
    """The options that make `fusedspec advise` rank what the run would: its prompts, length, ks and dtype,
    each draft's given cost ratio, its top_per_class (advise's defaults are another prompt set, k 2..16,
    measured costs)."""
    config = plans[0].config
    flags = [f"--k-range {','.join(map(str, sorted(config.matrix.speculation_length)))}"]
    if config.validation.prompts != "default":
        flags.append(f"--prompts {shlex.quote(config.validation.prompts)}")
    if config.validation.max_new_tokens != DEFAULT_MAX_NEW_TOKENS:
        flags.append(f"--max-new-tokens {config.validation.max_new_tokens}")
    if len(config.matrix.dtype) == 1:
        flags.append(f"--dtype {config.matrix.dtype[0]}")
    ratios = [plan.cost_ratio for plan in plans]
    if all(ratio is not None for ratio in ratios):
        flags += [f"--cost-ratio {ratio}" for ratio in ratios]
    if top_per_class is not None:  # the run's (RunConfig.for_draft leaves it out of each draft's config)
        flags.append(f"--top-per-class {top_per_class}")
    return " " + " ".join(flags)


def _cost(result: dict[str, Any], slug: str) -> dict[str, Any]:
    build = next((b for b in result["builds"] if b["slug"] == slug), None)
    return build["cost_model"] if build else {"cost_ratio": None, "verify_slope": None,
                                              "source": "not planned"}


def _describe(cost: dict[str, Any]) -> str:
    return "measured at validation" if cost["cost_ratio"] is None else f"c = {cost['cost_ratio']:.3f}"
