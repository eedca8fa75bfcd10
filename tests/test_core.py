"""The shared vocabulary: model references, model configs in both spellings, specs, matrices, keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fusedspec.compile.content_key import content_key
from fusedspec.compile.matrix import plan_matrix
from fusedspec.compile.modelconfig import arch_from_dict
from fusedspec.compile.modelref import ResolvedModel, parse_model_ref
from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError, MatrixError, ModelRefError

QWEN3_32B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 25600,
             "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 40960, "rope_theta": 1000000, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False}
QWEN3_1_7B = {**QWEN3_32B, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
              "num_attention_heads": 16, "tie_word_embeddings": True}


@pytest.mark.parametrize("text, repo, rev", [
    ("hf://Qwen/Qwen3-32B@main", "Qwen/Qwen3-32B", "main"),
    ("hf://Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B", None),
    ("hf://Qwen/Qwen3-1.7B@" + "a" * 40, "Qwen/Qwen3-1.7B", "a" * 40),
])
def test_hub_refs_parse(text: str, repo: str, rev: str | None) -> None:
    ref = parse_model_ref(text)
    assert (ref.repo_id, ref.revision, ref.is_hub) == (repo, rev, True)


@pytest.mark.parametrize("text, words", [
    ("hf://Qwen/../etc", "'..'"),
    ("hf://Qwen//x", "empty"),
    ("hf://Qwen", "exactly one '/'"),
    ("hf:///abs/path", "absolute"),
    ("s3://bucket/model", "unknown scheme"),
    ("/no/such/dir/anywhere", "no such local directory"),
    ("hf://Qwen/Qwen3@", "revision"),
    ("hf://Qwen/Qwen3@../x", "revision"),
])
def test_bad_refs_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ModelRefError, match=words.replace("(", r"\(")):
        parse_model_ref(text)


def test_config_read_in_both_transformers_spellings() -> None:
    v4 = arch_from_dict({**QWEN3_32B, "rope_theta": 1e6, "torch_dtype": "bfloat16"})
    v5 = dict(QWEN3_32B)
    del v5["rope_theta"], v5["torch_dtype"]
    v5.update(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, dtype="bfloat16")
    assert arch_from_dict(v5) == v4
    assert v4.rope_theta == 1e6 and v4.torch_dtype == "bfloat16" and v4.qk_norm


def test_spec_rejects_impossible_values() -> None:
    with pytest.raises(ConfigError, match="at least 2"):
        BuildSpec(tp_degree=1, seq_len=128, speculation_length=1, batch_size=1)
    with pytest.raises(ConfigError, match="smaller than seq_len"):
        BuildSpec(tp_degree=1, seq_len=8, speculation_length=8, batch_size=1)


def _config(**matrix: object) -> dict:
    base = {"tp_degree": [32], "seq_len": [1024], "speculation_length": [7], "batch_size": [4],
            "dtype": ["bfloat16"]}
    base.update(matrix)
    return {"target": "hf://Qwen/Qwen3-32B", "draft": "hf://Qwen/Qwen3-1.7B", "backend": "neuron",
            "matrix": base}


def test_a_config_names_every_value_out_of_bounds_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        run_config_from_dict(_config(tp_degree=[1048576], speculation_length=[1, 7], batch_size=[0]))
    for words in ("tp_degree.0=1048576", "speculation_length.0=1", "batch_size.0=0"):
        assert words in str(info.value)
    assert info.value.exit_code == 2


def test_matrix_reports_every_problem_with_the_models_at_once() -> None:
    cfg = run_config_from_dict(_config(tp_degree=[3, 32], seq_len=[50000, 1024]))
    with pytest.raises(MatrixError) as info:
        plan_matrix(cfg.matrix, "cpu", arch_from_dict(QWEN3_32B), arch_from_dict(QWEN3_1_7B))
    text = "\n".join(info.value.problems)
    for words in ("tp_degree=3", "seq_len=50000"):
        assert words in text
    assert info.value.exit_code == 2
    # NxDI shards a TP that fits neither KV-head count by converting to MHA: the neuron matrix keeps it.
    with pytest.raises(MatrixError) as info:
        plan_matrix(cfg.matrix, "neuron", arch_from_dict(QWEN3_32B), arch_from_dict(QWEN3_1_7B))
    assert "tp_degree=3" not in "\n".join(info.value.problems)


def test_run_config_rejects_unknown_keys_and_empty_lists() -> None:
    with pytest.raises(ConfigError, match="colour"):
        run_config_from_dict({**_config(), "colour": "red"})
    with pytest.raises(ConfigError, match="matrix.tp_degree"):
        run_config_from_dict(_config(tp_degree=[]))


def _model(commit: str, weights: str) -> ResolvedModel:
    return ResolvedModel(ref=parse_model_ref("hf://Qwen/X@main"), commit=commit, local_dir=Path("/x"),
                         file_hashes={"model.safetensors": "sha256:" + weights})


def _key(**change: object) -> str:
    args: dict = {"spec": BuildSpec(32, 1024, 7, 4, "bfloat16", "neuron"), "target": _model("a" * 40, "1"),
                  "draft": _model("b" * 40, "2"), "toolchain": {"neuronx-cc": "2.21"}, "code_version": "1"}
    args.update(change)
    return content_key(**args)


def test_content_key_changes_with_every_input_and_nothing_else() -> None:
    base = _key()
    changed = [
        _key(spec=BuildSpec(32, 1024, 5, 4, "bfloat16", "neuron")),
        _key(target=_model("c" * 40, "1")),
        _key(draft=_model("b" * 40, "3")),
        _key(toolchain={"neuronx-cc": "2.22"}),
        _key(code_version="2"),
        _key(options={"aot_inductor": True}),
    ]
    assert len({base, *changed}) == len(changed) + 1
    moved = ResolvedModel(ref=parse_model_ref("hf://Qwen/Renamed"), commit="a" * 40, local_dir=Path("/y"),
                          file_hashes={"model.safetensors": "sha256:1"})
    assert _key(target=moved) == base


def test_content_key_is_stable_across_processes() -> None:
    code = ("from tests.test_core import _key; print(_key())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == _key()
    json.dumps(_key())
