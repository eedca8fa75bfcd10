"""`fusedspec compile CONFIG [--key K] [--dry-run] [--json]`: build every config of a run config locally.

Order: plan the run (pin both models, check the whole matrix, compute keys: flows.planning, the same
keys `fusedspec plan` prints), then download both checkpoints once and build each config (or only
--key) with compile.build.build_artifact into the work dir. A build whose key is already there is
reused, not redone. --dry-run downloads no weights: it asks the backend what it would do, per build,
and prints that as plain data. Nothing is published.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import get_backend
from fusedspec.compile.build import build_artifact, is_complete, remove_stale_staging
from fusedspec.core.errors import InputError
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import PlannedBuild, RunPlan, plan_file

HELP = "compile (no publish) every config of a run config into the work dir"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--key", metavar="K", help="build only the config with this content key (or a unique prefix)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be built; download and write nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def select_builds(plan: RunPlan, key: str | None) -> list[PlannedBuild]:
    if key is None:
        return list(plan.builds)
    matches = [b for b in plan.builds if b.key.startswith(key)]
    if len(matches) != 1:
        known = ", ".join(f"{b.slug}={b.key[:12]}" for b in plan.builds)
        what = "matches no build" if not matches else f"matches {len(matches)} builds"
        raise InputError(f"--key {key} {what} of this run config (builds: {known}); `fusedspec plan` lists the keys")
    return matches


def dry_run(plan: RunPlan, builds: list[PlannedBuild], settings: Settings) -> dict[str, Any]:
    from fusedspec.compile.modelconfig import read_arch
    from fusedspec.validate.step_costs import planned_cost_model

    backend = get_backend(plan.config.backend)
    if not hasattr(backend, "dry_run"):
        raise InputError(f"the {plan.config.backend} backend cannot describe a build without compiling it")
    # the backend reads configs only: point it at the fetched config dirs, not the (absent) weights
    target = dataclasses.replace(plan.target, local_dir=plan.target_config_dir)
    draft = dataclasses.replace(plan.draft, local_dir=plan.draft_config_dir)
    target_arch, draft_arch = read_arch(plan.target_config_dir), read_arch(plan.draft_config_dir)
    return {
        "ok": True,
        "dry_run": True,
        "builds": [
            {"slug": b.slug, "key": b.key, "exists": is_complete(settings.builds_dir / b.key),
             **backend.dry_run(b.spec, target, draft, settings.builds_dir / b.key,  # type: ignore[attr-defined]
                               key=b.key, options=plan.options),
             # the k advice's cost model and where its numbers will come from (a stated model for neuron)
             "cost_model": planned_cost_model(plan.config.backend, b.spec, target_arch, draft_arch, plan.options)}
            for b in builds
        ],
    }


def compile_all(plan: RunPlan, builds: list[PlannedBuild], settings: Settings,
                progress: Any = None) -> dict[str, Any]:
    """Download both models once, then build each config; returns where each artifact is."""
    from fusedspec.registry.download import download_model

    download_model(plan.target, settings)
    download_model(plan.draft, settings)
    results = []
    for planned in builds:
        reused = is_complete(settings.builds_dir / planned.key)
        if progress is not None:
            progress(f"{'reusing' if reused else 'compiling'} {planned.slug} ({planned.key[:12]})")
        started = time.perf_counter()
        artifact = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options,
                                  key=planned.key)
        results.append({"slug": planned.slug, "key": planned.key, "artifact": str(artifact),
                        "reused": reused, "seconds": round(time.perf_counter() - started, 2)})
    return {"ok": True, "dry_run": False, "builds": results}


def run(args: argparse.Namespace, settings: Settings) -> int:
    plan = plan_file(args.config, settings)
    remove_stale_staging(settings)  # staging of killed compiles (a compile at work keeps its own)
    builds = select_builds(plan, args.key)
    if args.dry_run:
        result = dry_run(plan, builds, settings)
    else:
        result = compile_all(plan, builds, settings, progress=None if args.json else print)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for build in result["builds"]:
        if args.dry_run:
            state = "exists" if build["exists"] else "would build"
            size = build["weights_bytes"] / 2**20
            print(f"{build['slug']}  {build['key'][:12]}  {state}: {build['out_dir']} "
                  f"({len(build['files'])} files, {size:.1f} MiB of weights)")
            cost = build["cost_model"]
            numbers = "" if cost["cost_ratio"] is None else f"c = {cost['cost_ratio']:.3f}, b = {cost['verify_slope']:g}: "
            print(f"  k advice cost model: {numbers}{cost['source']}")
            for warning in build.get("warnings", []):  # the host's toolchain, where a compile would differ
                print(f"  warning: {warning}", file=sys.stderr)
        else:
            state = "reused" if build["reused"] else f"built in {build['seconds']:.1f} s"
            print(f"{build['slug']}  {state}: {build['artifact']}")
    return 0
