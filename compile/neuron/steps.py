"""Per-step acceptance counts from NxDI's generation adapter, and the token budget to ask it for. Pure.

How the counts are obtained (NxDI utils/hf_adapter.py, `_fused_assisted_decoding`, 0.6.0 and 0.9.0): the
adapter calls the fused model once for context encoding (its first output token is y_1) and then once per
fused step; after each step it takes `n = fused_outputs[3] - position_ids` (next position minus current
position) as the number of tokens that step accepted, appends that many tokens, and returns only the final
ids. It does not expose `n`, so device.py records exactly that difference with a forward hook on the
adapter (the same quantity the adapter uses). Raw counts are then cut here at EOS and at max_new_tokens,
which gives `Generation.accepted` as the contracts define it.

Two properties of that loop shape the budget: it converts `n` to one Python int, so it drives one
sequence at a time (NxDI pads the batch up to the compiled batch size), and it stops once fewer than k
positions remain before `max_length`, so asking for N tokens may yield as few as N - k + 1. We ask for
N + k and cut back to N; the fused step writes k positions, so prompt + N + k must fit in seq_len: the bound
every server of these artifacts applies (compile.fused_step.max_model_len).
"""

from __future__ import annotations

from collections.abc import Sequence

from fusedspec.compile.fused_step import max_model_len
from fusedspec.core.errors import PromptError


def request_budget(prompt_len: int, max_new_tokens: int, k: int, seq_len: int,
                   max_context_length: int) -> int:
    """max_new_tokens to pass to the adapter so that it yields at least `max_new_tokens` tokens, or
    PromptError when the prompt does not fit the compiled shapes."""
    if prompt_len < 1:
        raise PromptError("empty prompt: give at least one token")
    if prompt_len > max_context_length:
        raise PromptError(f"prompt of {prompt_len} tokens is longer than the compiled context of "
                          f"{max_context_length}; shorten it or compile with a larger seq_len")
    longest = max_model_len(seq_len, k) if k else seq_len  # k 0: the target-only reference, one token a step
    if prompt_len + max_new_tokens > longest:
        raise PromptError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) + k ({k}) exceeds seq_len={seq_len}: "
            f"a fused step writes k positions; lower max_new_tokens to {max(longest - prompt_len, 0)} or "
            "compile with a larger seq_len")
    return max_new_tokens + k


def truncate(
    new_tokens: Sequence[int], raw_counts: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(tokens, accepted): new tokens cut after the first EOS (kept) or at max_new_tokens, and per fused step
    the number of those tokens it added. `raw_counts` are the adapter's per-step counts, context encoding
    excluded; the first new token comes from context encoding and belongs to no step."""
    eos = set(eos_token_ids)
    tokens: list[int] = []
    for token in new_tokens[:max_new_tokens]:
        tokens.append(int(token))
        if token in eos:
            break
    produced = 1 + sum(raw_counts)
    # The adapter cuts its own last step at EOS, so it may hold fewer tokens than the raw counts add up to,
    # never more.
    assert len(new_tokens) <= produced, (len(new_tokens), list(raw_counts))
    accepted: list[int] = []
    left = len(tokens) - 1
    for count in raw_counts:
        if left <= 0:
            break
        assert count >= 1, f"a fused step accepts at least the target's own token, got {count}"
        take = min(count, left)
        accepted.append(take)
        left -= take
    if left > 0:
        raise AssertionError(f"{left} token(s) not covered by any recorded step: {list(raw_counts)}")
    return tokens, accepted
