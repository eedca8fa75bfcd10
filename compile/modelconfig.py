"""Read a checkpoint's `config.json` into the few facts a build needs, in both transformers spellings.

transformers 5.x writes `rope_parameters: {rope_theta, rope_type}` and `dtype`; 4.57 (which NxDI pins)
writes `rope_theta` and `torch_dtype`. Both are read. The file is untrusted input: every field a build
uses is type- and range-checked here, and a bad one is a CheckpointError naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.model_files import read_json_object
from fusedspec.core.errors import CheckpointError

MAX_MODEL_CONFIG_BYTES = 4 << 20  # a config.json is a few kB


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2 family)
    qk_norm: bool  # RMSNorm on q and k before RoPE (Qwen3)
    torch_dtype: str | None
    eos_token_id: tuple[int, ...]
    bos_token_id: int | None

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["eos_token_id"] = list(self.eos_token_id)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelArch:
        return cls(**{**data, "eos_token_id": tuple(data["eos_token_id"])})


class RopeParameters(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    rope_theta: float | None = Field(default=None, gt=0)


class ConfigFile(BaseModel):
    """The fields of a Hugging Face `config.json` a build reads, with the bounds of a real decoder."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # an infinite rope_theta is no model

    model_type: str = Field(min_length=1, max_length=64)
    vocab_size: int = Field(strict=True, ge=1, le=1 << 21)
    hidden_size: int = Field(strict=True, ge=1, le=1 << 16)
    intermediate_size: int = Field(strict=True, ge=1, le=1 << 20)
    num_hidden_layers: int = Field(strict=True, ge=1, le=1024)
    num_attention_heads: int = Field(strict=True, ge=1, le=1024)
    num_key_value_heads: int | None = Field(default=None, strict=True, ge=1, le=1024)
    head_dim: int | None = Field(default=None, strict=True, ge=1, le=1024)
    max_position_embeddings: int = Field(strict=True, ge=1, le=1 << 24)
    rms_norm_eps: float = Field(default=1e-6, gt=0, lt=1)
    rope_theta: float | None = Field(default=None, gt=0)
    rope_parameters: RopeParameters | None = None
    rope_scaling: RopeParameters | None = None  # transformers 4.x's name for rope_parameters
    tie_word_embeddings: bool = Field(default=False, strict=True)
    attention_bias: bool | None = Field(default=None, strict=True)
    dtype: str | None = None
    torch_dtype: str | None = None
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None

    @model_validator(mode="after")
    def _heads_fit(self) -> ConfigFile:
        kv = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={kv}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads="
                             f"{self.num_attention_heads} and no head_dim is given")
        return self

    def arch(self) -> ModelArch:
        heads = self.num_attention_heads
        rope = self.rope_parameters.rope_theta if self.rope_parameters is not None else None
        eos = self.eos_token_id
        return ModelArch(
            model_type=self.model_type, vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=heads, num_key_value_heads=self.num_key_value_heads or heads,
            head_dim=self.head_dim or self.hidden_size // heads,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=float(rope or self.rope_theta or 10000.0),
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=(self.attention_bias if self.attention_bias is not None
                            else self.model_type == "qwen2"),
            qk_norm=self.model_type == "qwen3", torch_dtype=self.dtype or self.torch_dtype,
            eos_token_id=() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos),
            bos_token_id=self.bos_token_id,
        )


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint's config.json, parsed once: the facts a build reads (`arch`), and every other field as
    written (`other`), with the RoPE parameters beyond rope_theta under one name, `rope_parameters`,
    whichever spelling the file used (the graph key takes all of them: compile/content_key.py)."""

    arch: ModelArch
    other: Mapping[str, Any] = field(default_factory=dict)


def _rope_extras(parsed: ConfigFile) -> dict[str, Any]:
    """rope_parameters (5.x) or rope_scaling (4.x) without rope_theta (in ModelArch) and without the default
    rope_type, which means the same as none; 4.x's `type` is rope_type's older name."""
    merged: dict[str, Any] = {}
    for found in (parsed.rope_scaling, parsed.rope_parameters):
        if found is not None:
            merged |= found.model_dump(exclude={"rope_theta"}, exclude_none=True)  # extras included
    if "type" in merged and "rope_type" not in merged:
        merged["rope_type"] = merged.pop("type")
    if merged.get("rope_type") == "default":
        del merged["rope_type"]
    return dict(sorted(merged.items()))


def config_from_dict(cfg: Any, source: str = "config.json") -> ModelConfig:
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(cfg).__name__}; "
                              "fix the checkpoint's config.json")
    try:
        parsed = ConfigFile.model_validate(cfg)
    except ValidationError as exc:
        problems = describe_errors(exc)
        raise CheckpointError(f"{source}: {'; '.join(problems[:4])}; fix the checkpoint's config.json "
                              "(it must describe a real decoder)") from None
    other = dict(parsed.model_extra or {})
    rope = _rope_extras(parsed)
    if rope:
        other["rope_parameters"] = rope
    return ModelConfig(arch=parsed.arch(), other=dict(sorted(other.items())))


def arch_from_dict(cfg: Any, source: str = "config.json") -> ModelArch:
    return config_from_dict(cfg, source).arch


def read_config(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json as a JSON object (for the few readers that need raw fields: RoPE)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (is this a Hugging Face checkpoint directory?)")
    return read_json_object(path, "fix the checkpoint's config.json", MAX_MODEL_CONFIG_BYTES)


def read_model_config(model_dir: Path) -> ModelConfig:
    return config_from_dict(read_config(model_dir), source=str(Path(model_dir) / "config.json"))


def read_arch(model_dir: Path) -> ModelArch:
    return read_model_config(model_dir).arch
