"""Greedy equivalence of compiled cpu artifacts with Hugging Face, and acceptance per step.

Builds cover TP {1,2,4} x k {2,4,7} x draft {copy, unrelated, cut} as an orthogonal array (every pair
of levels of two factors appears once: 9 builds instead of 27), batch 1 and 4 alternating. Three of
them, one per level of every factor, run in the fast suite; the other six are marked slow.
For every build: the runner's tokens equal HF `generate(do_sample=False)` on the target alone for 8
prompts x 32 new tokens, and the accepted counts per step equal the contract's prediction from
teacher-forced draft agreement (so copy -> k per step, unrelated -> about 1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cpu_artifacts import NEW_TOKENS, predicted_steps

FAST = [  # (tp, k, draft, batch): one per level of each factor
    (1, 7, "copy", 4),
    (2, 2, "cut", 1),
    (4, 4, "unrelated", 4),
]
SLOW = [
    (1, 2, "unrelated", 1),
    (1, 4, "cut", 4),
    (2, 4, "copy", 1),
    (2, 7, "unrelated", 4),
    (4, 2, "copy", 4),
    (4, 7, "cut", 1),
]
CASES = [pytest.param(*c, id=f"tp{c[0]}-k{c[1]}-{c[2]}-bs{c[3]}") for c in FAST] + [
    pytest.param(*c, id=f"tp{c[0]}-k{c[1]}-{c[2]}-bs{c[3]}", marks=pytest.mark.slow) for c in SLOW
]


@pytest.mark.parametrize("tp, k, draft, batch", CASES)
def test_tokens_equal_hf_greedy_and_steps_follow_agreement(
    tp: int, k: int, draft: str, batch: int, build_tiny: Callable[..., Path],
    cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]], hf_reference: list[list[int]],
    hf_agreement: dict[str, list[list[bool]]],
) -> None:
    gen = cpu_runner(build_tiny(tp=tp, k=k, batch=batch, draft=draft)).generate(tiny_prompts, NEW_TOKENS)

    assert len(gen.tokens) == len(tiny_prompts) == 8
    for i, (got, want) in enumerate(zip(gen.tokens, hf_reference, strict=True)):
        assert got == want, f"prompt {i}: fused output differs from HF greedy"
        assert len(want) == NEW_TOKENS or want[-1] == 151645
    for i, steps in enumerate(gen.accepted):
        assert sum(steps) + 1 == len(gen.tokens[i])  # the first token is context encoding's
        assert steps == predicted_steps(hf_agreement[draft][i], len(hf_reference[i]), k), f"prompt {i}"
        assert all(1 <= a <= k for a in steps)

    every_step = [a for steps in gen.accepted for a in steps]
    if draft == "copy":  # acceptance 1.0: k per step, except a final step cut at the length limit
        assert all(steps[:-1] == [k] * (len(steps) - 1) for steps in gen.accepted)
    if draft == "unrelated":  # a random draft almost never agrees
        assert sum(every_step) / len(every_step) < 1.2


def test_copy_draft_needs_a_kth_of_the_steps(build_tiny: Callable[..., Path],
                                             cpu_runner: Callable[[Path], Any],
                                             tiny_prompts: list[list[int]]) -> None:
    """Copy draft at k=7: 31 tokens after the first take ceil(31/7) = 5 steps per prompt."""
    gen = cpu_runner(build_tiny(tp=1, k=7, batch=4, draft="copy")).generate(tiny_prompts, NEW_TOKENS)
    assert gen.steps == [5] * len(tiny_prompts)
    assert all(steps == [7, 7, 7, 7, 3] for steps in gen.accepted)
