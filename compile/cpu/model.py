"""A compact decoder (Qwen3; Qwen2/2.5 and Llama differ only by q/k/v bias and q/k norm) computed
rank by rank from tensor-parallel shards, with a static KV cache per layer written in place.

The decoder owns no weights: every call gets a `Weights` dict built from the artifact's rank files.
Sharded tensors are stacked along a leading rank dimension ([tp, ...], rank r's slice is exactly the
tensor of `weights/tp{r}_sharded_checkpoint.safetensors`); replicated ones (norms) appear once.
Every layer computes each rank's partial output from that rank's slice only ([tp, B, Q, hidden]) and
sums over the rank dimension (NxDI's all-reduce); the vocab-parallel embedding sums each rank's rows
(zero for ids it does not hold), and logits concatenate each rank's vocabulary slice (all-gather).
So a wrong shard changes the result. Batching the ranks instead of unrolling a Python loop over them keeps
the exported graph a fraction of the size (it loads and runs faster) with the same arithmetic.

Numerics follow Hugging Face's float32 path (RMSNorm in float32, RoPE tables in float32, softmax in
float32) so greedy tokens match `generate(do_sample=False)` exactly. No data-dependent Python control
flow: positions are tensors, masking is `torch.where`, cache writes are `scatter_`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusedspec.compile.cpu.sharding import ShardPlan
from fusedspec.compile.modelconfig import ModelArch

Weights = dict[str, torch.Tensor]  # prefixed names; sharded tensors carry a leading [tp] dimension


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


def cache_shape(arch: ModelArch, plan: ShardPlan, batch: int, cache_len: int) -> tuple[int, ...]:
    """Shape of one layer's K or V cache: [tp, batch, kv_heads_per_rank, cache_len, head_dim]."""
    return (plan.tp, batch, plan.kv_heads_per_rank, cache_len, arch.head_dim)


def new_caches(arch: ModelArch, plan: ShardPlan, batch: int, cache_len: int, dtype: torch.dtype
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed K and V caches, one tensor per layer."""
    shape = cache_shape(arch, plan, batch, cache_len)
    return ([torch.zeros(shape, dtype=dtype) for _ in range(arch.num_hidden_layers)],
            [torch.zeros(shape, dtype=dtype) for _ in range(arch.num_hidden_layers)])


def column_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, Q, in] (replicated) times each rank's rows weight [tp, out, in] -> [tp, B, Q, out]."""
    tp, batch, q_len = weight.shape[0], x.shape[0], x.shape[1]
    # bmm over ranks with rows flattened: broadcasting a 4-d matmul would copy the weight per row
    out = torch.bmm(x.reshape(1, batch * q_len, -1).expand(tp, -1, -1), weight.transpose(1, 2))
    out = out.view(tp, batch, q_len, -1)
    return out if bias is None else out + bias[:, None, None, :]


def row_parallel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each rank's x [tp, B, Q, in] times its columns weight [tp, out, in], summed over ranks (the
    all-reduce) -> [B, Q, out]."""
    tp, batch, q_len, _ = x.shape
    partial = torch.bmm(x.reshape(tp, batch * q_len, -1), weight.transpose(1, 2))  # [tp, B*Q, out]
    return partial.sum(0).view(batch, q_len, -1)


@dataclass(frozen=True)
class Decoder:
    """One model (target or draft) inside a program: static facts only, weights come per call."""

    arch: ModelArch
    plan: ShardPlan
    prefix: str  # "target_model." or "draft_model."

    def w(self, weights: Weights, name: str) -> torch.Tensor:
        return weights[self.prefix + name]

    def has(self, weights: Weights, name: str) -> bool:
        return self.prefix + name in weights

    def embed(self, weights: Weights, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, Q] -> hidden [B, Q, hidden], each rank contributing the rows it holds. Ids past this
        model's vocabulary (a draft with a smaller embedding than the target's) are clamped: the target
        verifies every proposal anyway."""
        table = self.w(weights, "embed_tokens.weight")  # [tp, V/tp, hidden]
        tp, rows = table.shape[0], table.shape[1]
        tokens = tokens.clamp(max=self.arch.vocab_size - 1)
        local = tokens[None] - (torch.arange(tp) * rows)[:, None, None]  # [tp, B, Q] row index on each rank
        held = (local >= 0) & (local < rows)
        picked = table[torch.arange(tp)[:, None, None], local.clamp(0, rows - 1)]  # [tp, B, Q, hidden]
        return torch.where(held[..., None], picked, 0.0).sum(0)

    def forward(self, weights: Weights, tokens: torch.Tensor, positions: torch.Tensor,
                k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> torch.Tensor:
        """Run tokens [B, Q] at positions [B, Q]; write their K/V into the caches at those positions;
        attend to every cached position <= the query's own. Returns final-normed hidden [B, Q, hidden]."""
        arch = self.arch
        h = self.embed(weights, tokens)
        cos, sin = rope_tables(positions, arch.head_dim, arch.rope_theta, h.dtype)
        cache_len = k_caches[0].shape[3]
        # visible[b, q, s]: key slot s is at or before query q's position (causal, and hides stale slots)
        visible = torch.arange(cache_len)[None, None, :] <= positions[:, :, None]  # [B, Q, S]
        for layer in range(arch.num_hidden_layers):
            h = h + self._attention(weights, layer, h, positions, cos, sin, visible,
                                    k_caches[layer], v_caches[layer])
            h = h + self._mlp(weights, layer, h)
        return rms_norm(h, self.w(weights, "norm.weight"), arch.rms_norm_eps)

    def logits(self, weights: Weights, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, Q, hidden] -> logits [B, Q, vocab]: each rank's vocabulary slice, gathered."""
        name = "embed_tokens.weight" if self.arch.tie_word_embeddings else "lm_head.weight"
        parts = column_parallel(hidden, self.w(weights, name))  # [tp, B, Q, V/tp]
        tp, batch, q_len, rows = parts.shape
        gathered = parts.permute(1, 2, 0, 3).reshape(batch, q_len, tp * rows)
        return gathered[..., : self.arch.vocab_size]  # padding rows would score 0 and could win the argmax

    def _attention(self, weights: Weights, layer: int, h: torch.Tensor, positions: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Attention output [B, Q, hidden]: every rank's partial, summed."""
        arch, plan = self.arch, self.plan
        p = f"layers.{layer}.self_attn."
        batch, q_len, _ = h.shape
        tp, hd, hq, hkv = plan.tp, arch.head_dim, plan.heads_per_rank, plan.kv_heads_per_rank
        x = rms_norm(h, self.w(weights, f"layers.{layer}.input_layernorm.weight"), arch.rms_norm_eps)

        def proj(name: str, heads: int) -> torch.Tensor:
            bias = self.w(weights, p + f"{name}.bias") if self.has(weights, p + f"{name}.bias") else None
            out = column_parallel(x, self.w(weights, p + f"{name}.weight"), bias)
            return out.view(tp, batch, q_len, heads, hd)  # [tp, B, Q, heads, hd]

        q, k, v = proj("q_proj", hq), proj("k_proj", hkv), proj("v_proj", hkv)
        if arch.qk_norm:  # Qwen3: RMSNorm over head_dim on q and k, before RoPE
            q = rms_norm(q, self.w(weights, p + "q_norm.weight"), arch.rms_norm_eps)
            k = rms_norm(k, self.w(weights, p + "k_norm.weight"), arch.rms_norm_eps)
        q = apply_rope(q.transpose(2, 3), cos, sin)  # [tp, B, hq, Q, hd]
        k = apply_rope(k.transpose(2, 3), cos, sin)  # [tp, B, hkv, Q, hd]
        v = v.transpose(2, 3)  # [tp, B, hkv, Q, hd]

        slots = positions[None, :, None, :, None].expand(tp, batch, hkv, q_len, hd)
        k_cache.scatter_(3, slots, k)  # [tp, B, hkv, S, hd]
        v_cache.scatter_(3, slots, v)

        # GQA: local Q head i reads local KV head i // q_per_kv; the g heads of a group share one matmul
        g, cache_len = plan.q_per_kv, k_cache.shape[3]
        q = q.reshape(tp, batch, hkv, g * q_len, hd)
        scores = (q @ k_cache.transpose(-1, -2) * hd ** -0.5).view(tp, batch, hkv, g, q_len, cache_len)
        scores = torch.where(visible[None, :, None, None], scores, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = probs.view(tp, batch, hkv, g * q_len, cache_len) @ v_cache  # [tp, B, hkv, g*Q, hd]
        # (g*Q) split back into (g, Q) inside each KV head, then positions first: reshaping (hkv, g*Q) into
        # (hq, Q) in one go made tracing derive a guard on the dynamic context length it could not prove
        out = (out.view(tp, batch, hkv, g, q_len, hd).permute(0, 1, 4, 2, 3, 5)
               .reshape(tp, batch, q_len, hq * hd))
        out = row_parallel(out, self.w(weights, p + "o_proj.weight"))
        if self.has(weights, p + "o_proj.bias"):  # replicated: added once, after the reduction
            out = out + self.w(weights, p + "o_proj.bias")
        return out

    def _mlp(self, weights: Weights, layer: int, h: torch.Tensor) -> torch.Tensor:
        """MLP output [B, Q, hidden]: every rank's partial, summed."""
        p = f"layers.{layer}."
        x = rms_norm(h, self.w(weights, p + "post_attention_layernorm.weight"), self.arch.rms_norm_eps)
        gate = column_parallel(x, self.w(weights, p + "mlp.gate_proj.weight"))  # [tp, B, Q, inter/tp]
        up = column_parallel(x, self.w(weights, p + "mlp.up_proj.weight"))
        return row_parallel(F.silu(gate) * up, self.w(weights, p + "mlp.down_proj.weight"))
