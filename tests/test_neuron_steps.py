"""Per-step acceptance accounting for NxDI's generation adapter against the contracts' acceptance semantics.

The adapter loop is modelled from NxDI utils/hf_adapter.py `_fused_assisted_decoding` (0.6.0/0.9.0): one
context-encoding call gives y_1; each fused step accepts n = c + 1 tokens (c = consecutive draft agreements,
at most k-1), the step's tokens are cut after an EOS (and the loop ends), and the loop also ends once
sum(n) >= max_new_tokens or fewer than k+1 positions remain. The hook records the untruncated n.
"""

from __future__ import annotations

import random

import pytest

from fusedspec.compile.neuron.steps import request_budget, truncate
from fusedspec.core.errors import PromptError

EOS = 151645


def contract_steps(agree: list[bool], n_tokens: int, k: int) -> list[int]:
    """The contracts' definition: agree[j] for j >= 2 (index j-1 here), y_1 from context encoding."""
    steps, p = [], 1
    while p < n_tokens:
        c = 0
        while c < k - 1 and p + c + 1 <= len(agree) and agree[p + c]:
            c += 1
        a = min(c + 1, n_tokens - p)
        steps.append(a)
        p += a
    return steps


def adapter_run(stream: list[int], agree: list[bool], k: int, budget: int) -> tuple[list[int], list[int]]:
    """(new tokens the adapter returns, raw n per fused step the hook records)."""
    returned, raw, cur = [stream[0]], [], 0
    while True:
        p = len(returned)
        c = 0
        while c < k - 1 and agree[p + c]:
            c += 1
        n = c + 1
        raw.append(n)
        accepted = stream[p:p + n]
        ended = EOS in accepted
        if ended:
            accepted = accepted[:accepted.index(EOS) + 1]
        returned += accepted
        cur += n
        if ended or returned[-1] == EOS or cur >= budget or budget - cur <= k:
            return returned, raw


@pytest.mark.parametrize("seed", range(40))
def test_truncated_counts_equal_the_contract_semantics(seed: int) -> None:
    rng = random.Random(seed)
    k, n_tokens = rng.randint(2, 9), rng.randint(1, 40)
    stream = [rng.randrange(1000) for _ in range(n_tokens + 3 * k)]
    agree = [rng.random() < 0.7 for _ in range(len(stream) + k)]
    eos_at = rng.choice([None, rng.randrange(len(stream))])
    if eos_at is not None:
        stream[eos_at] = EOS
    budget = request_budget(10, n_tokens, k, seq_len=10 + n_tokens + k, max_context_length=10 + n_tokens + k)
    new, raw = adapter_run(stream, agree, k, budget)
    tokens, accepted = truncate(new, raw, n_tokens, [EOS])
    expected_len = n_tokens if eos_at is None or eos_at >= n_tokens else eos_at + 1
    assert tokens == stream[:expected_len]
    assert accepted == contract_steps(agree, expected_len, k)
    assert 1 + sum(accepted) == len(tokens) and all(1 <= a <= k for a in accepted)


def test_first_token_eos_has_no_step() -> None:
    # The adapter still runs one fused step after an EOS from context encoding; it is not counted.
    tokens, accepted = truncate([EOS, 5, 6], [2], 10, [EOS])
    assert tokens == [EOS] and accepted == []


def test_counts_that_do_not_cover_the_tokens_are_an_invariant_violation() -> None:
    with pytest.raises(AssertionError):
        truncate([1, 2, 3, 4], [1], 10, [EOS])


def test_budget_and_prompt_limits() -> None:
    assert request_budget(100, 128, 7, seq_len=1024, max_context_length=1024) == 135
    with pytest.raises(PromptError, match="longer than the compiled context of 512"):
        request_budget(600, 10, 7, seq_len=1024, max_context_length=512)
    with pytest.raises(PromptError, match="lower max_new_tokens to 117"):
        request_budget(900, 128, 7, seq_len=1024, max_context_length=1024)
    with pytest.raises(PromptError, match="empty prompt"):
        request_budget(0, 10, 7, seq_len=1024, max_context_length=1024)
