"""`fusedspec plan CONFIG [--json]`: check a run config against both models and print its builds with keys.

Order: load the config, pin both models (commit + file hashes), fetch their configs only (never the
weights), read both architectures, check the whole matrix, and compute each build's content key with the
backend's toolchain. Every problem found (either model reference, the matrix) is reported at once, exit
2. Local model paths in a config are relative to the config file's directory.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from compile.content_key import content_key
from compile.errors import InputError, MatrixError
from compile.matrix import plan_matrix
from compile.modelconfig import ModelArch, read_arch
from compile.modelref import ResolvedModel, parse_model_ref
from compile.runconfig import RunConfig, load_run_config
from compile.settings import Settings
from compile.spec import BuildSpec, spec_problems
from compile.toolchain import CODE_VERSIONS, NEURON_DISTRIBUTIONS, cpu_toolchain, distribution_versions
from registry.hub import fetch_configs, resolve_model

HELP = "validate a run config, print the matrix with content keys"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="run config (YAML)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def backend_toolchain(backend: str, settings: Settings) -> dict[str, str]:
    """The toolchain versions that enter the keys of `backend`'s builds on this host."""
    if backend == "cpu":
        return cpu_toolchain()
    try:
        from compile.neuron.toolchain import neuron_toolchain
    except ImportError:  # the neuron backend's module is not there yet: the distributions alone
        return distribution_versions(NEURON_DISTRIBUTIONS)
    return neuron_toolchain(settings)


def key_options(config: RunConfig) -> dict[str, Any]:
    """Compile options that change a build's result (and so its key): AOTInductor packaging changes the
    cpu backend's programs; the neuron backend has none of these."""
    return config.compile.model_dump() if config.backend == "cpu" else {}


def _pin(text: str, role: str, base_dir: Path, settings: Settings) -> tuple[ResolvedModel, ModelArch]:
    try:
        model = resolve_model(parse_model_ref(text, base_dir=base_dir), settings)
        return model, read_arch(fetch_configs(model, settings))
    except InputError as exc:
        raise InputError(f"{role}: {exc}") from exc


def _spec_only_problems(config: RunConfig) -> list[str]:
    """The matrix's problems that need no model (used when a model could not be read)."""
    m, problems = config.matrix, []
    for tp, seq, k, bs, dtype in itertools.product(m.tp_degree, m.seq_len, m.speculation_length,
                                                   m.batch_size, m.dtype):
        raw = BuildSpec.__new__(BuildSpec)  # checked without raising, so every problem is gathered
        for name, value in (("tp_degree", tp), ("seq_len", seq), ("speculation_length", k),
                            ("batch_size", bs), ("dtype", dtype), ("backend", config.backend)):
            object.__setattr__(raw, name, value)
        problems += [p for p in spec_problems(raw) if p not in problems]
    return problems


def plan(config_path: Path, settings: Settings) -> dict[str, Any]:
    """The plan as plain data, or MatrixError with every problem of the config and its models."""
    config = load_run_config(config_path)
    base_dir = Path(config_path).resolve().parent
    pinned: dict[str, tuple[ResolvedModel, ModelArch]] = {}
    problems: list[str] = []
    for role, text in (("target", config.target), ("draft", config.draft)):
        try:
            pinned[role] = _pin(text, role, base_dir, settings)
        except InputError as exc:
            problems.append(str(exc))
    if len(pinned) == 2:
        try:
            specs = plan_matrix(config.matrix, config.backend, pinned["target"][1], pinned["draft"][1])
        except MatrixError as exc:
            problems += exc.problems
    else:
        problems += _spec_only_problems(config)
    if problems:
        raise MatrixError(problems)

    (target, target_arch), (draft, draft_arch) = pinned["target"], pinned["draft"]
    toolchain = backend_toolchain(config.backend, settings)
    code_version = CODE_VERSIONS[config.backend]
    options = key_options(config)
    builds = [{"slug": spec.slug, "spec": spec.to_json(),
               "key": content_key(spec, target, draft, toolchain, code_version, options)} for spec in specs]
    return {
        "ok": True,
        "config": str(config_path),
        "backend": config.backend,
        "target": {"ref": target.ref.text, **target.identity(), "model_type": target_arch.model_type},
        "draft": {"ref": draft.ref.text, **draft.identity(), "model_type": draft_arch.model_type},
        "toolchain": toolchain,
        "code_version": code_version,
        "options": options,
        "builds": builds,
    }


def run(args: argparse.Namespace, settings: Settings) -> int:
    result = plan(args.config, settings)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for role in ("target", "draft"):
        model = result[role]
        pinned = f"commit {model['commit']}" if model["commit"] else "local directory"
        print(f"{role}: {model['ref']} ({model['model_type']}, {pinned}, {len(model['files'])} files hashed)")
    tools = ", ".join(f"{k} {v}" for k, v in sorted(result["toolchain"].items()))
    print(f"backend: {result['backend']} (code version {result['code_version']}; {tools})")
    print()
    header = ("#", "tp", "seq_len", "k", "batch", "dtype", "content key")
    rows = [(str(i), str(b["spec"]["tp_degree"]), str(b["spec"]["seq_len"]), str(b["spec"]["speculation_length"]),
             str(b["spec"]["batch_size"]), b["spec"]["dtype"], b["key"]) for i, b in enumerate(result["builds"], 1)]
    widths = [max(len(r[c]) for r in (header, *rows)) for c in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"\n{len(rows)} build(s); no weights downloaded")
    return 0
