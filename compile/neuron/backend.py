"""BACKEND: the `neuron` backend (compile.backend.Backend, plus dry_run and runtime_mismatches).

    dry_run(spec, target, draft, out_dir, key=, options=)  -> what compile would do, as plain data; any host
    compile(...)                                          -> NxDI compile on a host with the Neuron SDK
    load(artifact_dir)                                    -> a Runner doing greedy fused generation
    compile_reference(...) / load_reference(...)          -> NxDI's target-only build, the second greedy reference
    runtime_mismatches(recorded_toolchain)                -> why this host cannot serve an artifact ([] if it can)

Every NxDI compile, load and reference build runs in a process of its own (compile.neuron.isolation), so
NxDI 0.6's class mutation and the per-build environment never reach another build, whatever the fan-out.
This process never imports a Neuron package. Without the SDK, compile and load raise InputError pointing at
--dry-run; nothing is ever faked.

The artifact is what NxDI's compile() writes plus what the legacy vLLM fork reads by model id before it opens
NEURON_COMPILED_ARTIFACTS, so a pod needs no Hugging Face Hub (see docs/trainium.md, The artifact):

    neuron_config.json, model.pt, weights/tp{r}_sharded_checkpoint.safetensors   NxDI compile()
    config.json, generation_config.json, tokenizer files                       the target's (the root is the
                                                                                 target's model dir for vLLM)
    draft/config.json, draft/generation_config.json                             the draft's
    build.json                                                                  last, as for every backend
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import (
    BUILD_DESCRIPTION,
    BuildDescription,
    Generation,
    describe_build,
    read_build_description,
    write_build_description,
)
from fusedspec.compile.model_files import CONFIG_FILES, TOKENIZER_FILES, TOKENIZER_VOCABULARY_FILES
from fusedspec.compile.modelconfig import ModelArch, read_arch
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
from fusedspec.compile.neuron.translate import model_problems, target_only, translate
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.toolchain import ABSENT, NEURON_CODE_VERSION
from fusedspec.core.errors import ArtifactError, InputError
from fusedspec.core.settings import Settings, load_settings

NXDI_DISTRIBUTION = "neuronx-distributed-inference"
DRAFT_DIR = "draft"


def compile_work_dir(settings: Settings, key: str) -> Path:
    return settings.work_dir / "neuron-compile" / key


def _plan(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *, key: str,
          options: dict[str, Any] | None, settings: Settings, installed: InstalledNxdi | None) -> dict[str, Any]:
    return translate(
        spec, read_arch(target.local_dir), read_arch(draft.local_dir),
        target_path=target.local_dir, draft_path=draft.local_dir, compiled_model_path=Path(out_dir),
        compile_work_dir=compile_work_dir(settings, key), options=options,
        neuron_cc_flags=settings.neuron_cc_flags, installed=installed,
    )


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
        problems.append(f"{target_dir} has no tokenizer files (none of {', '.join(TOKENIZER_VOCABULARY_FILES)})")
    if not any(dest == f"{DRAFT_DIR}/config.json" for _, dest in draft):
        problems.append(f"{draft_dir} has no config.json")
    if problems:
        raise ArtifactError("; ".join(problems) + ": a serving pod reads them from the artifact (it never asks the "
                            "Hugging Face Hub), so the checkpoints must have them")
    return {"target": target, "draft": draft}


def _copy_served_files(files: dict[str, list[tuple[Path, str]]], out_dir: Path) -> None:
    for source, dest in (*files["target"], *files["draft"]):
        path = out_dir / dest
        if path.exists():  # NxDI's own outputs are never overwritten by a checkpoint file
            raise ArtifactError(f"NxDI's compile wrote {dest}, which is also a model file the pod needs; "
                                "this NxDI's artifact layout is not supported")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)


def _stored_plan(plan: dict[str, Any], files: dict[str, list[tuple[Path, str]]] | None = None) -> dict[str, Any]:
    """The part of a plan recorded in build.json: no host paths, only what load, k8s and readers need."""
    stored = {
        "platform": plan["platform"], "model_type": plan["model_type"], "classes": plan["classes"],
        "target_neuron_config": plan["target"]["neuron_config"],
        "draft_neuron_config": plan.get("draft", {}).get("neuron_config"),
        "env": {k: v for k, v in plan["env"].items() if k != "BASE_COMPILE_WORK_DIR"},
        "expected_files": plan["expected_files"], "nxdi_versions": plan["nxdi_versions"],
        "notes": plan.get("notes", []),
    }
    if "serving" in plan and files is not None:
        stored["serving"] = {**plan["serving"], "draft_dir": DRAFT_DIR,
                             "model_files": {role: [dest for _, dest in pairs] for role, pairs in files.items()}}
    return stored


def _load_env(stored_plan: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in stored_plan.get("env", {}).items()}


@dataclass
class NeuronRunner:
    """Greedy generation on an NxDI model loaded in its own process (compile.backend.Runner)."""

    spec: BuildSpec
    description: BuildDescription
    session: IsolatedSession
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    timings: dict[str, float] = field(default_factory=dict)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None) -> Generation:
        from fusedspec.compile.neuron.device import session_generate

        eos = tuple(eos_token_ids) if eos_token_ids is not None else self.eos_token_ids
        start = time.perf_counter()
        tokens, accepted, step_seconds = self.session.call(session_generate, [list(p) for p in prompts],
                                                           max_new_tokens, list(eos), self.pad_token_id)
        if accepted is None:  # target-only reference: one token per step after the first
            accepted = [[1] * max(len(t) - 1, 0) for t in tokens]
        # decode_steps_s / decode_steps: the device step time the k advice's cost model is measured from
        return Generation(tokens=tokens, accepted=accepted,
                          timings={**self.timings, "generate_s": time.perf_counter() - start,
                                   "decode_steps_s": sum(step_seconds), "decode_steps": float(len(step_seconds))})

    def close(self) -> None:
        """Unload: ends the model's process (also done when the runner is garbage collected)."""
        self.session.close()


class NeuronBackend:
    name = "neuron"
    code_version = NEURON_CODE_VERSION

    def toolchain(self) -> dict[str, str]:
        return neuron_tc.neuron_toolchain(load_settings())

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
        # The neuron options' rules run where they are read (the run config, and translate per build).
        return model_problems(spec, target, draft)

    def dry_run(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                key: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Exactly what compile would do, as plain data; needs only both models' config and tokenizer files;
        writes nothing."""
        settings = load_settings()
        installed = installed_nxdi()
        plan = _plan(spec, target, draft, out_dir, key=key, options=options, settings=settings, installed=installed)
        toolchain = neuron_tc.neuron_toolchain(settings)
        files = served_files(target.local_dir, draft.local_dir)
        artifact_files = [*plan["expected_files"], *(dest for pairs in files.values() for _, dest in pairs),
                          BUILD_DESCRIPTION]
        return {
            "backend": self.name, "key": key, "spec": spec.to_json(), "options": options or {},
            "out_dir": str(out_dir), "sdk_present": toolchain.get(NXDI_DISTRIBUTION, ABSENT) != ABSENT,
            "toolchain": toolchain, "plan": plan,
            "served_files": {role: [dest for _, dest in pairs] for role, pairs in files.items()},
            "artifact_files": artifact_files, "files": artifact_files,
            "weights_bytes": weights_bytes(spec, read_arch(target.local_dir), read_arch(draft.local_dir)),
            "notes": plan["notes"],
            # the host's NxDI where a compile here would refuse it or go beyond the stored field lists
            "warnings": version_warnings(installed),
        }

    def compile(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                key: str, options: dict[str, Any] | None = None) -> Path:
        """Compile one fused artifact into out_dir (a fresh dir the caller renames into place). On any
        failure, a directory this call created is removed again."""
        settings = load_settings()
        installed = installed_nxdi()
        plan = _plan(spec, target, draft, out_dir, key=key, options=options, settings=settings, installed=installed)
        files = served_files(target.local_dir, draft.local_dir)
        toolchain = neuron_tc.neuron_toolchain(settings)
        _require_sdk(toolchain, installed)
        from fusedspec.compile.neuron.device import compile_plan

        out_dir = Path(out_dir)
        with _removed_on_failure(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            run_isolated(compile_plan, plan, env=plan["env"], what=f"the NxDI compile of {spec.slug} ({key[:12]})")
            missing = [f for f in plan["expected_files"] if not (out_dir / f).is_file()]
            if missing:
                raise ArtifactError(f"NxDI compile finished but {out_dir} lacks {', '.join(missing[:5])}")
            _copy_served_files(files, out_dir)
            write_build_description(out_dir, describe_build(
                spec, target, draft, key=key, backend=self, options=options,
                neuron=_stored_plan(plan, files), timings={"compile_s": time.perf_counter() - start},
            ))
        return out_dir

    def load(self, artifact_dir: Path) -> NeuronRunner:
        """A runner for a compiled artifact; refuses one whose toolchain this host does not have."""
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
                          *, key: str, options: dict[str, Any] | None = None) -> Path:
        """NxDI's target-only build with the same shapes: the on-device greedy reference for `key`."""
        settings = load_settings()
        installed = installed_nxdi()
        plan = target_only(_plan(spec, target, draft, out_dir, key=key, options=options, settings=settings,
                                 installed=installed), Path(out_dir))
        _require_sdk(neuron_tc.neuron_toolchain(settings), installed)
        from fusedspec.compile.neuron.device import compile_plan

        out_dir = Path(out_dir)
        with _removed_on_failure(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
            run_isolated(compile_plan, plan, env=plan["env"],
                         what=f"the NxDI target-only reference compile of {spec.slug} ({key[:12]})")
            write_build_description(out_dir, describe_build(
                spec, target, draft, key=key, backend=self, options=options,
                neuron=_stored_plan(plan), reference="target-only"))
        return out_dir

    def load_reference(self, reference_dir: Path) -> NeuronRunner:
        return self.load(reference_dir)

    def runtime_mismatches(self, recorded_toolchain: dict[str, str]) -> list[str]:
        return neuron_tc.runtime_mismatches(recorded_toolchain, self.toolchain())


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


def weights_bytes(spec: BuildSpec, target: ModelArch, draft: ModelArch) -> int:
    """An estimate of the bytes of the sharded checkpoints over all ranks, from both configs (for the dry run):
    NxDI pads the query heads to a multiple of TP and replicates or converts the KV heads
    (compile.neuron.heads), every rank holds the norms, and lm_head is a tensor of its own even when tied
    (cloned from embed_tokens)."""
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[spec.dtype]
    return itemsize * sum(parameters_all_ranks(arch, spec.tp_degree) for arch in (target, draft))


def parameters_all_ranks(arch: ModelArch, tp: int) -> int:
    sharded = sharded_heads(arch.num_attention_heads, arch.num_key_value_heads, tp)
    heads, kv = sharded.q_heads, sharded.kv_heads
    d, h = arch.head_dim, arch.hidden_size
    attention = h * heads * d * 2 + h * kv * d * 2 + (heads * d + 2 * kv * d if arch.attention_bias else 0)
    norms = (2 * h + (2 * d if arch.qk_norm else 0)) * tp
    layer = attention + 3 * h * arch.intermediate_size + norms
    embeddings = 2 * arch.vocab_size * h
    return arch.num_hidden_layers * layer + embeddings + h * tp


BACKEND = NeuronBackend()
