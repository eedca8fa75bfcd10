"""BACKEND: the `neuron` backend (compile.backend.Backend, plus dry_run and runtime_mismatches).

    dry_run(spec, target, draft, out_dir, key=, options=)  -> what compile would do, as plain data; any host
    compile(...)                                          -> NxDI compile on a host with the Neuron SDK
    load(artifact_dir)                                    -> a Runner doing greedy fused generation
    compile_reference(...) / load_reference(...)          -> NxDI's target-only build, the second greedy reference
    runtime_mismatches(recorded_toolchain)                -> why this host cannot serve an artifact ([] if it can)

Without the SDK, compile and load raise InputError pointing at --dry-run; nothing is ever faked.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compile.backend import (
    BUILD_DESCRIPTION,
    BuildDescription,
    Generation,
    describe_build,
    read_build_description,
    write_build_description,
)
from compile.errors import ArtifactError, InputError
from compile.modelconfig import ModelArch, read_arch
from compile.modelref import ResolvedModel
from compile.neuron import toolchain as neuron_tc
from compile.neuron.fields import check_nxdi_version
from compile.neuron.translate import parse_options, target_only, translate, translation_problems
from compile.settings import Settings, load_settings
from compile.spec import BuildSpec
from compile.toolchain import ABSENT, NEURON_CODE_VERSION

NXDI_DISTRIBUTION = "neuronx-distributed-inference"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "generation_config.json")


def compile_work_dir(settings: Settings, key: str) -> Path:
    return settings.work_dir / "neuron-compile" / key


def _plan(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *, key: str,
          options: dict[str, Any] | None, settings: Settings) -> dict[str, Any]:
    return translate(
        spec, read_arch(target.local_dir), read_arch(draft.local_dir),
        target_path=target.local_dir, draft_path=draft.local_dir, compiled_model_path=Path(out_dir),
        compile_work_dir=compile_work_dir(settings, key), options=options,
        neuron_cc_flags=settings.neuron_cc_flags,
    )


def _sdk_problem(toolchain: dict[str, str]) -> str | None:
    """Why compile/load cannot run here (from distribution metadata, no import), or None."""
    if toolchain.get(NXDI_DISTRIBUTION, ABSENT) == ABSENT:
        from compile.neuron.device import SDK_MISSING

        return SDK_MISSING
    return None


def _require_sdk(toolchain: dict[str, str]) -> None:
    """InputError unless the real Neuron SDK is importable here. Checked before anything is written."""
    problem = _sdk_problem(toolchain)
    if problem:
        raise InputError(problem)
    from compile.neuron.device import require_sdk

    require_sdk()  # a same-named placeholder package is installed but cannot be imported


def _copy_tokenizer(source: Path, out_dir: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out_dir / name)
            copied.append(name)
    if "tokenizer.json" not in copied and "vocab.json" not in copied:
        raise ArtifactError(f"{source}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}); a serving pod "
                            "needs the target's tokenizer beside the compiled model")
    return copied


def _stored_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The part of a plan recorded in build.json: no host paths, only what load and readers need."""
    return {
        "platform": plan["platform"], "model_type": plan["model_type"], "classes": plan["classes"],
        "target_neuron_config": plan["target"]["neuron_config"],
        "draft_neuron_config": plan.get("draft", {}).get("neuron_config"),
        "env": {k: v for k, v in plan["env"].items() if k != "BASE_COMPILE_WORK_DIR"},
        "expected_files": plan["expected_files"], "nxdi_versions": plan["nxdi_versions"],
    }


@dataclass
class NeuronRunner:
    """Greedy generation on a loaded NxDI model (compile.backend.Runner)."""

    spec: BuildSpec
    description: BuildDescription
    model: Any
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    timings: dict[str, float] = field(default_factory=dict)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None) -> Generation:
        from compile.neuron.device import greedy_generate

        eos = tuple(eos_token_ids) if eos_token_ids is not None else self.eos_token_ids
        start = time.perf_counter()
        tokens, accepted = greedy_generate(self.model, prompts, max_new_tokens, eos, self.pad_token_id)
        if accepted is None:  # target-only reference: one token per step after the first
            accepted = [[1] * max(len(t) - 1, 0) for t in tokens]
        return Generation(tokens=tokens, accepted=accepted,
                          timings={**self.timings, "generate_s": time.perf_counter() - start})


class NeuronBackend:
    name = "neuron"
    code_version = NEURON_CODE_VERSION

    def toolchain(self) -> dict[str, str]:
        return neuron_tc.neuron_toolchain(load_settings())

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
        return translation_problems(spec, target, draft, parse_options(None))

    def dry_run(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                key: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Exactly what compile would do, as plain data; needs only both config.json files; writes nothing."""
        settings = load_settings()
        plan = _plan(spec, target, draft, out_dir, key=key, options=options, settings=settings)
        toolchain = neuron_tc.neuron_toolchain(settings)
        tokenizer = [n for n in TOKENIZER_FILES if (target.local_dir / n).is_file()]
        return {
            "backend": self.name, "key": key, "spec": spec.to_json(), "options": options or {},
            "out_dir": str(out_dir), "sdk_present": _sdk_problem(toolchain) is None, "toolchain": toolchain,
            "plan": plan,
            "artifact_files": [*plan["expected_files"], *tokenizer, BUILD_DESCRIPTION],
        }

    def compile(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                key: str, options: dict[str, Any] | None = None) -> Path:
        """Compile one fused artifact into out_dir (a fresh dir the caller renames into place)."""
        settings = load_settings()
        plan = _plan(spec, target, draft, out_dir, key=key, options=options, settings=settings)
        toolchain = neuron_tc.neuron_toolchain(settings)
        _require_sdk(toolchain)
        check_nxdi_version(toolchain[NXDI_DISTRIBUTION])
        from compile.neuron.device import compile_plan

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        compile_plan(plan)
        missing = [f for f in plan["expected_files"] if not (Path(out_dir) / f).is_file()]
        if missing:
            raise ArtifactError(f"NxDI compile finished but {out_dir} lacks {', '.join(missing[:5])}")
        _copy_tokenizer(target.local_dir, Path(out_dir))
        write_build_description(Path(out_dir), describe_build(
            spec, target, draft, key=key, backend=self, options=options,
            neuron=_stored_plan(plan), timings={"compile_s": time.perf_counter() - start},
        ))
        return Path(out_dir)

    def load(self, artifact_dir: Path) -> NeuronRunner:
        """A runner for a compiled artifact; refuses one whose toolchain this host does not have."""
        description = read_build_description(artifact_dir)
        if description.neuron is None:
            raise ArtifactError(f"{artifact_dir}: built by the {description.backend!r} backend, not neuron")
        _require_sdk(self.toolchain())
        mismatches = self.runtime_mismatches(description.toolchain)
        if mismatches:
            raise ArtifactError(f"{artifact_dir} cannot be served on this host: " + "; ".join(mismatches))
        from compile.neuron.device import load_compiled

        start = time.perf_counter()
        model = load_compiled(Path(artifact_dir), description.neuron)
        eos = model.config.eos_token_id
        eos_ids = (eos,) if isinstance(eos, int) else tuple(eos or ())
        pad = getattr(model.config, "pad_token_id", None)
        return NeuronRunner(spec=description.spec, description=description,
                            model=model, eos_token_ids=eos_ids,
                            pad_token_id=pad if pad is not None else (eos_ids[0] if eos_ids else 0),
                            timings={"load_s": time.perf_counter() - start})

    def compile_reference(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path,
                          *, key: str, options: dict[str, Any] | None = None) -> Path:
        """NxDI's target-only build with the same shapes: the on-device greedy reference for `key`."""
        settings = load_settings()
        plan = target_only(_plan(spec, target, draft, out_dir, key=key, options=options, settings=settings),
                           Path(out_dir))
        toolchain = neuron_tc.neuron_toolchain(settings)
        _require_sdk(toolchain)
        check_nxdi_version(toolchain[NXDI_DISTRIBUTION])
        from compile.neuron.device import compile_plan

        compile_plan(plan)
        write_build_description(Path(out_dir), describe_build(
            spec, target, draft, key=key, backend=self, options=options,
            neuron=_stored_plan(plan), reference="target-only"))
        return Path(out_dir)

    def load_reference(self, reference_dir: Path) -> NeuronRunner:
        return self.load(reference_dir)

    def runtime_mismatches(self, recorded_toolchain: dict[str, str]) -> list[str]:
        return neuron_tc.runtime_mismatches(recorded_toolchain, self.toolchain())


BACKEND = NeuronBackend()
