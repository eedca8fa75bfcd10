"""The programs of a fused speculative build, as NxDI has them: context encoding and the fused step;
and, when asked for, the target alone (plain greedy through the same weights), for baselines and for
prompt classes where speculation does not pay.

Continuous batching, as NxDI serves a batch-B build (`is_continuous_batching=True`, `ctx_batch_size=1`):
the caches hold B lines, one per request in flight. Context encoding runs at batch 1 and writes only
the cache line it is given (NxDI's `seq_ids`), so a request is admitted while the others decode; the
step programs run over all B lines at once. Without this, NxDI's context encoding runs over the whole
batch and `fill_prefix` writes every line: a new request's prefill overwrites the caches of the
requests already decoding (aws-neuron/neuronx-distributed-inference@4bcdc54,
src/neuronx_distributed_inference/modules/kvcache/kv_cache_manager.py, `update_cache`).

State between calls lives in the caller: per line, `cur` (the last accepted token, not yet in any
cache) and `pos` (its position = how many tokens both caches hold). The programs write the caches
in place and return tokens; none owns weights.

Fused step with k (NxDI's speculation_length), per line, in one call:
  1. the draft runs k times, one token each, from `cur` at `pos`: proposals d_1..d_{k-1}. The k-th
     run only writes d_{k-1} into the draft cache, so the draft cache is complete whatever is accepted;
  2. the target scores [cur, d_1..d_{k-1}] at pos..pos+k-1 in one pass: greedy g_1..g_k;
  3. accepted = (leading j with d_j == g_j) + 1, at most k. The accepted tokens are g_1..g_accepted
     (they equal the agreeing proposals, then the target's own token). Both caches hold valid K/V
     for pos..pos+accepted-1; later slots are stale, hidden by the position mask, and overwritten.
"""

from __future__ import annotations

import torch
from torch import nn

from fusedspec.compile.cpu.model import Decoder, Weights


def first_token(target: Decoder, weights: Weights, tokens: torch.Tensor, length: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
    """Prefill the target with one prompt tokens [1, C] (right-padded to at least 2: C is each call's
    own, the programs are exported with a dynamic context length) into batch-1 caches; its first new
    token [1]."""
    _, context = tokens.shape
    positions = torch.arange(context)[None, :]  # [1, C]
    hidden = target.forward(weights, tokens, positions, target_k, target_v)  # [1, C, H]
    last = (length - 1)[:, None, None].expand(1, 1, hidden.shape[-1])  # [1, 1, H]
    logits = target.logits(weights, hidden.gather(1, last))  # [1, 1, V]
    return logits[:, 0].argmax(-1)


def line_of(caches: list[torch.Tensor], line: torch.Tensor) -> list[torch.Tensor]:
    """A copy of one cache line of every layer: [tp, B, heads, S, hd] -> [tp, 1, heads, S, hd]."""
    return [cache.index_select(1, line) for cache in caches]


def write_line(caches: list[torch.Tensor], line: torch.Tensor, lines: list[torch.Tensor]) -> None:
    """Write one line back into every layer's cache, in place; the other B-1 lines are not touched."""
    for cache, one in zip(caches, lines, strict=True):
        cache.index_copy_(1, line, one)


class ContextEncoding(nn.Module):
    """Prefill target and draft with one prompt into one cache line; return its first new token.

    The prompt is computed into a copy of its line (batch 1), which is then written back: whatever the
    line held before is replaced (slots past the prompt keep stale values, hidden by the position mask
    until a step overwrites them)."""

    def __init__(self, target: Decoder, draft: Decoder):
        super().__init__()
        self.target, self.draft = target, draft

    def forward(self, weights: Weights, tokens: torch.Tensor, length: torch.Tensor, line: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor],
                draft_k: list[torch.Tensor], draft_v: list[torch.Tensor]) -> torch.Tensor:
        """tokens [1, C] (right-padded), length [1] >= 1, line [1] in 0..B-1 -> first token [1]."""
        caches = (target_k, target_v, draft_k, draft_v)
        own = [line_of(layers, line) for layers in caches]  # per layer [tp, 1, heads, S, hd]
        tk, tv, dk, dv = own
        positions = torch.arange(tokens.shape[1])[None, :]  # [1, C]
        self.draft.forward(weights, tokens, positions, dk, dv)  # only its caches matter
        first = first_token(self.target, weights, tokens, length, tk, tv)
        for layers, line_layers in zip(caches, own, strict=True):
            write_line(layers, line, line_layers)
        return first


class TargetAlone(nn.Module):
    """A program of the target alone (compile option target_alone): no draft, no draft caches."""

    def __init__(self, target: Decoder):
        super().__init__()
        self.target = target


class TargetContextEncoding(TargetAlone):
    """Prefill the target alone with one prompt into one cache line (plain greedy's first token)."""

    def forward(self, weights: Weights, tokens: torch.Tensor, length: torch.Tensor, line: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
        """tokens [1, C] (right-padded), length [1] >= 1, line [1] in 0..B-1 -> first token [1]."""
        tk, tv = line_of(target_k, line), line_of(target_v, line)
        first = first_token(self.target, weights, tokens, length, tk, tv)
        write_line(target_k, line, tk)
        write_line(target_v, line, tv)
        return first


class TargetStep(TargetAlone):
    """One plain greedy step of the target alone over every line: cur [B] at pos [B] -> next token [B]."""

    def forward(self, weights: Weights, cur: torch.Tensor, pos: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
        hidden = self.target.forward(weights, cur[:, None], pos[:, None], target_k, target_v)
        return self.target.logits(weights, hidden)[:, 0].argmax(-1)


class TargetVerify(TargetAlone):
    """The verify half of a fused step alone: the target scores k given tokens per line at pos..pos+k-1.

    Never served: validation times it against TargetStep to measure the verify slope b (how much more
    scoring k positions costs than decoding one) on this artifact's own programs, and against FusedStep
    to separate the draft's share of a fused step (validate.step_costs)."""

    def forward(self, weights: Weights, tokens: torch.Tensor, pos: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
        """tokens [B, k], pos [B] -> greedy [B, k]."""
        positions = pos[:, None] + torch.arange(tokens.shape[1])[None, :]  # [B, k]
        hidden = self.target.forward(weights, tokens, positions, target_k, target_v)
        return self.target.logits(weights, hidden).argmax(-1)


class FusedStep(nn.Module):
    """One fused speculation step for every line of the batch, each accepting its own number of tokens
    (see the module docstring)."""

    def __init__(self, target: Decoder, draft: Decoder, k: int):
        super().__init__()
        if k < 2:
            raise ValueError(f"speculation length k={k} must be at least 2")
        self.target, self.draft, self.k = target, draft, k
        # a draft token beyond the target's vocabulary could never be accepted; keep proposals inside it
        self.proposal_vocab = min(target.arch.vocab_size, draft.arch.vocab_size)

    def forward(self, weights: Weights, cur: torch.Tensor, pos: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor],
                draft_k: list[torch.Tensor],
                draft_v: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """cur [B], pos [B] -> (greedy [B, k] target tokens, accepted [B] in 1..k)."""
        k = self.k
        token = cur
        proposals = []
        for i in range(k):
            hidden = self.draft.forward(weights, token[:, None], (pos + i)[:, None], draft_k, draft_v)
            if i == k - 1:
                break  # the k-th run only caches d_{k-1}
            logits = self.draft.logits(weights, hidden)[:, 0, : self.proposal_vocab]  # [B, V]
            token = logits.argmax(-1)
            proposals.append(token)
        candidates = torch.stack([cur, *proposals], dim=1)  # [B, k]
        positions = pos[:, None] + torch.arange(k)[None, :]  # [B, k]
        hidden = self.target.forward(weights, candidates, positions, target_k, target_v)
        greedy = self.target.logits(weights, hidden).argmax(-1)  # [B, k]
        agree = (candidates[:, 1:] == greedy[:, :-1]).to(torch.int64)  # [B, k-1]
        accepted = agree.cumprod(dim=1).sum(dim=1) + 1  # [B]
        return greedy, accepted
