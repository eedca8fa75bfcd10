"""Read a Hugging Face safetensors checkpoint into full tensors, checked against its config.

Promises: every tensor the decoder needs is present with the shape the config implies, or a
CheckpointError names the tensor and both shapes; tied embeddings need no `lm_head`; Qwen2's q/k/v
biases are read when the config says so; only the default RoPE is accepted (other scalings would
silently change the output); a truncated or unreadable file, and a tensor holding NaN or infinity, are
CheckpointErrors naming the file and the tensor (a NaN weight would otherwise compile and fail the gate
deep inside a comparison). Names come back without the leading `model.` (see sharding.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from fusedspec.compile.modelconfig import ModelArch, ModelConfig
from fusedspec.compile.safetensors_header import describe_safetensors_error
from fusedspec.core.errors import CheckpointError, InputError

# Rope types whose cos/sin equal the plain inverse-frequency tables (model.py computes only those).
DEFAULT_ROPE_TYPES = (None, "default")


def expected_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the decoder reads, for this config."""
    hidden, hd = arch.hidden_size, arch.head_dim
    q_out, kv_out = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (arch.vocab_size, hidden),
        "norm.weight": (hidden,),
    }
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    for i in range(arch.num_hidden_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_out, hidden),
            p + "self_attn.k_proj.weight": (kv_out, hidden),
            p + "self_attn.v_proj.weight": (kv_out, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_out),
            p + "mlp.gate_proj.weight": (arch.intermediate_size, hidden),
            p + "mlp.up_proj.weight": (arch.intermediate_size, hidden),
            p + "mlp.down_proj.weight": (hidden, arch.intermediate_size),
        }
        if arch.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                       p + "self_attn.v_proj.bias": (kv_out,)}
        if arch.attention_bias and arch.model_type == "llama":  # Llama's attention_bias covers o_proj too
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if arch.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


@contextmanager
def open_safetensors(path: Path, error: type[InputError] = CheckpointError,
                     fix: str = "re-download or re-convert the checkpoint") -> Iterator[Any]:
    """`safe_open` of `path`, with a truncated or malformed file (and any tensor read from it that does
    not fit the file) reported as `error` naming the file."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            yield handle
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise error(f"{path}: {describe_safetensors_error(Path(path), exc)}: {fix}") from None


def read_tensor(handle: Any, name: str, path: Path, error: type[InputError] = CheckpointError,
                fix: str = "re-download or re-convert the checkpoint") -> torch.Tensor:
    """One tensor, refused when it holds NaN or infinity (a finite model never does)."""
    tensor = handle.get_tensor(name)
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise error(f"{path}: tensor {name!r} holds {bad} NaN or infinite value(s); {fix}")
    return tensor


def check_rope(model_dir: Path, config: ModelConfig) -> None:
    """CheckpointError unless the model's RoPE (its parsed config.json, `config`) is the default one."""
    # rope_parameters (5.x) or rope_scaling (4.x), under one name as modelconfig reads them
    rope_type = (config.other.get("rope_parameters") or {}).get("rope_type")
    if rope_type not in DEFAULT_ROPE_TYPES:
        raise CheckpointError(
            f"{model_dir}/config.json: rope type {rope_type!r} is not supported by the cpu backend "
            "(only the default RoPE); remove the scaling or use the neuron backend"
        )


def weight_files(model_dir: Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{model_dir}: no *.safetensors files (the cpu backend reads safetensors checkpoints only; "
            "convert .bin/.gguf weights with save_pretrained(safe_serialization=True))"
        )
    return files


def _hf_name(stored: str) -> str:
    return stored[len("model."):] if stored.startswith("model.") else stored


def load_checkpoint(model_dir: Path, dtype: torch.dtype, arch: ModelArch) -> dict[str, torch.Tensor]:
    """Every tensor the decoder of `arch` (the model's parsed config) needs, in `dtype`, keyed by name
    without `model.`.

    Shapes are checked from the file headers before any tensor is read, so a mismatched checkpoint
    fails in a second without loading gigabytes.
    """
    model_dir = Path(model_dir)
    expected = expected_shapes(arch)
    where: dict[str, tuple[Path, str]] = {}
    for path in weight_files(model_dir):
        with open_safetensors(path) as f:
            for stored in f.keys():
                name = _hf_name(stored)
                if name not in expected:
                    continue  # tied lm_head copies, rotary caches, ...: not read
                shape = tuple(f.get_slice(stored).get_shape())
                want = expected[name]
                if shape != want:
                    raise CheckpointError(
                        f"{path.name}: tensor {stored!r} has shape {list(shape)} but "
                        f"{model_dir.name}/config.json implies {list(want)}; the checkpoint does not match "
                        "its config"
                    )
                where[name] = (path, stored)
    missing = [n for n in expected if n not in where]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(
            f"{model_dir}: tensor(s) "
            f"{', '.join('model.' + m if m != 'lm_head.weight' else m for m in missing[:3])}{more} required "
            f"by config.json (model_type={arch.model_type}, {arch.num_hidden_layers} layers, "
            f"tie_word_embeddings={arch.tie_word_embeddings}) are missing"
        )
    _check_extra_layers(model_dir, arch)
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name, (path, stored) in where.items():
        by_file.setdefault(path, []).append((name, stored))
    for path, names in by_file.items():
        with open_safetensors(path) as f:
            for name, stored in names:
                tensors[name] = read_tensor(f, stored, path).to(dtype)
    return tensors


def _check_extra_layers(model_dir: Path, arch: ModelArch) -> None:
    """A checkpoint with more layers than its config would be silently truncated: refuse it."""
    for path in weight_files(model_dir):
        with open_safetensors(path) as f:
            for stored in f.keys():
                parts = _hf_name(stored).split(".")
                if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() \
                        and int(parts[1]) >= arch.num_hidden_layers:
                    raise CheckpointError(
                        f"{path.name}: tensor {stored!r} belongs to layer {parts[1]} but config.json says "
                        f"num_hidden_layers={arch.num_hidden_layers}; the checkpoint does not match its "
                        "config"
                    )
