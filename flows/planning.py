"""Plan a run: pin both models, read their configs, check the matrix, compute every build's content key.

Shared by `fusedspec plan`, `fusedspec compile` and the compile-fused flow, so the keys a user sees in a
plan are exactly the keys the flow builds and looks up. No weight file moves here: only each model's
config and tokenizer files are fetched. Every problem (either model, the matrix, the backend's own
rules) is reported at once as a MatrixError (exit 2).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compile.backend import get_backend
from compile.build import build_key
from compile.errors import InputError, MatrixError
from compile.matrix import plan_matrix
from compile.modelconfig import ModelArch, read_arch
from compile.modelref import ResolvedModel, parse_model_ref
from compile.runconfig import RunConfig
from compile.settings import Settings
from compile.spec import BuildSpec, spec_problems
from registry.hub import fetch_configs, resolve_model


@dataclass(frozen=True)
class PlannedBuild:
    spec: BuildSpec
    key: str

    @property
    def slug(self) -> str:
        return self.spec.slug


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    target: ResolvedModel
    draft: ResolvedModel
    target_arch: ModelArch
    draft_arch: ModelArch
    target_config_dir: Path  # config + tokenizer files, fetched without weights
    draft_config_dir: Path
    builds: tuple[PlannedBuild, ...]
    toolchain: dict[str, str]
    code_version: str
    options: dict[str, Any]

    def build(self, key: str) -> PlannedBuild:
        for planned in self.builds:
            if planned.key == key:
                return planned
        raise InputError(f"no build with key {key} in this run config; `fusedspec plan` lists the keys")


def key_options(config: RunConfig) -> dict[str, Any]:
    """Compile options that change a build's result (and so its key): AOTInductor packaging changes the
    cpu backend's programs; the neuron backend has none of these."""
    return config.compile.model_dump() if config.backend == "cpu" else {}


def pin_model(text: str, role: str, base_dir: Path, settings: Settings) -> tuple[ResolvedModel, ModelArch, Path]:
    """Resolve a model reference to pinned content and read its architecture (configs only)."""
    try:
        model = resolve_model(parse_model_ref(text, base_dir=base_dir), settings)
        config_dir = fetch_configs(model, settings)
        return model, read_arch(config_dir), config_dir
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


def plan_run(config: RunConfig, settings: Settings, *, base_dir: Path | None = None) -> RunPlan:
    """Every build of `config` with its key, or MatrixError naming every problem found.

    Local model paths are relative to `base_dir` (the config file's directory; default the cwd).
    """
    base_dir = Path.cwd() if base_dir is None else base_dir
    config = with_local_paths_resolved(config, base_dir)  # build.json records where the models were
    pinned: dict[str, tuple[ResolvedModel, ModelArch, Path]] = {}
    problems: list[str] = []
    for role, text in (("target", config.target), ("draft", config.draft)):
        try:
            pinned[role] = pin_model(text, role, base_dir, settings)
        except InputError as exc:
            problems.append(str(exc))
    specs: list[BuildSpec] = []
    if len(pinned) == 2:
        target_arch, draft_arch = pinned["target"][1], pinned["draft"][1]
        try:
            specs = plan_matrix(config.matrix, config.backend, target_arch, draft_arch)
        except MatrixError as exc:
            problems += exc.problems
        backend = get_backend(config.backend)
        for spec in specs:
            problems += [p for p in backend.check(spec, target_arch, draft_arch) if p not in problems]
    else:
        problems += _spec_only_problems(config)
    if problems:
        raise MatrixError(problems)

    (target, target_arch, target_dir), (draft, draft_arch, draft_dir) = pinned["target"], pinned["draft"]
    backend = get_backend(config.backend)
    options = key_options(config)
    builds = tuple(PlannedBuild(spec, build_key(spec, target, draft, options)) for spec in specs)
    return RunPlan(config=config, target=target, draft=draft, target_arch=target_arch, draft_arch=draft_arch,
                   target_config_dir=target_dir, draft_config_dir=draft_dir, builds=builds,
                   toolchain=backend.toolchain(), code_version=backend.code_version, options=options)


def pinned_config(plan: RunPlan) -> RunConfig:
    """The run config with each Hub model pinned to its resolved commit (local dirs made absolute), so a
    worker elsewhere builds exactly what this plan planned."""
    def pin(model: ResolvedModel) -> str:
        if model.ref.repo_id is not None and model.commit is not None:
            return f"hf://{model.ref.repo_id}@{model.commit}"
        return str(model.local_dir)

    return plan.config.model_copy(update={"target": pin(plan.target), "draft": pin(plan.draft)})


def with_local_paths_resolved(config: RunConfig, base_dir: Path) -> RunConfig:
    """The config with local model directories made absolute against `base_dir` (the config file's
    directory), so a flow run started from anywhere reads the same checkpoints."""
    def absolute(text: str) -> str:
        if "://" in text or Path(text).is_absolute():
            return text
        return str((base_dir / text).resolve())

    return config.model_copy(update={"target": absolute(config.target), "draft": absolute(config.draft)})
