"""The backend interface every compiler implements, and how one is chosen by name.

    backend.compile(spec, target, draft, out_dir, key=..., options=...) -> artifact dir
    backend.load(artifact_dir) -> Runner
    runner.generate(prompts, max_new_tokens) -> Generation (tokens, accepted-per-step)

An artifact directory always holds `build.json` (written last by `write_build_description`), which
says what was built: key, spec, models, toolchain, options. A directory without it is not an artifact.
Backends are imported lazily so that nothing Neuron- or torch-specific loads unless it is used.
Besides `cpu` and `neuron`, backends can be plugged in by module (Settings.backend_plugins, from
FUSEDSPEC_BACKEND_PLUGINS): the tests register one that injects faults, so no production code path
carries a test seam.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fusedspec.compile.documents.build import BUILD_DESCRIPTION, BuildDescription
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError, ConfigError

__all__ = ["BUILD_DESCRIPTION", "Backend", "BuildDescription", "Generation", "Runner", "backend_names",
           "describe_build", "get_backend", "read_build_description", "write_build_description"]


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


class Runner(Protocol):
    spec: BuildSpec
    description: BuildDescription

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_token_ids: Sequence[int] | None = None
    ) -> Generation: ...


class Backend(Protocol):
    name: str
    code_version: str

    def toolchain(self) -> dict[str, str]: ...

    def check(self, spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]: ...

    def compile(
        self,
        spec: BuildSpec,
        target: ResolvedModel,
        draft: ResolvedModel,
        out_dir: Path,
        *,
        key: str,
        options: dict[str, Any] | None = None,
    ) -> Path: ...

    def load(self, artifact_dir: Path) -> Runner: ...

    def runtime_mismatches(self, recorded_toolchain: dict[str, str]) -> list[str]: ...


_BUILTIN = {"cpu": "fusedspec.compile.cpu.backend", "neuron": "fusedspec.compile.neuron.backend"}


def _modules() -> dict[str, str]:
    from fusedspec.core.settings import load_settings

    return {**_BUILTIN, **dict(load_settings().backend_plugins)}


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
        raise ConfigError(f"FUSEDSPEC_BACKEND_PLUGINS: backend {name!r} is module {modules[name]!r}, which cannot "
                          f"be imported ({exc}); fix the name or install the module") from None
    if not hasattr(module, "BACKEND"):
        raise ConfigError(f"FUSEDSPEC_BACKEND_PLUGINS: module {modules[name]!r} (backend {name!r}) defines no BACKEND")
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


def describe_build(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, *, key: str, backend: Backend,
                   options: dict[str, Any] | None, **sections: Any) -> BuildDescription:
    """build.json for a build; `sections` are the backend's own (`cpu=...`, `neuron=...`, `timings=...`)."""
    return BuildDescription(key=key, backend=backend.name, spec=spec, target=target.record(),
                            draft=draft.record(), toolchain=backend.toolchain(), code_version=backend.code_version,
                            options=options or {}, **sections)


def write_build_description(artifact_dir: Path, description: BuildDescription) -> None:
    description.write(Path(artifact_dir) / BUILD_DESCRIPTION)
