"""The `cpu` backend object: check, compile, dry-run and load fused speculative builds.

compile = read both checkpoints (checked against their configs) -> shard with NxDI's rules -> write
`weights/tp{r}_sharded_checkpoint.safetensors` -> torch.export the programs (optionally AOTInductor), or,
given the programs of this build's graph key (compile/build.py), link those in instead -> copy the target's
tokenizer files -> build.json last. The programs take every weight as an input, so they are the same bytes
for every revision of the models with the same graph key. Every input problem is raised before the output
directory is created; a failure after that removes what was written.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch

from fusedspec.compile import toolchain
from fusedspec.compile.backend import Backend, ProgramSource, describe_build, write_build_description
from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.cpu import native
from fusedspec.compile.cpu.checkpoint import check_rope, load_checkpoint
from fusedspec.compile.cpu.export import (
    AOTI_SUFFIX,
    EXPORT_SUFFIX,
    PROGRAMS,
    TARGET_ALONE_PROGRAMS,
    TIMING_PROGRAMS,
    export_program,
    save_program,
)
from fusedspec.compile.cpu.layout import (
    CTX_BATCH_SIZE,
    PROGRAMS_DIR,
    ROLES,
    WEIGHTS_DIR,
    Layout,
    rank_shapes,
    save_weights,
    weights_file,
)
from fusedspec.compile.cpu.model import Decoder
from fusedspec.compile.cpu.runner import CpuRunner
from fusedspec.compile.cpu.sharding import ShardPlan, shard_model
from fusedspec.compile.matrix import build_problems
from fusedspec.compile.model_files import TOKENIZER_FILES, TOKENIZER_VOCABULARY_FILES
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.program_cache import link_or_copy
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, CheckpointError, ConfigError
from fusedspec.core.memory import release_freed_memory

# target_alone: also export the target-alone programs (plain greedy through the same weights): the
# baseline a speedup is measured against, and a way to serve a prompt class where speculation does not pay;
# with them target_verify, which validation times to measure the cost model on the artifact's own programs
# cpu_isa: the CPU instruction set an AOTInductor package is compiled for (compile/cpu/native.py); filled in
# with this host's portable baseline when not given, refused when given for another one
OPTIONS = {"aot_inductor": bool, "cpu_isa": str, "max_context_length": int, "target_alone": bool}


def parse_options(options: dict[str, Any] | None, spec: BuildSpec) -> dict[str, Any]:
    """Known options with defaults filled in; unknown names or bad values are ConfigErrors."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown cpu compile option(s) {unknown}; known: {sorted(OPTIONS)}")
    aot = options.get("aot_inductor") or False
    target_alone = options.get("target_alone") or False
    context = options.get("max_context_length") or spec.seq_len
    for name, value in (("aot_inductor", aot), ("target_alone", target_alone)):
        if not isinstance(value, bool):
            raise ConfigError(f"compile option {name}={value!r} must be true or false")
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= spec.seq_len:
        raise ConfigError(f"compile option max_context_length={context!r} must be an integer in "
                          f"1..seq_len={spec.seq_len}")
    isa = options.get("cpu_isa")
    problems = aot_inductor_problems(aot, isa)
    if problems:
        raise ConfigError("; ".join(problems))
    return {"aot_inductor": aot, "cpu_isa": native.build_isa() if aot else None,
            "max_context_length": context, "target_alone": target_alone}


def aot_inductor_problems(aot: bool, isa: object = None) -> list[str]:
    """Why this host cannot build with these packaging options (empty when it can): AOTInductor needs a
    C++ compiler and a known portable ISA baseline; `cpu_isa`, when given, must be the one built here."""
    if not aot:
        return [] if isa is None else [f"compile option cpu_isa={isa!r} applies only with aot_inductor: true"]
    problems = []
    compiler = native.compiler_problem()
    if compiler:
        problems.append(compiler)
    here = native.build_isa()
    if here is None:
        problems.append(f"compile.aot_inductor: no portable CPU ISA baseline is known for this host's "
                        f"{native.host_description()}; set compile.aot_inductor: false")
    elif isa is not None and isa != here:
        problems.append(f"compile option cpu_isa={isa!r}: this host builds AOTInductor packages for {here!r}")
    return problems


class CpuBackend:
    name = "cpu"
    code_version = toolchain.code_version("cpu")
    k_sweep_note: str | None = None  # builds of different k export their own programs; nothing to add

    def toolchain(self) -> dict[str, str]:
        return toolchain.cpu_toolchain()

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
        """Every reason this spec cannot be built for these models (empty when it can)."""
        problems = build_problems(spec, target, draft)
        if spec.backend != self.name:
            problems.append(f"spec is for backend {spec.backend!r}, not {self.name!r}")
        for role, arch in (("target", target), ("draft", draft)):
            if arch.head_dim % 2:
                problems.append(f"the {role}'s head_dim={arch.head_dim} is odd; RoPE needs an even head_dim")
        return problems

    def layout(self, spec: BuildSpec, target: ModelArch, draft: ModelArch, options: dict[str, Any]) -> Layout:
        suffix = AOTI_SUFFIX if options["aot_inductor"] else EXPORT_SUFFIX
        names = PROGRAMS + (TARGET_ALONE_PROGRAMS + TIMING_PROGRAMS if options["target_alone"] else ())
        return Layout(
            target=Decoder(target, ShardPlan.for_arch(target, spec.tp_degree), ROLES["target"]),
            draft=Decoder(draft, ShardPlan.for_arch(draft, spec.tp_degree), ROLES["draft"]),
            tp=spec.tp_degree, batch=spec.batch_size, context_len=options["max_context_length"],
            cache_len=spec.seq_len + spec.k, seq_len=spec.seq_len, k=spec.k, dtype=spec.dtype,
            programs={name: f"{PROGRAMS_DIR}/{name}{suffix}" for name in names},
        )

    def _plan(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel,
              options: dict[str, Any] | None) -> tuple[Layout, dict[str, Any]]:
        opts = parse_options(options, spec)
        target_arch, draft_arch = target.parsed_config().arch, draft.parsed_config().arch
        problems = self.check(spec, target_arch, draft_arch)
        if problems:
            raise ConfigError(f"cannot build {spec.slug} on the cpu backend: " + "; ".join(problems))
        return self.layout(spec, target_arch, draft_arch, opts), opts

    def dry_run(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                reuse_programs: bool = False) -> dict[str, Any]:
        """What compile would do, as plain data; reads only the two config.json files. `reuse_programs`: the
        programs of the graph key will be linked in, not exported (the same files either way)."""
        layout, opts = self._plan(spec, target, draft, options)
        itemsize = torch.empty((), dtype=layout.torch_dtype).element_size()
        shapes = rank_shapes(layout.target) | rank_shapes(layout.draft)
        rank_bytes = sum(itemsize * _numel(s) for s in shapes.values())
        return {
            "backend": self.name,
            "key": keys.version,
            "graph_key": keys.graph,
            "reuse_programs": reuse_programs,
            "out_dir": str(out_dir),
            "spec": spec.to_json(),
            "options": opts,
            "sharding": {role: dec.plan.describe() for role, dec in (("target", layout.target),
                                                                       ("draft", layout.draft))},
            "shapes": {"batch": layout.batch, "context_len": layout.context_len,
                       "cache_len": layout.cache_len,
                       "k": layout.k, "ctx_batch_size": CTX_BATCH_SIZE},  # continuous batching, as NxDI
            "files": [str(weights_file(Path("."), r)) for r in range(layout.tp)]
                     + list(layout.programs.values()) + ["build.json"],
            "weights_bytes_per_rank": rank_bytes,
            "weights_bytes": rank_bytes * layout.tp,
            "toolchain": self.toolchain(),
            "code_version": self.code_version,
        }

    def compile(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                programs: ProgramSource | None = None) -> Path:
        """Build into `out_dir` (must not exist or be empty); returns it. On failure it is removed. With
        `programs` (this graph key's, compiled before), the weights are sharded and the programs linked in."""
        layout, opts = self._plan(spec, target, draft, options)
        tokenizer_files = _tokenizer_files(target.local_dir)
        program_files = sorted(layout.programs.values())
        if programs is not None and sorted(programs.files) != program_files:
            raise ArtifactError(f"{programs.directory}: holds {sorted(programs.files)}, not this build's "
                                f"programs {program_files}; remove that directory and build again (the build "
                                "compiles it anew)")
        dtype = layout.torch_dtype
        started = time.perf_counter()
        # the programs' weight input: rank shards stacked along a leading dim (see model.py), as the
        # runner rebuilds it from the rank files
        weights: dict[str, torch.Tensor] = {}
        for model, dec in ((target, layout.target), (draft, layout.draft)):
            check_rope(model.local_dir, model.parsed_config())
            full = load_checkpoint(model.local_dir, dtype, dec.arch)
            weights |= {dec.prefix + n: t for n, t in shard_model(full, dec.plan).items()}
        weights = dict(sorted(weights.items()))
        weights_bytes = sum(t.numel() * t.element_size() for t in weights.values())

        out_dir = Path(out_dir)
        if out_dir.exists() and any(out_dir.iterdir()):
            raise ConfigError(f"{out_dir}: output directory is not empty; remove it or choose another")
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            save_weights(out_dir, weights, layout.tp)
            sharded = time.perf_counter()
            if programs is None:
                for name in layout.programs:
                    program = export_program(name, layout.target, layout.draft, weights, k=layout.k,
                                             batch=layout.batch, context_len=layout.context_len,
                                             cache_len=layout.cache_len, dtype=dtype)
                    save_program(program, out_dir / PROGRAMS_DIR, name, aot_inductor=opts["aot_inductor"],
                                 cpu_isa=opts["cpu_isa"])
                    del program
                    release_freed_memory(weights_bytes)
            else:
                for rel in program_files:
                    link_or_copy(programs.directory / rel, out_dir / rel)
            for path in tokenizer_files:
                shutil.copy2(path, out_dir / path.name)
            if opts["aot_inductor"]:
                # the ISA the native code needs, read by the loader (native.check_host_isa)
                options = {**(options or {}), "cpu_isa": opts["cpu_isa"]}
            timings = {"shard_s": round(sharded - started, 3),
                       "programs_s": round(time.perf_counter() - sharded, 3)}
            description = describe_build(spec, target, draft, keys=keys, backend=self, options=options,
                                         programs=program_files, programs_from=programs, cpu=layout.to_json(),
                                         timings=timings)
            write_build_description(out_dir, description)  # last: its presence means complete
        except BaseException:
            shutil.rmtree(out_dir, ignore_errors=True)
            raise
        return out_dir

    def load(self, artifact_dir: Path, trust: LoadTrust | None = None) -> CpuRunner:
        return CpuRunner(artifact_dir, trust)

    def build_options(self, requested: dict[str, Any]) -> dict[str, Any]:
        """AOTInductor packaging (with the CPU ISA its native code is compiled for) and the target-alone
        programs change the artifact, so the key."""
        options = dict(requested)
        if options.get("aot_inductor"):
            options["cpu_isa"] = native.build_isa()
        return options

    def host_problems(self, requested: dict[str, Any]) -> list[str]:
        """An AOTInductor build (the default) needs a C++ compiler, found the way torch inductor finds one:
        refused up front, not after the weights are sharded."""
        return aot_inductor_problems(bool(requested.get("aot_inductor", False)))

    def stated_step_bytes(self, arch: ModelArch, spec: BuildSpec) -> float | None:
        return None  # a cpu artifact's steps are timed on this host, the one it serves on

    def runtime_mismatches(self, recorded_toolchain: dict[str, Any]) -> list[str]:
        """Why this host cannot serve an artifact built with `recorded_toolchain` (empty when it can)."""
        here = self.toolchain()
        problems = []
        for name in sorted(set(here) | set(recorded_toolchain)):
            built, now = recorded_toolchain.get(name), here.get(name)
            if built != now:
                problems.append(f"{name}: artifact built with {built!r}, this host has {now!r} "
                                f"(exported programs are tied to the {name} release; rebuild here)")
        return problems


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _tokenizer_files(model_dir: Path) -> list[Path]:
    found = [Path(model_dir) / name for name in TOKENIZER_FILES if (Path(model_dir) / name).is_file()]
    if not any(p.name in TOKENIZER_VOCABULARY_FILES for p in found):
        raise CheckpointError(
            f"{model_dir}: no tokenizer files (tokenizer.json, vocab.json+merges.txt or tokenizer.model); "
            "an artifact must carry the target's tokenizer")
    return found


BACKEND: Backend = CpuBackend()  # mypy holds the class to the contract
__all__ = ["BACKEND", "CpuBackend", "WEIGHTS_DIR"]
