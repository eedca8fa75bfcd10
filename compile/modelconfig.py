"""Read a checkpoint's `config.json` into the few facts a build needs, in both transformers spellings.

transformers 5.x writes `rope_parameters: {rope_theta, rope_type}` and `dtype`; 4.57 (which NxDI pins)
writes `rope_theta` and `torch_dtype`. Both are read; a missing required field is an error naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compile.errors import CheckpointError

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


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


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def arch_from_dict(cfg: dict[str, Any], source: str = "config.json") -> ModelArch:
    def need(name: str) -> Any:
        if name not in cfg or cfg[name] is None:
            raise CheckpointError(f"{source}: required field {name!r} is missing")
        return cfg[name]

    model_type = str(need("model_type"))
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    rope = cfg.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    head_dim = cfg.get("head_dim") or hidden // heads
    return ModelArch(
        model_type=model_type,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_hidden_layers=int(need("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(need("max_position_embeddings")),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3",
        torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        eos_token_id=_ids(cfg.get("eos_token_id")),
        bos_token_id=cfg.get("bos_token_id"),
    )


def read_arch(model_dir: Path) -> ModelArch:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (is this a Hugging Face checkpoint directory?)")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    return arch_from_dict(cfg, source=str(path))
