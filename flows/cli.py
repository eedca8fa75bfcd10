"""The `fusedspec` console script: one dispatcher, one module per command under `flows/commands/`.

A command module defines `HELP` (one line), `add_arguments(parser)` and `run(args, settings) -> int`.
Only the chosen command's module is imported, so `fusedspec verify` never pays for torch.

Exit codes: 0 done or passed, 1 a check failed, 2 bad input or usage (nothing written).
Every FusedspecError ends as one line on stderr (and, with --json, one JSON document on stdout).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from compile.errors import FusedspecError
from compile.settings import load_settings

COMMANDS = {
    "plan": "validate a run config, print the matrix with content keys",
    "check-tokenizers": "tokenizer gate between two models or tokenizer dirs",
    "compile": "compile (no publish) every config of a run config into the work dir",
    "validate": "greedy equivalence of one artifact against its target",
    "advise": "acceptance per prompt class, predicted speedup per k, plot",
    "run": "the whole compile-fused flow, locally",
    "publish": "publish one artifact version (URI: s3://bucket/prefix or a dir)",
    "verify": "check a published version (or LATEST) against its manifest",
    "ls": "list published configs and versions",
    "k8s": "print PV, PVC and vLLM Deployment YAML for a version",
    "demo": "the main job on the embedded defaults (what `make demo` runs)",
}


def _module(name: str):  # noqa: ANN202 - a module object
    return importlib.import_module(f"flows.commands.{name.replace('-', '_')}")


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusedspec",
        description="Compile, validate and publish fused speculative-decoding artifacts.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<18}{h}" for n, h in COMMANDS.items()),
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        _top_parser().parse_args(argv[:1] or ["--help"])  # prints help or a usage error (exit 2)
        return 2
    name = argv[0]
    module = _module(name)
    parser = argparse.ArgumentParser(prog=f"fusedspec {name}", description=COMMANDS[name])
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args, load_settings()))
    except FusedspecError as exc:
        print(f"fusedspec {name}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": str(exc), "exit_code": exc.exit_code}))
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"fusedspec {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
