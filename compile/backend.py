"""The backend contract: what every compiler implements, what a loaded artifact offers, and how a
backend is chosen by name.

    backend.compile(spec, target, draft, out_dir, keys=..., options=..., programs=...) -> artifact dir
    backend.load(artifact_dir, trust) -> Runner   (trust: compile.trust, what the bytes are checked against)
    runner.generate(prompts, max_new_tokens) -> Generation (tokens, accepted-per-step, timings)
    runner.batcher() -> Batcher      continuous batching over the runner's cache lines (a server's loop)

Validation and serving call a runner through `Runner` and `Batcher` alone, never a backend module, so
a backend says what it can do (`target_alone`, `continuous_batching`) instead of being probed for it.
An artifact directory always holds `build.json` (written last by `write_build_description`), which
says what was built: keys, spec, models, toolchain, options, program files. A directory without it is not
an artifact. Given `programs` (the compiled programs of the build's graph key, from the work dir's program
cache), a backend compiles nothing: it writes the weights and links those program files in.
Backends are imported lazily so that nothing Neuron- or torch-specific loads unless it is used.
Besides `cpu` and `neuron`, backends can be plugged in by module (core.settings.backend_plugins, from
FUSEDSPEC_BACKEND_PLUGINS): the tests register one that injects faults, so no production code path
carries a test seam.
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from fusedspec.compile.content_key import BuildKeys, recorded_options
from fusedspec.compile.documents.build import BUILD_DESCRIPTION, BuildDescription
from fusedspec.compile.documents.validation import StepTimesRecord
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, ConfigError

__all__ = ["BUILD_DESCRIPTION", "DECODE_STEPS", "DECODE_STEPS_S", "Backend", "Batcher", "BuildDescription",
           "Completion", "Generation", "LineEvent", "ProgramSource", "Runner", "StepReport", "backend_names",
           "describe_build", "get_backend", "read_build_description", "write_build_description"]

# Generation.timings keys every runner reports: the decode steps of one generate call (fused, or the
# target's alone), the context encoding excluded, and their seconds. A backend may add its own keys.
DECODE_STEPS = "decode_steps"
DECODE_STEPS_S = "decode_steps_s"


@dataclass(frozen=True)
class ProgramSource:
    """Compiled programs of a build's graph key, to be linked into a new artifact instead of compiled."""

    directory: Path  # holds each file at its path inside an artifact (a program cache entry)
    files: tuple[str, ...]
    origin: str  # what build.json records as programs_from


@dataclass
class Generation:
    """Greedy output of a runner for a list of prompts (token ids).

    tokens[i]: the new tokens of prompt i (prompt excluded), ending at EOS (included) or the length limit.
    accepted[i]: for each fused step that advanced prompt i, how many tokens it accepted (1..k).
    The context-encoding step's first token is not a fused step and is not counted in `accepted`.
    """

    tokens: list[list[int]]
    accepted: list[list[int]]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return [len(a) for a in self.accepted]


FinishReason = Literal["eos", "length", "cancelled"]


@dataclass(frozen=True)
class Completion:
    """A request that ended: every token it produced (the first from context encoding) and the tokens
    each step gave it (`accepted`, as in Generation). line is None for a request cancelled while it was
    still waiting."""

    request_id: Hashable
    line: int | None
    tokens: tuple[int, ...]
    accepted: tuple[int, ...]
    reason: FinishReason


@dataclass(frozen=True)
class LineEvent:
    """New tokens one request got from one call: its first token (prefill=True, from the context
    encoding that admitted it), or what one step accepted for its line. `completion` is set when this
    event ended the request (its line is already free)."""

    request_id: Hashable
    line: int
    tokens: tuple[int, ...]
    prefill: bool
    completion: Completion | None = None


@dataclass(frozen=True)
class StepReport:
    """What one `Batcher.step()` did. step_s is 0.0 and `decoded` empty when no line was decoding."""

    admitted: tuple[LineEvent, ...]  # one per context encoding, in admission order
    decoded: tuple[LineEvent, ...]  # one per line the step advanced, by line
    prefill_s: float  # seconds spent in this call's context encodings
    step_s: float  # seconds of the one fused (or target-alone) step over all lines
    active: int  # lines decoding after this call
    waiting: int  # requests queued after this call

    @property
    def events(self) -> tuple[LineEvent, ...]:
        return self.admitted + self.decoded

    @property
    def completions(self) -> list[Completion]:
        return [event.completion for event in self.events if event.completion is not None]

    @property
    def accepted(self) -> dict[int, int]:
        """Tokens the step gave each line it advanced (1..k; fewer only where a request ended)."""
        return {event.line: len(event.tokens) for event in self.decoded}


class Batcher(Protocol):
    """Continuous batching over a runner's B cache lines, driven from one thread: requests are queued,
    each step admits queued requests into free lines and then advances every decoding line at once.
    Its refusals are PromptErrors (a request the artifact cannot run, a full queue)."""

    lines: int

    @property
    def idle(self) -> bool:
        """Nothing decoding and nothing queued."""
        ...

    @property
    def active_lines(self) -> list[int]: ...

    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int,
               eos_token_ids: Sequence[int] | None = None, *, request_id: Hashable | None = None) -> Hashable:
        """Check a request and queue it (eos_token_ids None: the target's own); returns its id."""
        ...

    def step(self) -> StepReport: ...

    def cancel(self, request_id: Hashable) -> Completion:
        """End a request wherever it is; its line (or queue place) is free again."""
        ...


class Runner(Protocol):
    """A loaded artifact: everything validation and serving call on it.

    `target_alone`: generate(speculate=False) runs the target alone through the same weights, and
    `step_times` can time the artifact's steps apart. `continuous_batching`: `batcher()` drives the
    runner's cache lines (else it raises ArtifactError, and so does generate(speculate=False) without
    `target_alone`)."""

    spec: BuildSpec
    description: BuildDescription

    @property
    def lines(self) -> int:
        """Cache lines: requests that decode at once (the compiled batch size)."""
        ...

    @property
    def target_alone(self) -> bool: ...

    @property
    def continuous_batching(self) -> bool: ...

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None, *, speculate: bool = True) -> Generation: ...

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """PromptError unless the artifact can generate max_new_tokens after this prompt; any thread."""
        ...

    def target_eos(self) -> frozenset[int]:
        """The target's EOS ids: what ends a generation unless its caller gives others."""
        ...

    def batcher(self, *, speculate: bool = True, max_waiting: int | None = None) -> Batcher: ...

    def step_times(self) -> StepTimesRecord | None:
        """Seconds per call of the artifact's own target step, target verify at k and fused step, timed
        here; None when they cannot be timed apart (no target-alone programs, or one device graph)."""
        ...


class Backend(Protocol):
    name: str
    code_version: str

    @property
    def k_sweep_note(self) -> str | None:
        """What builds of different k share, said in the plan of a run with several k;
        None: nothing to say."""
        ...

    def toolchain(self) -> dict[str, str]: ...

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]: ...

    def compile(
        self,
        spec: BuildSpec,
        target: ResolvedModel,
        draft: ResolvedModel,
        out_dir: Path,
        *,
        keys: BuildKeys,
        options: dict[str, Any] | None = None,
        programs: ProgramSource | None = None,
    ) -> Path: ...

    def dry_run(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                reuse_programs: bool = False) -> dict[str, Any]:
        """What compile would do, as plain data; reads the models' config files only, writes nothing.
        `reuse_programs`: the programs of the build's graph key will be linked in, not compiled."""
        ...

    def load(self, artifact_dir: Path, trust: LoadTrust | None = None) -> Runner:
        """The loaded artifact. `trust` (compile.trust) is what the loader may believe about its bytes: every
        file it reads is checked against it, and native code is refused unless it allows it."""
        ...

    def runtime_mismatches(self, recorded_toolchain: dict[str, str]) -> list[str]: ...

    def build_options(self, requested: dict[str, Any]) -> dict[str, Any]:
        """What compile is given for the run config's options for this backend (RunConfig.backend_options),
        filled in for this host; the build keys hold them but for compile.content_key's unkeyed ones."""
        ...

    def host_problems(self, requested: dict[str, Any]) -> list[str]:
        """Why this host cannot build with the run config's options for this backend (empty when it can)."""
        ...

    def stated_step_bytes(self, arch: ModelArch, spec: BuildSpec) -> float | None:
        """Bytes one rank reads in one decode step, when the k advice's cost model is stated from them
        instead of measured on this host (decode is memory-bound on hardware this host is not); None:
        measured here."""
        ...


_BUILTIN = {"cpu": "fusedspec.compile.cpu.backend", "neuron": "fusedspec.compile.neuron.backend"}


def _modules() -> dict[str, str]:
    from fusedspec.core.settings import backend_plugins

    return {**_BUILTIN, **dict(backend_plugins())}


def backend_names() -> list[str]:
    return list(_modules())


def get_backend(name: str) -> Backend:
    modules = _modules()
    if name not in modules:
        raise ConfigError(f"backend {name!r} is not one of {', '.join(modules)}")
    try:
        module = importlib.import_module(modules[name])
    except ImportError as exc:
        if name in _BUILTIN:
            raise  # our own code: a broken install, not the user's input
        raise ConfigError(f"FUSEDSPEC_BACKEND_PLUGINS: backend {name!r} is module {modules[name]!r}, which "
                          f"cannot be imported ({exc}); fix the name or install the module") from None
    if not hasattr(module, "BACKEND"):
        raise ConfigError(f"FUSEDSPEC_BACKEND_PLUGINS: module {modules[name]!r} "
                          f"(backend {name!r}) defines no BACKEND")
    return module.BACKEND  # type: ignore[no-any-return]


def read_build_description(artifact_dir: Path) -> BuildDescription:
    """The artifact's build.json, or ArtifactError saying why the directory is not a complete artifact."""
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise ArtifactError(f"{artifact_dir}: no such artifact directory")
    if not (artifact_dir / BUILD_DESCRIPTION).is_file():
        raise ArtifactError(f"{artifact_dir}: no {BUILD_DESCRIPTION}; this is not a fusedspec artifact "
                            "(build one with `fusedspec compile CONFIG`)")
    return BuildDescription.read(artifact_dir / BUILD_DESCRIPTION)


def describe_build(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, *, keys: BuildKeys,
                   backend: Backend, options: dict[str, Any] | None, programs: list[str],
                   programs_from: ProgramSource | None, **sections: Any) -> BuildDescription:
    """build.json for a build; `sections` are the backend's own (`cpu=...`, `neuron=...`, `timings=...`)."""
    return BuildDescription(key=keys.version, graph_key=keys.graph, weight_key=keys.weights,
                            backend=backend.name, spec=spec, target=target.record(), draft=draft.record(),
                            toolchain=backend.toolchain(), code_version=backend.code_version,
                            options=recorded_options(options), programs=sorted(programs),
                            programs_from="compiled" if programs_from is None else programs_from.origin,
                            **sections)


def write_build_description(artifact_dir: Path, description: BuildDescription) -> None:
    description.write(Path(artifact_dir) / BUILD_DESCRIPTION)
