"""The `fusedspec` console script: one dispatcher, one module per command under `flows/commands/`.

A command module defines `add_arguments(parser)` and `run(args, settings) -> int`; its one-line help is
in COMMANDS here, so that `fusedspec --help` imports no command module. Only the chosen command's module
is imported, so `fusedspec verify` never pays for torch.

Exit codes: 0 done or passed, 1 a check failed (or an internal error), 2 bad input or usage (nothing
written). Every FusedspecError ends as its message on stderr; any other exception as one line naming
the command, the error and the log file under the work dir where its full trace was written. With
--json, stdout always holds exactly one JSON document, on errors too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from fusedspec.core.errors import FusedspecError
from fusedspec.core.settings import Settings, load_settings

COMMANDS = {
    "plan": "validate a run config, print the matrix with content keys",
    "check-tokenizers": "tokenizer gate between two models or tokenizer dirs",
    "compile": "compile (no publish) every config of a run config into the work dir",
    "validate": "greedy equivalence of one artifact against its target",
    "advise": "acceptance per prompt class, predicted speedup per k, plot; several drafts ranked with k",
    "run": "the whole compile-fused flow, locally",
    "submit": "send a run config to a Prefect deployment (planned here first), optionally following its logs",
    "publish": "publish one artifact version (URI: s3://bucket/prefix or a dir)",
    "verify": "check a published version (or LATEST) against its manifest",
    "ls": "list published configs and versions",
    "gc": "remove what a store or the work dir no longer needs (dead attempts, uploads, published builds)",
    "k8s": "print PV, PVC and serving Deployment YAML for a version",
    "serve": "serve a published cpu version over an OpenAI-compatible HTTP API",
    "keygen": "make an Ed25519 key pair for signing and verifying manifests",
    "demo": "the main job on the embedded defaults (what `make demo` runs)",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error still prints one JSON document when --json was asked for."""

    def __init__(self, *args: Any, json_output: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.json_output = json_output

    def error(self, message: str) -> NoReturn:
        if self.json_output:
            print(json.dumps({"ok": False, "error": f"usage: {message}", "exit_code": 2}))
        super().error(message)


def _module(name: str):  # noqa: ANN202 - a module object
    return importlib.import_module(f"fusedspec.flows.commands.{name.replace('-', '_')}")


def _top_parser(json_output: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        json_output=json_output,
        prog="fusedspec",
        description="Compile, validate and publish fused speculative-decoding artifacts.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<18}{h}" for n, h in COMMANDS.items()),
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def _write_trace(name: str, settings: Settings | None) -> Path | None:
    """The full trace of the exception being handled, in a log file; its path (None if none is writable)."""
    text = traceback.format_exc()
    base = settings.logs_dir if settings is not None else Path.cwd()
    path = base / f"fusedspec-{name}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"fusedspec {' '.join(sys.argv[1:])}\n\n{text}")
    except OSError:
        return None
    return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        # prints help, or a usage error (exit 2; with --json, its JSON document too)
        _top_parser(json_output="--json" in argv).parse_args(argv[:1] or ["--help"])
        return 2
    name = argv[0]
    wants_json = "--json" in argv[1:]
    module = _module(name)
    parser = _Parser(prog=f"fusedspec {name}", description=COMMANDS[name], json_output=wants_json)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    settings: Settings | None = None
    try:
        settings = load_settings()
        return int(module.run(args, settings))
    except FusedspecError as exc:
        print(f"fusedspec {name}: error: {exc}", file=sys.stderr)
        if wants_json:
            print(json.dumps({"ok": False, "error": str(exc), "exit_code": exc.exit_code}))
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"fusedspec {name}: interrupted", file=sys.stderr)
        if wants_json:
            print(json.dumps({"ok": False, "error": "interrupted", "exit_code": 130}))
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a message, never a bare traceback
        log = _write_trace(name, settings)
        where = f"; the full trace is in {log}. Please report it with that file" if log else \
            " (no log file could be written for its trace). Please report it with this message"
        message = f"internal error ({type(exc).__name__}: {str(exc)[:300]}){where}"
        print(f"fusedspec {name}: {message}", file=sys.stderr)
        if wants_json:
            print(json.dumps({"ok": False, "error": message, "exit_code": 1,
                              "log": str(log) if log else None}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
