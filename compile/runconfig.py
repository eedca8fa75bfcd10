"""The run config: one pydantic model that is both the YAML file users write and the flow's parameters.

Unknown keys are errors (never warnings), and every list of the matrix must be non-empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from compile.errors import ConfigError
from compile.spec import canonical_dtype


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MatrixConfig(_Strict):
    tp_degree: list[int] = Field(min_length=1)
    seq_len: list[int] = Field(min_length=1)
    speculation_length: list[int] = Field(min_length=1, description="k in NxDI's meaning")
    batch_size: list[int] = Field(default=[1], min_length=1)
    dtype: list[str] = Field(default=["bfloat16"], min_length=1)

    @field_validator("dtype")
    @classmethod
    def _known_dtypes(cls, values: list[str]) -> list[str]:
        return [canonical_dtype(v) for v in values]


class ValidationConfig(_Strict):
    prompts: str = "default"  # "default" (the shipped set) or a path to a JSONL/YAML prompt file
    max_new_tokens: int = Field(default=32, ge=1)
    near_tie_tolerance: float | None = Field(default=None, ge=0.0, description="None: the dtype's default")
    enabled: bool = True
    cost_ratio: float | None = Field(default=None, gt=0,
                                     description="draft/target step cost for the k advice; None: measured here")


class CompileOptions(_Strict):
    aot_inductor: bool = False  # cpu backend: package programs with AOTInductor (slower compile, faster run)
    target_alone: bool = False  # cpu backend: also export plain-greedy programs of the target alone


class PublishConfig(_Strict):
    uri: str = "./artifacts"


class FanOutConfig(_Strict):
    """How the configs of a matrix are spread over workers."""

    mode: Literal["local", "dask", "deployment"] = "local"
    max_workers: int = Field(default=1, ge=1, description="local: configs compiled at once in this process")
    dask_address: str | None = Field(default=None, description="dask: scheduler address; None starts a LocalCluster")
    deployment: str = Field(default="compile-one/local", description="deployment: one flow run per config")
    claim_lease_seconds: float = Field(default=120.0, gt=0,
                                       description="a build claim not renewed for this long is taken over")


class RunConfig(_Strict):
    target: str
    draft: str
    backend: Literal["cpu", "neuron"] = "cpu"
    matrix: MatrixConfig
    validation: ValidationConfig = ValidationConfig()
    compile: CompileOptions = CompileOptions()
    publish: PublishConfig = PublishConfig()
    fan_out: FanOutConfig = FanOutConfig()


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def run_config_from_dict(data: Any, source: str = "run config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with target, draft and matrix, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc


def load_run_config(path: Path) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"run config {path}: not valid YAML ({exc})") from exc
    return run_config_from_dict(data, source=str(path))
