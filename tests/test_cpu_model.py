"""The decoder and NxDI's sharding rules, eagerly (no export): logits equal Hugging Face's for Qwen3,
Qwen2 (q/k/v bias, untied lm_head) and Llama (o_proj bias) at TP degrees that split, replicate and pad."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusedspec.compile.cpu.checkpoint import load_checkpoint
from fusedspec.compile.cpu.model import Decoder, new_caches
from fusedspec.compile.cpu.sharding import ShardPlan, shard_rank, stack_ranks
from fusedspec.compile.modelconfig import arch_from_dict, read_arch
from fusedspec.core.errors import ConfigError

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
             rope_theta=10000.0, initializer_range=0.3, bos_token_id=None, eos_token_id=2)
FAMILIES = {
    "qwen3": dict(tie_word_embeddings=True),
    "qwen2": dict(tie_word_embeddings=False),
    "llama": dict(tie_word_embeddings=False, attention_bias=True, num_key_value_heads=4),
}


@pytest.fixture(scope="module")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    out = {}
    for family, extra in FAMILIES.items():
        config = AutoConfig.for_model(family, **{**SMALL, **extra})
        torch.manual_seed(7)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        out[family] = (path, model)
    return out


def eager_logits(model_dir: Path, tp: int, tokens: list[int], split_at: int | None = None) -> torch.Tensor:
    """Logits [Q, vocab] of our decoder at TP `tp`; with `split_at`, a prefill then one token at a time
    through the KV cache."""
    arch = read_arch(model_dir)
    plan = ShardPlan.for_arch(arch, tp)
    full = load_checkpoint(model_dir, torch.float32, arch)
    weights = stack_ranks([{"m." + n: t for n, t in shard_rank(full, plan, r).items()} for r in range(tp)])
    decoder = Decoder(arch, plan, "m.")
    k_cache, v_cache = new_caches(arch, plan, 1, 64, torch.float32)
    ids = torch.tensor([tokens])
    chunks = [(0, len(tokens))] if split_at is None else [(0, split_at)] + [
        (i, i + 1) for i in range(split_at, len(tokens))]
    outs = []
    with torch.no_grad():
        for start, end in chunks:
            hidden = decoder.forward(weights, ids[:, start:end], torch.arange(start, end)[None], k_cache,
                                     v_cache)
            outs.append(decoder.logits(weights, hidden)[0])
    return torch.cat(outs)


TOKENS = [5, 77, 300, 12, 9, 411, 42, 42, 7, 128, 256, 3]


@pytest.mark.parametrize("family, tp", [("qwen3", 1), ("qwen3", 2), ("qwen3", 4), ("qwen3", 8),
                                        ("qwen2", 2), ("qwen2", 4), ("llama", 2), ("llama", 4)])
def test_sharded_logits_equal_hugging_face(family: str, tp: int,
                                           small_models: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    path, model = small_models[family]
    with torch.no_grad():
        want = model(torch.tensor([TOKENS])).logits[0]
    got = eager_logits(path, tp, TOKENS)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_decoding_through_the_cache_equals_one_pass(
        small_models: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    path, _ = small_models["qwen3"]
    torch.testing.assert_close(eager_logits(path, 4, TOKENS, split_at=5), eager_logits(path, 4, TOKENS),
                               atol=1e-5, rtol=1e-5)


def test_a_wrong_rank_shard_changes_the_logits(small_models: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    path, _ = small_models["qwen3"]
    arch = read_arch(path)
    plan = ShardPlan.for_arch(arch, 2)
    full = load_checkpoint(path, torch.float32, arch)
    shards = [shard_rank(full, plan, r) for r in range(2)]
    shards[1]["layers.1.mlp.down_proj.weight"] = shards[1]["layers.1.mlp.down_proj.weight"] * 0
    weights = stack_ranks(shards)
    k_cache, v_cache = new_caches(arch, plan, 1, 64, torch.float32)
    decoder = Decoder(arch, plan, "")
    hidden = decoder.forward(weights, torch.tensor([TOKENS]), torch.arange(len(TOKENS))[None], k_cache,
                             v_cache)
    assert not torch.allclose(decoder.logits(weights, hidden)[0], eager_logits(path, 2, TOKENS), atol=1e-3)


def _arch(heads: int, kv: int) -> object:
    return arch_from_dict({"model_type": "qwen3", "vocab_size": 8, "hidden_size": heads * 8,
                           "intermediate_size": 30, "num_hidden_layers": 1, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "head_dim": 8, "max_position_embeddings": 64})


@pytest.mark.parametrize("heads, kv, tp, padded, per_rank, kv_per_rank, strategy", [
    (4, 2, 1, 4, 4, 2, "split"),
    (14, 2, 2, 14, 7, 1, "split"),       # Qwen2.5-0.5B at TP 2
    (4, 2, 4, 4, 1, 1, "replicate"),
    (4, 2, 8, 8, 1, 1, "replicate"),     # 4 padding heads
    (64, 8, 32, 64, 2, 1, "replicate"),  # Qwen3-32B at TP 32 (the AWS sample)
    (6, 2, 4, 8, 2, 1, "replicate"),     # padded 6 -> 8, each KV group 3 -> 4
])
def test_shard_plans_follow_nxdi(heads: int, kv: int, tp: int, padded: int, per_rank: int, kv_per_rank: int,
                                 strategy: str) -> None:
    plan = ShardPlan.for_arch(_arch(heads, kv), tp)  # type: ignore[arg-type]
    assert (plan.padded_heads, plan.heads_per_rank, plan.kv_heads_per_rank) == (padded, per_rank, kv_per_rank)
    assert plan.describe()["kv_strategy"] == strategy
    sources = plan.padded_q_sources()
    assert sorted(s for s in sources if s is not None) == list(range(heads))  # every real head exactly once
    group = heads // kv
    for rank in range(tp):  # a rank's Q heads only read the KV heads that rank holds
        kv_heads = plan.kv_sources(rank)
        for i, source in enumerate(plan.q_sources(rank)):
            if source is not None:
                assert source // group == kv_heads[i // plan.q_per_kv]
    assert plan.padded_intermediate % tp == 0


def test_a_tp_that_fits_neither_head_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="tp_degree=3 cannot shard 4 attention heads / 2 KV heads"):
        ShardPlan.for_arch(_arch(4, 2), 3)  # type: ignore[arg-type]


def test_bfloat16_is_best_effort_close_to_hugging_face(
        small_models: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    """bfloat16 rounds differently from HF's bf16 kernels, so only closeness is promised, not equality."""
    from transformers import AutoModelForCausalLM

    path, _ = small_models["qwen3"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    arch = read_arch(path)
    plan = ShardPlan.for_arch(arch, 2)
    full = load_checkpoint(path, torch.bfloat16, arch)
    weights = stack_ranks([shard_rank(full, plan, r) for r in range(2)])
    k_cache, v_cache = new_caches(arch, plan, 1, 64, torch.bfloat16)
    decoder = Decoder(arch, plan, "")
    with torch.no_grad():
        hidden = decoder.forward(weights, torch.tensor([TOKENS]), torch.arange(len(TOKENS))[None], k_cache,
                                 v_cache)
        got = decoder.logits(weights, hidden)[0].float()
        want = model(torch.tensor([TOKENS])).logits[0].float()
    assert hidden.dtype == torch.bfloat16 and weights["layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    assert (got - want).abs().max() < 0.1 * want.abs().max()
