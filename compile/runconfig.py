"""The run config: one pydantic model that is both the YAML file users write and the flow's parameters.

Unknown keys are errors (never warnings), every list of the matrix is non-empty, and every value carries
its bounds and a description: Prefect turns this model into the deployment's parameter schema, so a
`speculation_length: [1]` is refused when the run is submitted, and the form shows help for each field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.neuron.options import NeuronOptions, build_problems
from fusedspec.compile.spec import MAX_BATCH, MAX_BUILDS, MAX_K, MAX_SEQ_LEN, MAX_TP, DType, explain
from fusedspec.core.errors import ConfigError

MAX_NEW_TOKENS = 4096  # validation tokens per prompt; each is a step of the artifact and of the reference
MAX_CONFIG_BYTES = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


TP = Annotated[int, Field(strict=True, ge=1, le=MAX_TP)]
SeqLen = Annotated[int, Field(strict=True, ge=2, le=MAX_SEQ_LEN)]
K = Annotated[int, Field(strict=True, ge=2, le=MAX_K)]
Batch = Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH)]


class MatrixConfig(_Strict):
    """Every combination of these lists is one build."""

    tp_degree: list[TP] = Field(min_length=1, max_length=16, description=f"tensor-parallel degrees (1..{MAX_TP})")
    seq_len: list[SeqLen] = Field(min_length=1, max_length=16,
                                  description=f"sequence lengths: prompt + generated tokens (2..{MAX_SEQ_LEN})")
    speculation_length: list[K] = Field(
        min_length=1, max_length=16,
        description=f"k in NxDI's meaning: at most k tokens per fused step (2..{MAX_K}; k=1 is plain decoding)")
    batch_size: list[Batch] = Field(default=[1], min_length=1, max_length=16,
                                    description=f"sequences served at once, continuous batching (1..{MAX_BATCH})")
    dtype: list[DType] = Field(default=["bfloat16"], min_length=1, max_length=3,
                               description="float32, bfloat16 or float16 (bf16, fp16, fp32 accepted)")

    @field_validator("tp_degree", "seq_len", "speculation_length", "batch_size", "dtype")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        if len(set(values)) != len(values):
            raise ValueError(f"{values} repeats a value (each build would be planned twice)")
        return values

    def size(self) -> int:
        return (len(self.tp_degree) * len(self.seq_len) * len(self.speculation_length) * len(self.batch_size)
                * len(self.dtype))


class ValidationConfig(_Strict):
    prompts: str = Field(default="default", min_length=1,
                         description="'default' (the shipped structured + prose set) or a .jsonl/.yaml prompt file")
    max_new_tokens: int = Field(default=32, strict=True, ge=2, le=MAX_NEW_TOKENS,
                                description="greedy tokens compared per prompt")
    near_tie_tolerance: float | None = Field(
        default=None, ge=0.0, le=10.0,
        description="logit margin up to which (inclusive) a differing token is a tolerated near-tie; null: the dtype's "
                    "default (float32 1e-4, float16 0.03, bfloat16 0.5)")
    cost_ratio: float | None = Field(default=None, gt=0, le=10.0,
                                     description="draft/target decode step cost for the k advice; null: measured")


class CompileOptions(_Strict):
    # The default since issue 14: exported programs took 79-108 s to load for a 1.5B + 0.5B pair and
    # decoded at 79% of the predicted speedup; AOTInductor packages load in ~6 s at 99.5% (bench/RESULTS.md)
    aot_inductor: bool = Field(default=True, description="cpu: package programs with AOTInductor, native code "
                               "for a portable CPU baseline (default; needs a C++ compiler; compiles 2-4x slower, "
                               "loads in seconds, decodes faster). false: torch.export programs, no compiler")
    target_alone: bool = Field(default=False, description="cpu: also export plain-greedy programs of the "
                               "target alone (the baseline a speedup is measured against)")


class PublishConfig(_Strict):
    uri: str | None = Field(default=None, min_length=1, max_length=1024,
                            description="s3://BUCKET/PREFIX or an absolute directory; null: the work dir's store "
                                        "(FUSEDSPEC_WORK_DIR/store)")
    unvalidated: bool = Field(default=False, description="publish builds that were not put through the greedy "
                              "gate (marked so in the manifest; LATEST never names them)")


class FanOutConfig(_Strict):
    """How the configs of a matrix are spread over workers."""

    mode: Literal["local", "dask", "deployment"] = Field(
        default="local", description="local threads | a Dask cluster | one compile-one flow run per config")
    max_workers: int = Field(default=1, strict=True, ge=1, le=64,
                             description="local and dask: configs compiled at once")
    dask_address: str | None = Field(default=None, description="dask: scheduler address; null starts a LocalCluster")
    deployment: str = Field(default="compile-one/local", pattern=r"^[^/\s]+/[^/\s]+$",
                            description="deployment mode: the FLOW/DEPLOYMENT run once per config")
    claim_lease_seconds: float = Field(default=120.0, ge=1.0, le=86_400.0,
                                       description="a build claim not renewed for this long is taken over")


class RunConfig(_Strict):
    target: str = Field(min_length=1, max_length=4096, description="hf://ORG/NAME[@REVISION] or a local directory")
    draft: str = Field(min_length=1, max_length=4096,
                       description="the draft, sharing the target's tokenizer: hf://ORG/NAME[@REVISION] or a directory")
    backend: str = Field(default="cpu", description="cpu (reference, runs anywhere) or neuron (NxDI on Trainium)")
    matrix: MatrixConfig
    validation: ValidationConfig = ValidationConfig()
    compile: CompileOptions = CompileOptions()
    publish: PublishConfig = PublishConfig()
    fan_out: FanOutConfig = FanOutConfig()
    neuron: NeuronOptions = Field(default=NeuronOptions(), description="backend neuron only: the NxDI settings "
                                  "every build of the matrix is compiled with (docs/trainium.md, The neuron section)")

    @field_validator("target", "draft")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("is blank; give hf://ORG/NAME[@REVISION] or a local directory")
        return text.strip()

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        from fusedspec.compile.backend import backend_names

        if name not in backend_names():
            raise ValueError(f"{name!r} is not one of {', '.join(backend_names())}")
        return name

    @field_validator("matrix")
    @classmethod
    def _bounded(cls, matrix: MatrixConfig) -> MatrixConfig:
        if matrix.size() > MAX_BUILDS:
            raise ValueError(f"{matrix.size()} builds; one run plans at most {MAX_BUILDS} (each is a compile)")
        return matrix

    @model_validator(mode="after")
    def _neuron_section_fits(self) -> RunConfig:
        """The neuron section against every build of the matrix (NxDI's bucket and node rules need the
        seq_len, k and TP of each). Settings for another backend would be silently ignored, so they are
        refused (the defaults are not: a config round-tripped through JSON carries them)."""
        if self.backend != "neuron":
            if self.neuron != NeuronOptions():
                raise ValueError(f"neuron: the neuron section applies only to backend: neuron, and this run's "
                                 f"backend is {self.backend}; remove the section or set backend: neuron")
            return self
        problems: list[str] = []
        for tp in self.matrix.tp_degree:
            for seq_len in self.matrix.seq_len:
                for k in self.matrix.speculation_length:
                    problems += [p for p in build_problems(self.neuron, tp=tp, seq_len=seq_len, k=k)
                                 if p not in problems]
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RunConfigError(ConfigError):
    """A run config that does not parse; `problems` lists each (field, value, what is wrong)."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def run_config_from_dict(data: Any, source: str = "run config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with target, draft and matrix, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(source, [explain(p) for p in describe_errors(exc)]) from None


def read_run_config_file(path: Path) -> Any:
    """The run config file's YAML, parsed but not yet checked."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path}: no such file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"run config {path}: {path.stat().st_size} bytes is not a run config")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run config {path}: not valid YAML ({exc})") from exc


def load_run_config(path: Path) -> RunConfig:
    return run_config_from_dict(read_run_config_file(path), source=str(path))
