"""BACKEND: the `neuron` backend (compile.backend.Backend, plus its target-only reference build).

    dry_run(spec, target, draft, out_dir, keys=, options=, reuse_programs=)
                                                          -> what compile would do, as plain data; any host
    compile(...)                                          -> NxDI compile on a host with the Neuron SDK;
                                                             on its graph key's programs, the shard step
    load(artifact_dir)                                    -> a Runner doing greedy fused generation
    compile_reference(...) / load_reference(...)          -> NxDI's target-only build, the second greedy
                                                             reference
    runtime_mismatches(recorded_toolchain)                -> why this host cannot serve an artifact ([] if
                                                             it can)

Every NxDI compile, load and reference build runs in a process of its own (compile.neuron.isolation), so
NxDI 0.6's class mutation and the per-build environment never reach another build, whatever the fan-out.
This process never imports a Neuron package. Without the SDK, compile and load raise InputError pointing at
--dry-run; nothing is ever faked.

The artifact is what NxDI's compile() writes plus what the legacy vLLM fork reads by model id before it opens
NEURON_COMPILED_ARTIFACTS, so a pod needs no Hugging Face Hub (see docs/trainium.md, The artifact):

    neuron_config.json, model.pt, weights/tp{r}_sharded_checkpoint.safetensors   NxDI compile(); model.pt
                                                                                 is the program (translate.
                                                                                 PROGRAM_FILES), the rest
                                                                                 is per revision
    config.json, generation_config.json, tokenizer files                       the target's (the root is the
                                                                                 target's model dir for vLLM)
    draft/config.json, draft/generation_config.json                             the draft's
    build.json                                                                  last, as for every backend
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import (
    BUILD_DESCRIPTION,
    DECODE_STEPS,
    DECODE_STEPS_S,
    Backend,
    Batcher,
    BuildDescription,
    Generation,
    ProgramSource,
    describe_build,
    read_build_description,
    write_build_description,
)
from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.documents.validation import StepTimesRecord
from fusedspec.compile.model_files import CONFIG_FILES, TOKENIZER_FILES, TOKENIZER_VOCABULARY_FILES
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.neuron import toolchain as neuron_tc
from fusedspec.compile.neuron.device import SDK_MISSING
from fusedspec.compile.neuron.fields import (
    InstalledNxdi,
    check_nxdi_version,
    installed_nxdi,
    version_warnings,
)
from fusedspec.compile.neuron.heads import sharded_heads
from fusedspec.compile.neuron.isolation import IsolatedSession, run_isolated
from fusedspec.compile.neuron.translate import (
    HOST_ONLY_ENV,
    K_SWEEP_NOTE,
    PROGRAM_FILES,
    model_problems,
    target_only,
    translate,
)
from fusedspec.compile.program_cache import link_or_copy
from fusedspec.compile.spec import DTYPE_ITEMSIZE, BuildSpec
from fusedspec.compile.toolchain import ABSENT, NEURON_CODE_VERSION
from fusedspec.compile.trust import NXDI_MODEL, LoadTrust
from fusedspec.core.errors import ArtifactError, ConfigError, InputError, PromptError, VerificationError
from fusedspec.core.files import file_lock
from fusedspec.core.settings import Settings, load_settings

NXDI_DISTRIBUTION = "neuronx-distributed-inference"
DRAFT_DIR = "draft"


# An experimental NxD switch (trace/model_builder.py, SDK 2.26 to 2.29): set, the trace leaves the
# weight-layout transform out of model.pt and the shard step writes transformed weights from the trace's own
# state, so model.pt and the weights stop being apart, and no key records it.
LAYOUT_SWITCH = "NXD_LAYOUT_TRANSFORMATION_OPTIONS"


def compile_work_dir(settings: Settings, graph_key: str, *, reference: bool = False) -> Path:
    """NxDI's scratch (BASE_COMPILE_WORK_DIR) for the builds of one graph key: one path for every revision,
    so the compiler flags, which name a log file under it, and with them the persistent compile cache's keys
    stay the same (translate.compile_env). The target-only reference of that key has a scratch of its own."""
    return settings.work_dir / "neuron-compile" / (f"{graph_key}.target-only" if reference else graph_key)


@contextmanager
def _tracing_in(settings: Settings, scratch: Path) -> Iterator[None]:
    """One trace at a time in a scratch directory: NxD's trace starts by removing it (ModelBuilder.trace).
    Builds of one graph key already take turns (compile/build.py graph_lock); this also covers references."""
    with file_lock(settings.cache_dir / "locks" / f"neuron-scratch-{scratch.name}.lock"):
        yield


def _plan(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *, graph_key: str,
          options: dict[str, Any] | None, settings: Settings,
          installed: InstalledNxdi | None) -> dict[str, Any]:
    return translate(
        spec, target.parsed_config().arch, draft.parsed_config().arch,
        target_path=target.local_dir, draft_path=draft.local_dir, compiled_model_path=Path(out_dir),
        compile_work_dir=compile_work_dir(settings, graph_key), options=options,
        neuron_cc_flags=settings.neuron_cc_flags, host_compile_cache_url=settings.neuron_compile_cache_url,
        installed=installed,
    )


def _refuse_layout_switch() -> None:
    if os.environ.get(LAYOUT_SWITCH):
        raise ConfigError(f"{LAYOUT_SWITCH} is set: with it NxD writes the weights in the compiled layout "
                          "and leaves the layout transform out of model.pt, so a new revision could not "
                          "reuse model.pt, and no key records it; unset it for fusedspec builds")


def _require_sdk(toolchain: dict[str, str], installed: InstalledNxdi | None) -> None:
    """InputError unless NxDI is installed here, from distribution metadata (never an import: this process
    must stay free of Neuron modules), and ConfigError unless the version gate admits it: a stored release,
    or a newer one whose own models/config.py was read. A placeholder package that cannot be imported is
    reported by the build's own process (device.require_sdk) with the same message."""
    if toolchain.get(NXDI_DISTRIBUTION, ABSENT) == ABSENT or installed is None:
        raise InputError(SDK_MISSING)
    check_nxdi_version(installed.version, installed.fields)


def served_files(target_dir: Path, draft_dir: Path) -> dict[str, list[tuple[Path, str]]]:
    """{"target": [(source, artifact path)], "draft": [...]}: the model files the vLLM fork reads by model id
    (both config.json, the target's tokenizer), or ArtifactError naming what a checkpoint lacks."""
    target = [(target_dir / n, n) for n in (*CONFIG_FILES, *TOKENIZER_FILES) if (target_dir / n).is_file()]
    draft = [(draft_dir / n, f"{DRAFT_DIR}/{n}") for n in CONFIG_FILES if (draft_dir / n).is_file()]
    names = {dest for _, dest in target}
    problems = []
    if "config.json" not in names:
        problems.append(f"{target_dir} has no config.json")
    if not names & set(TOKENIZER_VOCABULARY_FILES):
        problems.append(f"{target_dir} has no tokenizer files (none of "
                        f"{', '.join(TOKENIZER_VOCABULARY_FILES)})")
    if not any(dest == f"{DRAFT_DIR}/config.json" for _, dest in draft):
        problems.append(f"{draft_dir} has no config.json")
    if problems:
        raise ArtifactError("; ".join(problems) + ": a serving pod reads them from the artifact (it never "
                            "asks the Hugging Face Hub), so the checkpoints must have them")
    return {"target": target, "draft": draft}


def _copy_served_files(files: dict[str, list[tuple[Path, str]]], out_dir: Path) -> None:
    for source, dest in (*files["target"], *files["draft"]):
        path = out_dir / dest
        if path.exists():  # NxDI's own outputs are never overwritten by a checkpoint file
            raise ArtifactError(f"NxDI's compile wrote {dest}, which is also a model file the pod needs; "
                                "this NxDI's artifact layout is not supported")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)


def _stored_plan(plan: dict[str, Any],
                 files: dict[str, list[tuple[Path, str]]] | None = None) -> dict[str, Any]:
    """The part of a plan recorded in build.json: no host paths, only what load, k8s and readers need."""
    stored = {
        "platform": plan["platform"], "model_type": plan["model_type"], "classes": plan["classes"],
        "target_neuron_config": plan["target"]["neuron_config"],
        "draft_neuron_config": plan.get("draft", {}).get("neuron_config"),
        "env": {k: v for k, v in plan["env"].items() if k not in HOST_ONLY_ENV},
        "expected_files": plan["expected_files"], "nxdi_versions": plan["nxdi_versions"],
        "notes": plan.get("notes", []),
    }
    if "serving" in plan and files is not None:
        stored["serving"] = {**plan["serving"], "draft_dir": DRAFT_DIR,
                             "model_files": {role: [dest for _, dest in pairs]
                                             for role, pairs in files.items()}}
    return stored


def _load_env(stored_plan: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in stored_plan.get("env", {}).items()}


@dataclass
class NeuronRunner:
    """Greedy generation on an NxDI model loaded in its own process (compile.backend.Runner). NxDI
    schedules its own cache lines there, so there is no batcher to drive from here, and a fused build
    has no target-alone programs (its target-only reference build is a runner of its own)."""

    spec: BuildSpec
    description: BuildDescription
    session: IsolatedSession
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    timings: dict[str, float] = field(default_factory=dict)
    target_alone = False
    continuous_batching = False

    @property
    def lines(self) -> int:
        return self.spec.batch_size

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """PromptError unless the prompt and max_new_tokens fit the compiled context and seq_len."""
        context = int(self.description.options.get("max_context_length")  # type: ignore[arg-type]
                      or self.spec.seq_len)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise PromptError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
        if not 0 < len(prompt) <= context:
            raise PromptError(f"the prompt has {len(prompt)} tokens; this artifact takes 1..{context} "
                              "(max_context_length)")
        if len(prompt) + max_new_tokens > self.spec.seq_len:
            raise PromptError(f"the prompt has {len(prompt)} tokens + max_new_tokens={max_new_tokens} > "
                              f"seq_len={self.spec.seq_len} of this artifact; ask for fewer new tokens")

    def target_eos(self) -> frozenset[int]:
        return frozenset(self.eos_token_ids)

    def batcher(self, *, speculate: bool = True, max_waiting: int | None = None) -> Batcher:
        raise ArtifactError("a neuron artifact's cache lines are scheduled by NxDI in its own process; there "
                            "is no continuous batcher to drive from here (serve it with vLLM: "
                            "`fusedspec k8s`)")

    def step_times(self) -> StepTimesRecord | None:
        return None  # a fused step is one device graph: validate.step_costs.device_step_times times it

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None, *, speculate: bool = True) -> Generation:
        from fusedspec.compile.neuron.device import session_generate

        if not speculate:
            raise ArtifactError("a neuron artifact has no target-alone programs (speculate=False); its "
                                "target-only reference build (NeuronBackend.compile_reference) runs the "
                                "target alone")
        eos = tuple(eos_token_ids) if eos_token_ids is not None else self.eos_token_ids
        start = time.perf_counter()
        tokens, accepted, step_seconds = self.session.call(session_generate, [list(p) for p in prompts],
                                                           max_new_tokens, list(eos), self.pad_token_id)
        if accepted is None:  # target-only reference: one token per step after the first
            accepted = [[1] * max(len(t) - 1, 0) for t in tokens]
        # the device step time the k advice's cost model is measured from
        return Generation(tokens=tokens, accepted=accepted,
                          timings={**self.timings, "generate_s": time.perf_counter() - start,
                                   DECODE_STEPS_S: sum(step_seconds), DECODE_STEPS: float(len(step_seconds))})

    def close(self) -> None:
        """Unload: ends the model's process (also done when the runner is garbage collected)."""
        self.session.close()


class NeuronBackend:
    name = "neuron"
    code_version = NEURON_CODE_VERSION
    k_sweep_note = K_SWEEP_NOTE  # what builds of different k share, for the plan (flows/planning.py)

    def toolchain(self) -> dict[str, str]:
        return neuron_tc.neuron_toolchain(load_settings())

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
        # The neuron options' rules run where they are read (the run config, and translate per build).
        return model_problems(spec, target, draft)

    def dry_run(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                reuse_programs: bool = False) -> dict[str, Any]:
        """Exactly what compile would do, as plain data; needs only both models' config and tokenizer files;
        writes nothing. `reuse_programs`: the programs of the build's graph key will be there (the plan found
        them in the work dir or the store), so the steps are the shard step's."""
        settings = load_settings()
        installed = installed_nxdi()
        plan = _plan(spec, target, draft, out_dir, graph_key=keys.graph, options=options, settings=settings,
                     installed=installed)
        toolchain = neuron_tc.neuron_toolchain(settings)
        files = served_files(target.local_dir, draft.local_dir)
        artifact_files = [*plan["expected_files"], *(dest for pairs in files.values() for _, dest in pairs),
                          BUILD_DESCRIPTION]
        return {
            "backend": self.name, "key": keys.version, "graph_key": keys.graph, "spec": spec.to_json(),
            "options": options or {}, "out_dir": str(out_dir),
            "sdk_present": toolchain.get(NXDI_DISTRIBUTION, ABSENT) != ABSENT, "toolchain": toolchain,
            "plan": plan,
            "steps": build_steps(plan, files, keys.graph, reuse_programs),
            "served_files": {role: [dest for _, dest in pairs] for role, pairs in files.items()},
            "artifact_files": artifact_files, "files": artifact_files,
            "weights_bytes": weights_bytes(spec, target.parsed_config().arch, draft.parsed_config().arch),
            "notes": plan["notes"],
            # the host's NxDI where a compile here would refuse it or go beyond the stored field lists
            "warnings": version_warnings(installed),
        }

    def compile(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                programs: ProgramSource | None = None) -> Path:
        """Compile one fused artifact into out_dir (a fresh dir the caller renames into place), or, given the
        programs of its graph key (model.pt), link them in and run only the shard step: this revision's
        neuron_config.json and weights. On any failure, a directory this call created is removed again."""
        key = keys.version
        settings = load_settings()
        installed = installed_nxdi()
        plan = _plan(spec, target, draft, out_dir, graph_key=keys.graph, options=options, settings=settings,
                     installed=installed)
        files = served_files(target.local_dir, draft.local_dir)
        toolchain = neuron_tc.neuron_toolchain(settings)
        _require_sdk(toolchain, installed)
        _refuse_layout_switch()
        if programs is not None and sorted(programs.files) != sorted(PROGRAM_FILES):
            raise ArtifactError(f"{programs.directory}: holds {sorted(programs.files)}, not a neuron build's "
                                f"programs {list(PROGRAM_FILES)}; remove that directory and "
                                "build again (the build compiles it anew)")
        from fusedspec.compile.neuron.device import compile_plan, shard_plan

        out_dir = Path(out_dir)
        with _removed_on_failure(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            if programs is None:
                with _tracing_in(settings, Path(plan["compile"]["compile_work_dir"])):
                    run_isolated(compile_plan, plan, env=plan["env"],
                                 what=f"the NxDI compile of {spec.slug} ({key[:12]})")
                timings = {"compile_s": time.perf_counter() - start}
            else:
                for rel in programs.files:
                    link_or_copy(programs.directory / rel, out_dir / rel)
                what = f"sharding the weights of {spec.slug} ({key[:12]}) for graph key {keys.graph[:12]}"
                run_isolated(shard_plan, plan, env=plan["env"], what=what)
                timings = {"shard_s": time.perf_counter() - start}
            missing = [f for f in plan["expected_files"] if not (out_dir / f).is_file()]
            if missing:
                step = "compile" if programs is None else "shard step"
                raise ArtifactError(f"NxDI {step} finished but {out_dir} lacks {', '.join(missing[:5])}")
            _copy_served_files(files, out_dir)
            write_build_description(out_dir, describe_build(
                spec, target, draft, keys=keys, backend=self, options=options, programs=list(PROGRAM_FILES),
                programs_from=programs, neuron=_stored_plan(plan, files), timings=timings,
            ))
        return out_dir

    def load(self, artifact_dir: Path, trust: LoadTrust | None = None) -> NeuronRunner:
        """A runner for a compiled artifact; refuses one whose toolchain this host does not have. NxDI's
        model.pt is TorchScript holding the compiled NEFFs, which loading runs: refused unless `trust`
        allows native code (compile.trust), and every file hashed against the manifest first when one is in
        hand (NxDI reads the files itself, so they cannot be hashed as it loads them)."""
        trust = trust or LoadTrust.for_directory(Path(artifact_dir), load_settings().builds_dir)
        refusal = trust.native_refusal(NXDI_MODEL)
        if refusal:
            raise VerificationError(refusal)
        for rel in sorted(trust.hashes):
            trust.verify_file(Path(artifact_dir), rel)
        description = read_build_description(artifact_dir)
        if description.neuron is None:
            raise ArtifactError(f"{artifact_dir}: built by the {description.backend!r} backend, not neuron")
        _require_sdk(self.toolchain(), installed_nxdi())
        mismatches = self.runtime_mismatches(description.toolchain)
        if mismatches:
            raise ArtifactError(f"{artifact_dir} cannot be served on this host: " + "; ".join(mismatches))
        from fusedspec.compile.neuron.device import load_session

        start = time.perf_counter()
        stored = description.neuron
        session = IsolatedSession(load_session, str(artifact_dir), stored, env=_load_env(stored),
                                  what=f"the NxDI model of {artifact_dir}")
        eos = session.info["eos_token_id"]
        eos_ids = (eos,) if isinstance(eos, int) else tuple(eos or ())
        pad = session.info["pad_token_id"]
        return NeuronRunner(spec=description.spec, description=description,
                            session=session, eos_token_ids=eos_ids,
                            pad_token_id=pad if pad is not None else (eos_ids[0] if eos_ids else 0),
                            timings={"load_s": time.perf_counter() - start})

    def compile_reference(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path,
                          *, keys: BuildKeys, options: dict[str, Any] | None = None) -> Path:
        """NxDI's target-only build with the same shapes: the on-device greedy reference for `keys`."""
        key = keys.version
        settings = load_settings()
        installed = installed_nxdi()
        scratch = compile_work_dir(settings, keys.graph, reference=True)
        plan = target_only(_plan(spec, target, draft, out_dir, graph_key=keys.graph, options=options,
                                 settings=settings, installed=installed), Path(out_dir), scratch)
        _require_sdk(neuron_tc.neuron_toolchain(settings), installed)
        _refuse_layout_switch()
        from fusedspec.compile.neuron.device import compile_plan

        out_dir = Path(out_dir)
        with _removed_on_failure(out_dir), _tracing_in(settings, scratch):
            out_dir.mkdir(parents=True, exist_ok=True)
            run_isolated(compile_plan, plan, env=plan["env"],
                         what=f"the NxDI target-only reference compile of {spec.slug} ({key[:12]})")
            write_build_description(out_dir, describe_build(
                spec, target, draft, keys=keys, backend=self, options=options, programs=[],
                programs_from=None, neuron=_stored_plan(plan), reference="target-only"))
        return out_dir

    def load_reference(self, reference_dir: Path) -> NeuronRunner:
        return self.load(reference_dir)

    def runtime_mismatches(self, recorded_toolchain: dict[str, str]) -> list[str]:
        return neuron_tc.runtime_mismatches(recorded_toolchain, self.toolchain())

    def build_options(self, requested: dict[str, Any]) -> dict[str, Any]:
        return dict(requested)  # the neuron section, LNC resolved (NeuronOptions.backend_options)

    def host_problems(self, requested: dict[str, Any]) -> list[str]:
        return []  # without the SDK a neuron build stops at compile, pointing at --dry-run

    def stated_step_bytes(self, arch: ModelArch, spec: BuildSpec) -> float | None:
        """Weights / TP and the KV cache at seq_len: NxDI decode on Trainium is memory-bound, and this
        host's CPU says nothing about a device step."""
        tp, itemsize = spec.tp_degree, DTYPE_ITEMSIZE[spec.dtype]
        weights = parameters_all_ranks(arch, tp) * itemsize / tp
        # NxDI replicates KV heads when TP exceeds them, or converts to MHA when TP fits neither way
        kv_heads_per_rank = sharded_heads(arch.num_attention_heads, arch.num_key_value_heads,
                                          tp).kv_per_rank(tp)
        kv = (2 * arch.num_hidden_layers * kv_heads_per_rank * arch.head_dim * spec.seq_len * itemsize
              * spec.batch_size)
        return weights + kv


@contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    """Removes `path` if the block fails and the directory did not exist (or was empty) before it."""
    ours = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    try:
        yield
    except BaseException:
        if ours:
            shutil.rmtree(path, ignore_errors=True)
        raise


def build_steps(plan: dict[str, Any], files: dict[str, list[tuple[Path, str]]], graph_key: str,
                reuse_programs: bool) -> list[dict[str, Any]]:
    """What compile does, in order, as the dry run shows it: the NxDI compile, or, on the programs of the
    graph key, linking them and the shard step; then the model files a pod reads, then build.json."""
    shard = plan["shard"]
    if reuse_programs:
        first = [{"step": "link programs", "files": shard["program_files"],
                  "from": f"the program cache entry of graph key {graph_key[:12]} (compiled once for every "
                          "revision)"},
                 {"step": "shard weights", "calls": shard["calls"], "writes": shard["writes"]}]
    else:
        first = [{"step": "compile", "calls": plan["compile"]["calls"], "writes": plan["expected_files"],
                  "scratch": plan["compile"]["compile_work_dir"]}]
    model_files = [dest for pairs in files.values() for _, dest in pairs]
    return [*first, {"step": "copy model files", "files": model_files},
            {"step": "write build.json", "files": [BUILD_DESCRIPTION]}]


def weights_bytes(spec: BuildSpec, target: ModelArch, draft: ModelArch) -> int:
    """An estimate of the bytes of the sharded checkpoints over all ranks, from both configs (for the dry
    run): NxDI pads the query heads to a multiple of TP and replicates or converts the KV heads
    (compile.neuron.heads), every rank holds the norms, and lm_head is a tensor of its own even when tied
    (cloned from embed_tokens)."""
    return DTYPE_ITEMSIZE[spec.dtype] * sum(parameters_all_ranks(arch, spec.tp_degree)
                                            for arch in (target, draft))


def parameters_all_ranks(arch: ModelArch, tp: int) -> int:
    sharded = sharded_heads(arch.num_attention_heads, arch.num_key_value_heads, tp)
    heads, kv = sharded.q_heads, sharded.kv_heads
    d, h = arch.head_dim, arch.hidden_size
    attention = h * heads * d * 2 + h * kv * d * 2 + (heads * d + 2 * kv * d if arch.attention_bias else 0)
    norms = (2 * h + (2 * d if arch.qk_norm else 0)) * tp
    layer = attention + 3 * h * arch.intermediate_size + norms
    embeddings = 2 * arch.vocab_size * h
    return arch.num_hidden_layers * layer + embeddings + h * tp


BACKEND: Backend = NeuronBackend()  # mypy holds the class to the contract
