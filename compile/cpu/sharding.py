"""NxDI's tensor-parallel rules: how one model's full weights become one weight dict per rank.

- Q heads are padded to a multiple of TP. Padding is interleaved per KV group (as NxDI's
  `maybe_pad_interleaved`), so every rank's Q heads belong to KV heads that rank holds; padded heads
  have zero q rows and zero o_proj columns, so they contribute nothing.
- KV heads are split across ranks when `kv % tp == 0` and replicated (each rank holds one) when
  `tp % kv == 0`. Anything else cannot be sharded (compile.matrix.tp_problem says so up front).
- q/k/v/gate/up are column-parallel (output rows split), o/down row-parallel (input columns split):
  each rank produces a partial hidden state and the program sums them, as NxDI's all-reduce does.
  The MLP width is zero-padded to a multiple of TP when needed (silu(0) * 0 contributes nothing).
- Embeddings and lm_head are vocab-parallel (NxDI's ParallelEmbedding and column-parallel lm_head):
  rank r holds rows [r*V/tp, (r+1)*V/tp) (vocab zero-padded to a multiple of TP). A token's embedding
  comes from the one rank that holds its row (a sum over ranks in which the others add zero); logits
  are the ranks' slices concatenated (all-gather) and cut back to the real vocabulary. Replicating
  them instead would make an artifact TP times the embedding size (100 GB for Qwen3-32B at TP 32).
- Norms (and Llama's o_proj bias) are replicated: every rank file holds the same copy.

Tensor names inside a rank dict are the Hugging Face names without the leading `model.`
(`layers.0.self_attn.q_proj.weight`, `embed_tokens.weight`, `lm_head.weight`); the artifact prefixes
them with `target_model.` / `draft_model.`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedspec.compile.modelconfig import ModelArch
from fusedspec.core.errors import ConfigError

Shards = list[dict[str, torch.Tensor]]  # one dict per rank: what `weights/tp{r}_...safetensors` holds


@dataclass(frozen=True)
class ShardPlan:
    """Head and width bookkeeping of one model at one TP degree. Pure arithmetic, no tensors."""

    tp: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    padded_heads: int  # Q heads after padding to a multiple of tp
    heads_per_rank: int
    kv_heads_per_rank: int
    kv_replication: int  # ranks sharing one KV head (1 when KV heads are split)
    padded_intermediate: int
    vocab_size: int
    padded_vocab: int

    @classmethod
    def for_arch(cls, arch: ModelArch, tp: int) -> ShardPlan:
        heads, kv = arch.num_attention_heads, arch.num_key_value_heads
        if tp < 1 or heads % kv != 0 or not (kv % tp == 0 or tp % kv == 0):
            raise ConfigError(
                f"tp_degree={tp} cannot shard {heads} attention heads / {kv} KV heads: TP must divide "
                "the KV heads or be a multiple of them"
            )
        padded = -(-heads // tp) * tp
        return cls(
            tp=tp,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=arch.head_dim,
            intermediate_size=arch.intermediate_size,
            padded_heads=padded,
            heads_per_rank=padded // tp,
            kv_heads_per_rank=max(kv // tp, 1),
            kv_replication=max(tp // kv, 1),
            padded_intermediate=-(-arch.intermediate_size // tp) * tp,
            vocab_size=arch.vocab_size,
            padded_vocab=-(-arch.vocab_size // tp) * tp,
        )

    @property
    def q_per_kv(self) -> int:
        """Local Q heads served by one local KV head (the same on every rank)."""
        return self.heads_per_rank // self.kv_heads_per_rank

    def padded_q_sources(self) -> list[int | None]:
        """For each padded Q head, the original head it holds, or None for a zero padding head."""
        group = self.num_heads // self.num_kv_heads
        padded_group = self.padded_heads // self.num_kv_heads
        return [
            (p // padded_group) * group + p % padded_group if p % padded_group < group else None
            for p in range(self.padded_heads)
        ]

    def q_sources(self, rank: int) -> list[int | None]:
        per = self.heads_per_rank
        return self.padded_q_sources()[rank * per:(rank + 1) * per]

    def kv_sources(self, rank: int) -> list[int]:
        if self.kv_replication > 1:
            return [rank // self.kv_replication]
        per = self.kv_heads_per_rank
        return list(range(rank * per, (rank + 1) * per))

    def describe(self) -> dict[str, int | str]:
        return {
            "tp": self.tp,
            "padded_heads": self.padded_heads,
            "heads_per_rank": self.heads_per_rank,
            "kv_heads_per_rank": self.kv_heads_per_rank,
            "kv_strategy": "replicate" if self.kv_replication > 1 else "split",
            "padded_intermediate": self.padded_intermediate,
            "vocab_per_rank": self.padded_vocab // self.tp,
        }


def _pick_heads(weight: torch.Tensor, sources: list[int | None], head_dim: int, dim: int) -> torch.Tensor:
    """Rows (dim 0) or columns (dim 1) of `weight` for the listed heads, zeros where a source is None."""
    heads = weight.unflatten(dim, (-1, head_dim))  # [..., heads, head_dim, ...]
    zero = torch.zeros_like(heads.select(dim, 0))
    picked = [heads.select(dim, s) if s is not None else zero for s in sources]
    return torch.stack(picked, dim).flatten(dim, dim + 1).contiguous()


def _split(weight: torch.Tensor, dim: int, padded: int, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s equal slice along `dim` of `weight` zero-padded to `padded` along that dim."""
    size, length = padded // tp, weight.shape[dim]
    start = min(rank * size, length)
    piece = weight.narrow(dim, start, min(start + size, length) - start)
    missing = size - piece.shape[dim]
    if missing:
        pad_shape = list(weight.shape)
        pad_shape[dim] = missing
        piece = torch.cat([piece, weight.new_zeros(pad_shape)], dim)
    return piece.contiguous()


def shard_rank(full: dict[str, torch.Tensor], plan: ShardPlan, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s weights of one model (names as in the full dict)."""
    hd = plan.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        leaf = name.split(".")[-2] if "." in name else name
        if leaf == "q_proj":  # weight [heads*hd, hidden] or bias [heads*hd]
            out[name] = _pick_heads(tensor, plan.q_sources(rank), hd, 0)
        elif leaf in ("k_proj", "v_proj"):
            out[name] = _pick_heads(tensor, list(plan.kv_sources(rank)), hd, 0)
        elif leaf == "o_proj" and name.endswith(".weight"):  # [hidden, heads*hd]: input columns
            out[name] = _pick_heads(tensor, plan.q_sources(rank), hd, 1)
        elif leaf in ("gate_proj", "up_proj"):  # [inter, hidden]
            out[name] = _split(tensor, 0, plan.padded_intermediate, plan.tp, rank)
        elif leaf == "down_proj":  # [hidden, inter]
            out[name] = _split(tensor, 1, plan.padded_intermediate, plan.tp, rank)
        elif leaf in ("embed_tokens", "lm_head"):  # [vocab, hidden]: vocab rows
            out[name] = _split(tensor, 0, plan.padded_vocab, plan.tp, rank)
        else:  # norms, o_proj bias: replicated (the bias is added once, after the reduction)
            out[name] = tensor
    return out


def shard_model(full: dict[str, torch.Tensor], plan: ShardPlan) -> dict[str, torch.Tensor]:
    """All ranks at once, in the programs' layout (see stack_ranks), consuming `full` as it goes so
    the peak memory is about twice the model rather than three times."""
    out: dict[str, torch.Tensor] = {}
    for name in list(full):
        tensor = full.pop(name)
        if is_replicated(name):
            out[name] = tensor
        else:
            out[name] = torch.stack([shard_rank({name: tensor}, plan, r)[name] for r in range(plan.tp)])
    return out


def rank_tensors(weights: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s file contents from the programs' layout (the inverse of stack_ranks): views, no
    copies (a rank's slice of a contiguous stacked tensor is contiguous)."""
    return {name: tensor if is_replicated(name) else tensor[rank] for name, tensor in weights.items()}


REPLICATED_LEAVES = ("norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm")


def is_replicated(name: str) -> bool:
    """Whether every rank holds the same copy of tensor `name` (used to check artifacts at load)."""
    if name.endswith("o_proj.bias"):
        return True
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in REPLICATED_LEAVES


def stack_ranks(shards: Shards) -> dict[str, torch.Tensor]:
    """The programs' weight input: sharded tensors stacked along a new leading rank dim [tp, ...]
    (rank r's slice is rank r's tensor), replicated tensors once, from rank 0. Callers check that
    the other ranks' replicated copies agree (see layout.load_shards).

    Consumes `shards`: each rank's tensor is dropped as soon as it is stacked, and with one rank the
    result is a view, so loading peaks at about one copy of the weights (stacking everything while the
    loaded shards lived made the runner's peak twice the weights)."""
    out: dict[str, torch.Tensor] = {}
    for name in list(shards[0]):
        tensors = [rank.pop(name) for rank in shards]
        if is_replicated(name):
            out[name] = tensors[0]
        elif len(tensors) == 1:
            out[name] = tensors[0].unsqueeze(0)
        else:
            out[name] = torch.stack(tensors)
        del tensors
    return out
