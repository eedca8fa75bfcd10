"""`fusedspec verify URI [--json] [--runtime-check]`: check a published version against its manifest.

URI is a version (…/SPEC/KEY), its attempt directory (what a pod mounts), or a config path (…/SPEC, meaning
the version its LATEST names). The manifest's signature is checked when a verify key is configured
(FUSEDSPEC_VERIFY_KEY[_FILE]); then every file's size and etag by a listing, and, unless --quick, its
sha256 by reading it back. --quick on S3 compares each object's server-computed checksum instead (HEAD:
no byte read), so a same-size overwrite is still found. --mount DIR also checks that DIR (where a pod
mounts the version) holds this manifest and its files. Exit 0 when all match, 1 when anything differs
(each difference names its file), 2 on bad input. Made for a serving pod's init container:
`fusedspec verify s3://.../KEY --mount /var/mdl/KEY --quick --runtime-check --json` (`fusedspec k8s`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fusedspec.core.settings import Settings
from fusedspec.registry.verify import verify_version


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI",
                        help="a version or config path: s3://BUCKET/..., or a directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--runtime-check", action="store_true",
                        help="also check that this host's toolchain can serve the version")
    parser.add_argument("--quick", action="store_true",
                        help="manifest, signature, sizes, etags and (S3) the server's checksums: no byte is "
                             "read (a pod's start)")
    parser.add_argument("--mount", type=Path, metavar="DIR",
                        help="also check that DIR, where a pod mounts "
                             "this version, holds its manifest and files")


def run(args: argparse.Namespace, settings: Settings) -> int:
    report = verify_version(args.uri, settings, runtime_check=args.runtime_check, quick=args.quick,
                            mount=args.mount)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif report.ok:
        how = "sizes, etags and store checksums" if report.quick else f"{report.bytes_checked} bytes"
        signer = f", signed by {report.signer}" if report.signer else ", unsigned"
        print(f"ok: {report.uri} ({report.files_checked} files, {how} match the manifest{signer})")
    else:
        print(f"FAILED: {report.uri}")
        for problem in report.problems:
            print(f"  - {problem}")
    return 0 if report.ok else 1
