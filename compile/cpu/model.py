"""A compact decoder (Qwen3; Qwen2/2.5 and Llama differ only by q/k/v bias and q/k norm) computed
from rank shards, with a static KV cache per (layer, rank) written in place.

The decoder owns no weights: every call gets the list of rank dicts (one per
`weights/tp{r}_sharded_checkpoint.safetensors`), so the same code serves eager tests and programs
exported without weights. Each layer loops over ranks, computes that rank's partial output from that
rank's shard only, and sums the partials (NxDI's all-reduce), so a wrong shard changes the result.
Replicated tensors are read from rank 0 outside the per-rank loops; the runner checks at load that
every rank holds the same copy.

Numerics follow Hugging Face's float32 path (RMSNorm in float32, RoPE tables in float32, softmax in
float32) so greedy tokens match `generate(do_sample=False)` exactly. No data-dependent Python control
flow: positions are tensors, masking is `torch.where`, cache writes are `scatter_`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compile.cpu.sharding import ShardPlan
from compile.modelconfig import ModelArch

Shards = list[dict[str, torch.Tensor]]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, Q, head_dim] for positions [B, Q] (default RoPE, computed in float32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)  # [head_dim/2]
    freqs = positions.float()[..., None] * inv_freq  # [B, Q, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, Q, head_dim]
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, Q, head_dim] rotated by the tables (rotate-half convention, as Hugging Face)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def cache_shape(arch: ModelArch, plan: ShardPlan, batch: int, cache_len: int) -> tuple[int, int, int, int]:
    """Shape of one (layer, rank) K or V cache: [batch, kv_heads_per_rank, cache_len, head_dim]."""
    return (batch, plan.kv_heads_per_rank, cache_len, arch.head_dim)


def new_caches(arch: ModelArch, plan: ShardPlan, batch: int, cache_len: int, dtype: torch.dtype
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed K and V caches, one tensor per (layer, rank), index = layer * tp + rank."""
    shape = cache_shape(arch, plan, batch, cache_len)
    count = arch.num_hidden_layers * plan.tp
    return ([torch.zeros(shape, dtype=dtype) for _ in range(count)],
            [torch.zeros(shape, dtype=dtype) for _ in range(count)])


@dataclass(frozen=True)
class Decoder:
    """One model (target or draft) inside a program: static facts only, weights come per call."""

    arch: ModelArch
    plan: ShardPlan
    prefix: str  # "target_model." or "draft_model."

    def w(self, shards: Shards, rank: int, name: str) -> torch.Tensor:
        return shards[rank][self.prefix + name]

    def has(self, shards: Shards, name: str) -> bool:
        return self.prefix + name in shards[0]

    def embed(self, shards: Shards, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, Q] -> hidden [B, Q, hidden]. Ids past this model's vocabulary (a draft with a
        smaller embedding than the target's) are clamped: the target verifies every proposal anyway."""
        tokens = tokens.clamp(max=self.arch.vocab_size - 1)
        return F.embedding(tokens, self.w(shards, 0, "embed_tokens.weight"))

    def forward(self, shards: Shards, tokens: torch.Tensor, positions: torch.Tensor,
                k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> torch.Tensor:
        """Run tokens [B, Q] at positions [B, Q]; write their K/V into the caches at those positions;
        attend to every cached position <= the query's own. Returns final-normed hidden [B, Q, hidden]."""
        arch = self.arch
        h = self.embed(shards, tokens)
        cos, sin = rope_tables(positions, arch.head_dim, arch.rope_theta, h.dtype)
        cache_len = k_caches[0].shape[2]
        # visible[b, q, s]: key slot s is at or before query q's position (causal, and hides stale slots)
        visible = torch.arange(cache_len)[None, None, :] <= positions[:, :, None]  # [B, Q, S]
        for layer in range(arch.num_hidden_layers):
            attn = [self._attention(shards, rank, layer, h, positions, cos, sin, visible,
                                    k_caches[layer * self.plan.tp + rank], v_caches[layer * self.plan.tp + rank])
                    for rank in range(self.plan.tp)]
            h = h + torch.stack(attn).sum(0)  # the all-reduce over ranks
            o_bias = f"layers.{layer}.self_attn.o_proj.bias"
            if self.has(shards, o_bias):
                h = h + self.w(shards, 0, o_bias)
            mlp = [self._mlp(shards, rank, layer, h) for rank in range(self.plan.tp)]
            h = h + torch.stack(mlp).sum(0)
        return rms_norm(h, self.w(shards, 0, "norm.weight"), arch.rms_norm_eps)

    def logits(self, shards: Shards, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, Q, hidden] -> logits [B, Q, vocab]."""
        name = "embed_tokens.weight" if self.arch.tie_word_embeddings else "lm_head.weight"
        return hidden @ self.w(shards, 0, name).t()

    def _attention(self, shards: Shards, rank: int, layer: int, h: torch.Tensor, positions: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """This rank's partial attention output [B, Q, hidden] (before the sum over ranks)."""
        arch, plan = self.arch, self.plan
        p = f"layers.{layer}."
        batch, q_len, _ = h.shape
        hd, hq, hkv = arch.head_dim, plan.heads_per_rank, plan.kv_heads_per_rank
        x = rms_norm(h, self.w(shards, rank, p + "input_layernorm.weight"), arch.rms_norm_eps)

        def proj(name: str, heads: int) -> torch.Tensor:
            bias_name = p + f"self_attn.{name}.bias"
            bias = self.w(shards, rank, bias_name) if self.has(shards, bias_name) else None
            out = F.linear(x, self.w(shards, rank, p + f"self_attn.{name}.weight"), bias)
            return out.view(batch, q_len, heads, hd)  # [B, Q, heads, hd]

        q, k, v = proj("q_proj", hq), proj("k_proj", hkv), proj("v_proj", hkv)
        if arch.qk_norm:  # Qwen3: RMSNorm over head_dim on q and k, before RoPE
            q = rms_norm(q, self.w(shards, rank, p + "self_attn.q_norm.weight"), arch.rms_norm_eps)
            k = rms_norm(k, self.w(shards, rank, p + "self_attn.k_norm.weight"), arch.rms_norm_eps)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, hq, Q, hd]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, hkv, Q, hd]
        v = v.transpose(1, 2)  # [B, hkv, Q, hd]

        slots = positions[:, None, :, None].expand(batch, hkv, q_len, hd)  # [B, hkv, Q, hd]
        k_cache.scatter_(2, slots, k)
        v_cache.scatter_(2, slots, v)

        # GQA: local Q head i reads local KV head i // q_per_kv
        q = q.reshape(batch, hkv, plan.q_per_kv, q_len, hd)  # [B, hkv, g, Q, hd]
        scores = q @ k_cache[:, :, None].transpose(-1, -2) * hd ** -0.5  # [B, hkv, g, Q, S]
        scores = torch.where(visible[:, None, None], scores, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = probs @ v_cache[:, :, None]  # [B, hkv, g, Q, hd]
        out = out.reshape(batch, hq, q_len, hd).transpose(1, 2).reshape(batch, q_len, hq * hd)
        return F.linear(out, self.w(shards, rank, p + "self_attn.o_proj.weight"))

    def _mlp(self, shards: Shards, rank: int, layer: int, h: torch.Tensor) -> torch.Tensor:
        """This rank's partial MLP output [B, Q, hidden]."""
        p = f"layers.{layer}."
        x = rms_norm(h, self.w(shards, rank, p + "post_attention_layernorm.weight"), self.arch.rms_norm_eps)
        gate = F.linear(x, self.w(shards, rank, p + "mlp.gate_proj.weight"))
        up = F.linear(x, self.w(shards, rank, p + "mlp.up_proj.weight"))
        return F.linear(F.silu(gate) * up, self.w(shards, rank, p + "mlp.down_proj.weight"))
