"""The programs of a fused speculative build, as NxDI has them: context encoding and the fused step;
and, when asked for, the target alone (plain greedy through the same weights), for baselines and for
prompt classes where speculation does not pay.

State between calls lives in the caller: per row, `cur` (the last accepted token, not yet in any
cache) and `pos` (its position = how many tokens both caches hold). Both programs write the caches
in place and return tokens; neither owns weights.

Fused step with k (NxDI's speculation_length), per row, in one call:
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

from compile.cpu.model import Decoder, Weights


def first_tokens(target: Decoder, weights: Weights, tokens: torch.Tensor, lengths: torch.Tensor,
                 target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
    """Prefill the target with tokens [B, C] (right-padded; C is each call's own, the programs are
    exported with a dynamic context length) and return each row's first new token [B]."""
    batch, context = tokens.shape
    positions = torch.arange(context)[None, :].expand(batch, context)  # [B, C]
    hidden = target.forward(weights, tokens, positions, target_k, target_v)  # [B, C, H]
    last = (lengths - 1)[:, None, None].expand(batch, 1, hidden.shape[-1])  # [B, 1, H]
    logits = target.logits(weights, hidden.gather(1, last))  # [B, 1, V]
    return logits[:, 0].argmax(-1)


class ContextEncoding(nn.Module):
    """Prefill target and draft with a padded batch of prompts; return each row's first new token."""

    def __init__(self, target: Decoder, draft: Decoder):
        super().__init__()
        self.target, self.draft = target, draft

    def forward(self, weights: Weights, tokens: torch.Tensor, lengths: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor],
                draft_k: list[torch.Tensor], draft_v: list[torch.Tensor]) -> torch.Tensor:
        """tokens [B, C] (right-padded), lengths [B] >= 1 -> first token [B] (target greedy)."""
        batch, context = tokens.shape
        positions = torch.arange(context)[None, :].expand(batch, context)
        self.draft.forward(weights, tokens, positions, draft_k, draft_v)  # only its caches matter
        return first_tokens(self.target, weights, tokens, lengths, target_k, target_v)


class TargetAlone(nn.Module):
    """A program of the target alone (compile option target_alone): no draft, no draft caches."""

    def __init__(self, target: Decoder):
        super().__init__()
        self.target = target


class TargetContextEncoding(TargetAlone):
    """Prefill the target alone (plain greedy's first token)."""

    def forward(self, weights: Weights, tokens: torch.Tensor, lengths: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
        return first_tokens(self.target, weights, tokens, lengths, target_k, target_v)


class TargetStep(TargetAlone):
    """One plain greedy step of the target alone: cur [B] at pos [B] -> next token [B]."""

    def forward(self, weights: Weights, cur: torch.Tensor, pos: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor]) -> torch.Tensor:
        hidden = self.target.forward(weights, cur[:, None], pos[:, None], target_k, target_v)
        return self.target.logits(weights, hidden)[:, 0].argmax(-1)


class FusedStep(nn.Module):
    """One fused speculation step for every row of the batch (see the module docstring)."""

    def __init__(self, target: Decoder, draft: Decoder, k: int):
        super().__init__()
        if k < 2:
            raise ValueError(f"speculation length k={k} must be at least 2")
        self.target, self.draft, self.k = target, draft, k
        # a draft token beyond the target's vocabulary could never be accepted; keep proposals inside it
        self.proposal_vocab = min(target.arch.vocab_size, draft.arch.vocab_size)

    def forward(self, weights: Weights, cur: torch.Tensor, pos: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor],
                draft_k: list[torch.Tensor], draft_v: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
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
