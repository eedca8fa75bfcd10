"""BuildSpec: one build configuration, frozen and validated at construction.

`speculation_length` is k in NxDI's meaning: at most k tokens per fused step; the draft proposes k-1
tokens and the target adds one. vLLM's `num_speculative_tokens` is passed the same k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compile.errors import ConfigError

# dtype name -> torch attribute name. Both backends know these three.
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BACKENDS = ("cpu", "neuron")


def canonical_dtype(name: str) -> str:
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of {', '.join(DTYPES)} (or bf16/fp16/fp32)")
    return name


@dataclass(frozen=True)
class BuildSpec:
    tp_degree: int
    seq_len: int
    speculation_length: int
    batch_size: int
    dtype: str = "bfloat16"
    backend: str = "cpu"

    def __post_init__(self) -> None:
        problems = spec_problems(self)
        if problems:
            raise ConfigError("invalid build spec: " + "; ".join(problems))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def k(self) -> int:
        return self.speculation_length

    @property
    def slug(self) -> str:
        """The readable config path in stores: `tp2-seq256-k4-bs1-float32`."""
        return f"tp{self.tp_degree}-seq{self.seq_len}-k{self.k}-bs{self.batch_size}-{self.dtype}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildSpec:
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"build spec {data!r}: {exc}") from exc


def spec_problems(spec: BuildSpec) -> list[str]:
    """Problems a spec has on its own, without looking at any model. Empty when fine."""
    problems: list[str] = []
    for name in ("tp_degree", "seq_len", "speculation_length", "batch_size"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name}={value!r} must be a positive integer")
    k, seq = spec.speculation_length, spec.seq_len
    if isinstance(k, int) and isinstance(seq, int):
        if k < 2:
            problems.append(f"speculation_length k={k} must be at least 2 (k=1 is plain decoding)")
        elif k >= seq:
            problems.append(f"speculation_length k={k} must be smaller than seq_len={seq}")
    if DTYPE_ALIASES.get(spec.dtype, spec.dtype) not in DTYPES:
        problems.append(f"dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
    if spec.backend not in BACKENDS:
        problems.append(f"backend {spec.backend!r} is not one of {', '.join(BACKENDS)}")
    return problems
