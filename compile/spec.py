"""BuildSpec: one build configuration, frozen and validated at construction, with the bounds of what a
backend can really build.

`speculation_length` is k in NxDI's meaning: at most k tokens per fused step; the draft proposes k-1
tokens and the target adds one. vLLM's `num_speculative_tokens` is passed the same k.

A value outside the bounds is a typo, not a wish, and is refused before any work: a matrix with
`tp_degree: [1048576]` would otherwise plan a million-file dry run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from fusedspec.compile.documents.base import describe_errors
from fusedspec.core.errors import ConfigError

# dtype name -> torch attribute name. Both backends know these three.
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
DTYPE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per element
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BACKEND_NAME = r"^[a-z][a-z0-9_-]{0,31}$"

MAX_TP = 128  # a trn2.48xlarge has 128 NeuronCores at LNC 1 (64 at LNC 2); the cpu backend holds every rank
MAX_BATCH = 256  # NxDI and vLLM serve at most a few hundred sequences a replica; each is a KV-cache line
MAX_SEQ_LEN = 131_072  # above every Qwen3 max_position_embeddings (40,960; 131,072 with YaRN)
MAX_K = 32  # the draft runs k times a step; acceptance stops paying long before (the advice shows it)
MAX_BUILDS = 256  # builds in one run's matrix: each is a compile of minutes to hours


def canonical_dtype(name: str) -> str:
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of {', '.join(DTYPES)} (or bf16/fp16/fp32)")
    return name


def _dtype_alias(value: Any) -> Any:
    return DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


DType = Annotated[Literal["float32", "bfloat16", "float16"], BeforeValidator(_dtype_alias)]
# The bounds of each field, shared by a BuildSpec and the run config's matrix lists (compile.runconfig)
TPDegree = Annotated[int, Field(strict=True, ge=1, le=MAX_TP)]
SeqLen = Annotated[int, Field(strict=True, ge=2, le=MAX_SEQ_LEN)]
SpeculationLength = Annotated[int, Field(strict=True, ge=2, le=MAX_K)]
BatchSize = Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH)]


class SpecFields(BaseModel):
    """The fields of a BuildSpec and their bounds (validated without raising fusedspec errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp_degree: TPDegree = Field(description="tensor-parallel degree (ranks)")
    seq_len: SeqLen = Field(description="prompt + generated tokens per sequence")
    speculation_length: SpeculationLength = Field(description="k in NxDI's meaning: at most "
                                                              "k tokens per fused step")
    batch_size: BatchSize = Field(description="sequences served at once (KV lines)")
    dtype: DType = "bfloat16"
    backend: str = Field(default="cpu", pattern=BACKEND_NAME)

    @model_validator(mode="after")
    def _k_fits(self) -> SpecFields:
        if self.speculation_length >= self.seq_len:
            raise ValueError(f"speculation_length k={self.speculation_length} must be smaller than "
                             f"seq_len={self.seq_len}")
        return self


class BuildSpec(SpecFields):
    """One build: tp, seq_len, k, batch, dtype, backend. Positional or keyword construction; a bad value
    is a ConfigError naming every problem."""

    def __init__(self, tp_degree: Any = None, seq_len: Any = None, speculation_length: Any = None,
                 batch_size: Any = None, dtype: Any = "bfloat16", backend: Any = "cpu", **extra: Any) -> None:
        fields = {"tp_degree": tp_degree, "seq_len": seq_len, "speculation_length": speculation_length,
                  "batch_size": batch_size, "dtype": dtype, "backend": backend, **extra}
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise ConfigError("invalid build spec: " + "; ".join(_messages(exc))) from None

    @property
    def k(self) -> int:
        return self.speculation_length

    @property
    def slug(self) -> str:
        """The readable config path in stores: `tp2-seq256-k4-bs1-float32`."""
        return f"tp{self.tp_degree}-seq{self.seq_len}-k{self.k}-bs{self.batch_size}-{self.dtype}"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_json(cls, data: Any) -> BuildSpec:
        if not isinstance(data, dict):
            raise ConfigError(f"build spec: expected an object with tp_degree, seq_len, ..., got {data!r}")
        return cls(**data)


def spec_problems(**fields: Any) -> list[str]:
    """Every problem the spec made of `fields` has on its own (no model looked at). Empty when fine."""
    try:
        SpecFields.model_validate(fields)
    except ValidationError as exc:
        return _messages(exc)
    return []


def _messages(exc: ValidationError) -> list[str]:
    return [explain(p) for p in describe_errors(exc)]


def explain(problem: str) -> str:
    """A problem sentence with its reason where one helps: k=1 is plain decoding, not speculation."""
    if "speculation_length" in problem and "greater than or equal to 2" in problem:
        return problem + " (k=1 is plain decoding: k must be at least 2)"
    return problem
