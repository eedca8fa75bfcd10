"""The backend interface every compiler implements, and how one is chosen by name.

    backend.compile(spec, target, draft, out_dir, key=..., options=...) -> artifact dir
    backend.load(artifact_dir) -> Runner
    runner.generate(prompts, max_new_tokens) -> Generation (tokens, accepted-per-step)

An artifact directory always holds `build.json` (written last by `write_build_description`), which
says what was built: key, spec, models, toolchain, files. A directory without it is not an artifact.
Backends are imported lazily so that nothing Neuron- or torch-specific loads unless it is used.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from compile.errors import ArtifactError, ConfigError
from compile.modelconfig import ModelArch
from compile.modelref import ResolvedModel
from compile.spec import BuildSpec

BUILD_DESCRIPTION = "build.json"


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
    description: dict[str, Any]

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


_BACKENDS = {"cpu": "compile.cpu.backend", "neuron": "compile.neuron.backend"}


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS:
        raise ConfigError(f"backend {name!r} is not one of {', '.join(_BACKENDS)}")
    module = importlib.import_module(_BACKENDS[name])
    return module.BACKEND  # type: ignore[no-any-return]


def read_build_description(artifact_dir: Path) -> dict[str, Any]:
    path = Path(artifact_dir) / BUILD_DESCRIPTION
    if not Path(artifact_dir).is_dir():
        raise ArtifactError(f"{artifact_dir}: no such artifact directory")
    if not path.is_file():
        raise ArtifactError(
            f"{artifact_dir}: no {BUILD_DESCRIPTION}; this is not a fusedspec artifact "
            "(build one with `fusedspec compile CONFIG`)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    for field_name in ("key", "spec", "backend", "target", "draft"):
        if field_name not in data:
            raise ArtifactError(f"{path}: field {field_name!r} is missing")
    return data  # type: ignore[no-any-return]


def describe_build(
    spec: BuildSpec,
    target: ResolvedModel,
    draft: ResolvedModel,
    *,
    key: str,
    backend: Backend,
    options: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "key": key,
        "backend": backend.name,
        "spec": spec.to_json(),
        "target": {"ref": target.ref.text, **target.identity()},
        "draft": {"ref": draft.ref.text, **draft.identity()},
        "toolchain": backend.toolchain(),
        "code_version": backend.code_version,
        "options": options or {},
        **(extra or {}),
    }


def write_build_description(artifact_dir: Path, description: dict[str, Any]) -> None:
    tmp = Path(artifact_dir) / (BUILD_DESCRIPTION + ".tmp")
    tmp.write_text(json.dumps(description, indent=2, sort_keys=True))
    tmp.replace(Path(artifact_dir) / BUILD_DESCRIPTION)
