"""`fusedspec publish ARTIFACT_DIR URI [--unvalidated] [--json]`: publish one artifact as an immutable
version.

Prints the version URI, what was sent, and which attempt the version's manifest names (the winner's,
when another publisher committed the same version first). A long upload shows a progress bar on the
terminal (stderr), never in --json output on stdout. Exit 0 when the version is published, already
was, or was repaired; 2 on bad input, including an artifact that has not passed the greedy gate without
--unvalidated (nothing becomes visible: the manifest is written only after every file is stored and
checked).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from fusedspec.compile.workdir import in_use
from fusedspec.core.settings import Settings
from fusedspec.registry.publish import publish_artifact

SAID = {"created": "published", "existing": "already published (intact)",
        "repaired": "published over a damaged version (repaired)",
        "re-signed": "already published (intact); its manifest is now signed with this signing key",
        "lost": "another publisher committed this version first; its attempt won"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ARTIFACT_DIR", type=Path,
                        help="an artifact directory (with build.json)")
    parser.add_argument("uri", metavar="URI",
                        help="store root: s3://BUCKET/PREFIX, file:///DIR or a directory")
    parser.add_argument("--unvalidated", action="store_true",
                        help="publish an artifact that has not passed the greedy gate (the manifest says so; "
                             "LATEST never names it)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


class RichProgress:
    """A transfer bar on stderr, shown only when stderr is a terminal."""

    def __init__(self) -> None:
        self._bar = Progress(TextColumn("publishing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                             TimeRemainingColumn(), transient=True)
        self._task = self._bar.add_task("publish", total=None)

    def begin(self, total_bytes: int, files: int) -> None:
        self._bar.update(self._task, total=total_bytes)
        self._bar.start()

    def advance(self, nbytes: int) -> None:
        self._bar.advance(self._task, nbytes)

    def end(self) -> None:
        self._bar.stop()


def run(args: argparse.Namespace, settings: Settings) -> int:
    progress = RichProgress() if sys.stderr.isatty() else None
    with in_use(settings, args.artifact):  # `gc --work-dir` leaves a build alone while it is published
        result = publish_artifact(args.artifact, args.uri, settings, progress=progress,
                                  unvalidated=args.unvalidated)
    if args.json:
        print(json.dumps({"ok": True, **result.to_json()}, indent=2))
        return 0
    print(f"{SAID[result.outcome]}: {result.version_uri}")
    print(f"  files in {result.files_uri} (attempt {result.attempt})")
    print(f"  {result.files_uploaded} uploaded, {result.files_copied} copied in the store; "
          f"{result.bytes_sent} bytes sent")
    if not result.validated:
        print("  NOT VALIDATED: published with --unvalidated; LATEST does not name it")
    print("  LATEST moved to this version" if result.latest_moved else "  LATEST unchanged")
    if result.removed_attempts:
        print(f"  removed {len(result.removed_attempts)} dead or losing attempt(s)")
    if result.differs:
        print(f"  note: the local artifact differs from the published version in {', '.join(result.differs)}",
              file=sys.stderr)
    return 0
