"""`fusedspec verify URI [--json] [--runtime-check]`: check a published version against its manifest.

URI is a version (…/SPEC/KEY) or a config path (…/SPEC, meaning the version its LATEST names). Every
file's size and sha256 is compared with the manifest; with --quick only presence and size (no byte is
read: what a serving pod's init container does at each start). Exit 0 when all match, 1 when anything
differs (each difference names its file), 2 on bad input. Made for a serving pod's init container.
"""

from __future__ import annotations

import argparse
import json

from compile.settings import Settings
from registry.verify import verify_version

HELP = "check a published version (or LATEST) against its manifest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI", help="a version or config path: s3://BUCKET/..., or a directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--runtime-check", action="store_true",
                        help="also check that this host's toolchain can serve the version")
    parser.add_argument("--quick", action="store_true",
                        help="check the manifest and each file's presence and size only; do not re-read bytes")


def run(args: argparse.Namespace, settings: Settings) -> int:
    report = verify_version(args.uri, settings, runtime_check=args.runtime_check, quick=args.quick)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif report.ok and not report.sha256_checked:
        print(f"ok: {report.uri} ({report.files_checked} files present with the manifest's sizes; sha256 not "
              "re-read: --quick)")
    elif report.ok:
        print(f"ok: {report.uri} ({report.files_checked} files, {report.bytes_checked} bytes match the manifest)")
    else:
        print(f"FAILED: {report.uri}")
        for problem in report.problems:
            print(f"  - {problem}")
    return 0 if report.ok else 1
