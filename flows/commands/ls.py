"""`fusedspec ls URI [--json]`: list published configs and their complete versions, LATEST marked with '*'.

Exit 0, or 1 when a manifest or LATEST in the store is damaged: everything readable is still listed,
and each damaged file is named with what is wrong (as `ls` itself ends 1 on an entry it cannot read).
"""

from __future__ import annotations

import argparse
import json
import sys

from fusedspec.core.settings import Settings
from fusedspec.registry.listing import list_versions, listing_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI",
                        help="store root or config path: s3://BUCKET/PREFIX or a directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    configs = list_versions(args.uri, settings)
    problems = [p for config in configs for p in config.problems]
    if args.json:
        print(json.dumps({"ok": not problems, "uri": args.uri, "configs": listing_json(configs)}, indent=2))
    else:
        if not configs:
            print(f"no published versions under {args.uri}")
        for config in configs:
            print(config.path or "(this config)")
            for version in config.versions:
                mark = "*" if version.latest else " "
                graph = (version.graph_key or "-")[:12]
                print(f"  {mark} {version.key}  graph {graph:<12}  {version.created_at or '?':20}  "
                      f"{version.files:3d} files  {version.bytes:>12d} bytes")
    for problem in problems:
        print(f"fusedspec ls: damaged: {problem}", file=sys.stderr)
    return 1 if problems else 0
