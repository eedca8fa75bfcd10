"""The graph key: every config field that can change a compiled program changes it, nothing else does.

The fields come from real configs: the one transformers 5.x writes for the tiny Qwen3 fixture, and the
Hub configs of Qwen3 (transformers 4.51 spelling), Qwen2.5 and Llama 3, each field changed on its own.
A field left out must name its reason in compile/content_key.py's LEFT_OUT, and changing every left-out field
at once must leave the exported programs identical (the direction that would reuse a wrong program).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fusedspec.compile.content_key import LEFT_OUT, ROPE_TYPES_READING_MAX_POSITIONS, build_keys
from fusedspec.compile.modelconfig import config_from_dict
from fusedspec.compile.modelref import ResolvedModel, parse_model_ref
from fusedspec.compile.spec import BuildSpec

SPEC = BuildSpec(2, 128, 4, 1, "float32", "cpu")
TOOLCHAIN = {"torch": "2.13.0", "python": "3.11"}

QWEN3_4X = {  # Qwen/Qwen3-1.7B's config.json as the Hub serves it (transformers 4.51 wrote it)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN2 = {  # Qwen2.5-Coder-1.5B-Instruct
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02,
    "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
LLAMA = {  # Llama-3.2-1B
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 128256,
}


def _model(weights: str = "1") -> ResolvedModel:
    return ResolvedModel(ref=parse_model_ref("hf://Qwen/X@main"), commit="a" * 40, local_dir=Path("/x"),
                         file_hashes={"model.safetensors": "sha256:" + weights, "config.json": "sha256:c"})


def _keys(config: dict[str, Any], **change: Any) -> Any:
    args: dict[str, Any] = {"spec": SPEC, "target": _model(), "draft": _model("2"),
                            "target_config": config_from_dict(config),
                            "draft_config": config_from_dict(QWEN3_4X), "toolchain": TOOLCHAIN,
                            "code_version": "src-1", "options": {"aot_inductor": True}}
    args.update(change)
    return build_keys(**args)


def _changed(value: Any) -> Any:
    """Another value of the same kind, valid for a config (so the config still parses)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2
    if isinstance(value, float):
        return value * 2 if value else 0.1
    if isinstance(value, str):
        return (value + "-other" if value not in ("qwen3", "qwen2", "llama")
                else {"qwen3": "qwen2"}.get(value, "qwen3"))
    if isinstance(value, list):
        return [*value, value[-1] if value else 1]
    if isinstance(value, dict):
        return {**value, "factor": 2.0 * float(value.get("factor", 1.0))}
    return 7  # None: a set value


def _tiny_config(tiny_target: Path) -> dict[str, Any]:
    return json.loads((tiny_target / "config.json").read_text())


def _real_configs(tiny_target: Path) -> dict[str, dict[str, Any]]:
    return {"qwen3 (5.x)": _tiny_config(tiny_target), "qwen3 (4.x)": QWEN3_4X, "qwen2.5": QWEN2,
            "llama3": LLAMA}


def test_every_field_of_real_configs_changes_the_graph_key_unless_left_out_for_a_reason(
        tiny_target: Path) -> None:
    seen_in, seen_out = set(), set()
    for name, config in _real_configs(tiny_target).items():
        base = _keys(config)
        for field, value in config.items():
            if field in ("num_attention_heads", "num_key_value_heads"):  # must stay divisible: change both
                other = {**config, "num_attention_heads": config["num_attention_heads"] * 2,
                         "num_key_value_heads": config["num_key_value_heads"] * 2}
            elif field in ("rope_scaling", "rope_parameters") and value is None:
                other = {**config, field: {"rope_type": "linear", "factor": 2.0}}
            else:
                other = {**config, field: _changed(value)}
            keys = _keys(other)
            if field in LEFT_OUT:
                assert keys.graph == base.graph, f"{name}: {field} is left out but changed the graph key"
                seen_out.add(field)
            else:
                assert keys.graph != base.graph, f"{name}: {field} changes the model but not the graph key"
                seen_in.add(field)
    assert all(len(reason) > 20 for reason in LEFT_OUT.values())
    # what the printout of this test would show a reviewer: the fields in, and the fields out with why
    assert {"hidden_size", "rope_theta", "tie_word_embeddings", "vocab_size", "hidden_act", "sliding_window",
            "rope_scaling", "layer_types", "mlp_bias"} <= seen_in
    assert {"eos_token_id", "torch_dtype", "dtype", "max_position_embeddings",
            "transformers_version"} <= seen_out


def test_rope_and_dtype_spellings_of_transformers_4_and_5_give_one_graph_key() -> None:
    five = {k: v for k, v in QWEN3_4X.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    five |= {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "dtype": "bfloat16",
             "transformers_version": "5.24.0"}
    assert _keys(five).graph == _keys(QWEN3_4X).graph
    yarn = {**five, "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}}
    assert _keys(yarn).graph != _keys(five).graph


def test_max_position_embeddings_is_in_the_graph_key_when_the_rope_type_reads_it() -> None:
    """NxDI builds llama RoPE scaling other than llama3 with transformers' LlamaRotaryEmbedding, whose
    dynamic, yarn and longrope frequencies are computed from max_position_embeddings; llama3's are not."""
    longer = {"max_position_embeddings": 2 * LLAMA["max_position_embeddings"]}
    for rope_type in ROPE_TYPES_READING_MAX_POSITIONS:
        scaled = {**LLAMA, "rope_scaling": {"rope_type": rope_type, "factor": 4.0,
                                            "original_max_position_embeddings": 8192}}
        assert _keys(scaled).graph != _keys({**scaled, **longer}).graph, rope_type
    assert _keys(LLAMA).graph == _keys({**LLAMA, **longer}).graph


def test_the_draft_spec_toolchain_code_and_options_change_the_graph_key_weights_do_not() -> None:
    base = _keys(QWEN3_4X)
    for change in ({"draft_config": config_from_dict({**QWEN3_4X, "num_hidden_layers": 14})},
                   {"spec": BuildSpec(2, 128, 5, 1, "float32", "cpu")},
                   {"spec": BuildSpec(2, 256, 4, 1, "float32", "cpu")},
                   {"spec": BuildSpec(2, 128, 4, 1, "bfloat16", "cpu")},
                   {"toolchain": {**TOOLCHAIN, "torch": "2.14.0"}},
                   {"code_version": "src-2"}, {"options": {"aot_inductor": True, "target_alone": True}}):
        keys = _keys(QWEN3_4X, **change)
        assert keys.graph != base.graph and keys.version != base.version, change
        assert keys.weights == base.weights, change
    new_weights = _keys(QWEN3_4X, target=_model("3"))
    assert new_weights.graph == base.graph
    assert new_weights.weights != base.weights and new_weights.version != base.version
    assert _keys(QWEN3_4X, options={"aot_inductor": True, "target_alone": False}) == base  # false = unset


@pytest.mark.parametrize("program", ["context_encoding", "fused_step"])
def test_the_left_out_fields_leave_the_exported_program_as_it_was(program: str, tiny_target: Path) -> None:
    """Every left-out field changed at once: the exported graph is the same program, so reusing it is
    right."""
    import torch

    from fusedspec.compile.cpu.export import export_program
    from fusedspec.compile.cpu.layout import rank_shapes
    from fusedspec.compile.cpu.model import Decoder
    from fusedspec.compile.cpu.sharding import ShardPlan, stack_ranks

    config = _tiny_config(tiny_target)
    other = {**config, **{field: _changed(config[field]) for field in LEFT_OUT if field in config},
             "_name_or_path": "/elsewhere", "max_position_embeddings": 4096, "bos_token_id": 1,
             "torch_dtype": "float16"}
    codes = []
    for cfg in (config, other):
        arch = config_from_dict(cfg).arch
        target = Decoder(arch, ShardPlan.for_arch(arch, 1), "target_model.")
        draft = Decoder(arch, ShardPlan.for_arch(arch, 1), "draft_model.")
        shapes = rank_shapes(target) | rank_shapes(draft)
        weights = stack_ranks([{name: torch.zeros(shape) for name, shape in sorted(shapes.items())}])
        exported = export_program(program, target, draft, weights, k=3, batch=1, context_len=16, cache_len=35,
                                  dtype=torch.float32)
        codes.append(exported.graph_module.code)
    assert codes[0] == codes[1]


def test_keys_are_stable_across_processes() -> None:
    code = "from tests.test_graph_key import QWEN3_4X, _keys; print(_keys(QWEN3_4X))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == str(_keys(QWEN3_4X))
