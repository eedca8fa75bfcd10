"""`fusedspec check-tokenizers A B [--json]`: the tokenizer gate between two models or tokenizer dirs.

A and B are model references (`hf://ORG/NAME[@REV]`, fetched without weights) or local directories
holding tokenizer.json (and optionally tokenizer_config.json, config.json). Exit 0 when they encode
identically, 1 when they differ (every kind of difference listed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fusedspec.compile.modelref import parse_model_ref
from fusedspec.core.errors import TokenizerMismatchError
from fusedspec.core.settings import Settings
from fusedspec.registry.download import fetch_configs
from fusedspec.registry.hub import resolve_model
from fusedspec.validate.tokenizers import compare_tokenizers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A",
                        help="target: hf://ORG/NAME[@REV] or a directory with tokenizer.json")
    parser.add_argument("b", metavar="B",
                        help="draft: hf://ORG/NAME[@REV] or a directory with tokenizer.json")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def tokenizer_dir(text: str, settings: Settings) -> Path:
    """The directory holding a reference's tokenizer files (fetched without weights for Hub models)."""
    ref = parse_model_ref(text)
    if ref.local_dir is not None:
        return ref.local_dir  # a tokenizer dir need not be a whole checkpoint, so it is not resolved
    return fetch_configs(resolve_model(ref, settings), settings)


def run(args: argparse.Namespace, settings: Settings) -> int:
    a_dir, b_dir = tokenizer_dir(args.a, settings), tokenizer_dir(args.b, settings)
    report = compare_tokenizers(a_dir, b_dir, a_name="target", b_name="draft")
    if args.json:
        # One JSON document (the whole report) on stdout; the dispatcher would add a second one.
        print(json.dumps({**report.to_json(), "a": args.a, "b": args.b}, indent=2))
        if not report.ok:
            print(f"fusedspec check-tokenizers: {report.summary()}", file=sys.stderr)
        return 0 if report.ok else TokenizerMismatchError.exit_code
    if not report.ok:
        differences = "\n".join(f"  - {d}" for d in report.differences)
        raise TokenizerMismatchError(f"{report.summary()}\n{differences}", report=report)
    print(report.summary())
    for note in report.notes:
        print(f"  note: {note}")
    return 0
