"""`fusedspec gc [URI] [--work-dir] [--dry-run] [--json]`: remove what is no longer needed.

URI (a store root: where publishes write; a URI above or below it is refused): attempts that no manifest
names and no live publisher owns (a killed publisher's, a race loser's, a version a repair replaced), their
unfinished multipart uploads, markers of dead publishers, temp files of killed writers and empty
directories. Committed versions are never touched.
--work-dir: staging directories of killed compiles, and published builds beyond the builds budget
(FUSEDSPEC_BUILDS_BUDGET); --all-published removes every published build. A build that a compile,
`validate` or `publish` is using is left alone.
With --dry-run nothing is removed: the report says what would be.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI", nargs="?",
                        help="a store root: s3://BUCKET/PREFIX or a directory")
    parser.add_argument("--work-dir", action="store_true",
                        help="also clean the work dir (FUSEDSPEC_WORK_DIR)")
    parser.add_argument("--all-published", action="store_true",
                        help="with --work-dir: remove every published build, not only those past the budget")
    parser.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from fusedspec.registry.gc import collect_store

    if args.uri is None and not args.work_dir:
        raise ConfigError("give a store URI, --work-dir, or both")
    report: dict[str, Any] = {"ok": True, "dry_run": args.dry_run}
    if args.uri is not None:
        report["store"] = collect_store(args.uri, settings, dry_run=args.dry_run).to_json()
    if args.work_dir:
        report["work_dir"] = _clean_work_dir(settings, dry_run=args.dry_run, everything=args.all_published)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    store = report.get("store")
    if store is not None:
        print(f"store {store['uri']}: {verb} {len(store['attempts'])} attempt(s), {len(store['uploads'])} "
              f"unfinished upload(s), {len(store['markers'])} stale marker(s), {len(store['directories'])} "
              "empty director(ies)")
        for attempt in store["attempts"]:
            print(f"  attempt {attempt}")
        for kept in store["kept"]:
            print(f"  kept {kept}")
    work = report.get("work_dir")
    if work is not None:
        print(f"work dir {work['path']}: {verb} {len(work['staging'])} staging dir(s) and "
              f"{len(work['builds'])} published build(s) ({work['freed_bytes'] >> 20} MB); "
              f"{work['kept_bytes'] >> 20} MB of builds kept")
    return 0


def _clean_work_dir(settings: Settings, *, dry_run: bool, everything: bool) -> dict[str, Any]:
    from fusedspec.compile.build import build_lock
    from fusedspec.compile.workdir import builds, stale_staging, trim_published
    from fusedspec.core.files import lock_if_free

    budget = 0 if everything else settings.builds_budget
    if dry_run:
        present = builds(settings.builds_dir)
        total, chosen = sum(b.bytes for b in present), []
        for build in present:
            if total <= budget:
                break
            with lock_if_free(build_lock(settings, build.path.name)) as free:
                if build.published is not None and free:  # a build in use is never removed (compile.workdir)
                    chosen.append(build)
                    total -= build.bytes
        staging: list[str] = []
    else:
        staging = [str(p) for p in stale_staging(settings)]
        chosen = trim_published(settings, budget)
    kept = (sum(b.bytes for b in builds(settings.builds_dir))
            - (sum(b.bytes for b in chosen) if dry_run else 0))
    return {"path": str(settings.work_dir), "staging": staging, "builds": [str(b.path) for b in chosen],
            "freed_bytes": sum(b.bytes for b in chosen), "kept_bytes": kept}
