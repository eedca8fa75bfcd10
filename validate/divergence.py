"""Where an artifact's tokens first leave the reference's, and whether that is a tolerated near-tie.

The one rule both the greedy gate (`validate.greedy`) and its continuous-batching check
(`validate.staggered_gate`) judge tokens by:

    divergence = first_divergence(ref, got, start=0, tolerance=0.5)
    # None: got equals ref.tokens[start:] exactly (same tokens, same length)
    # else: the first differing position (0-based among the new tokens of the original prompt), both
    #       tokens, the reference's margin there, and `tie`: the artifact's token is one the reference
    #       nearly tied with (its logit at most `tolerance` below the chosen one's)

`got` holds the artifact's tokens from new token `start` on: 0 for a run from the prompt, or the
position just after a near-tie for a run teacher-forced through the reference's tokens up to it. The
reference's margins hold on that path, because teacher forcing puts the artifact on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusedspec.validate.reference import PromptReference


@dataclass(frozen=True)
class Divergence:
    position: int  # 0-based among the prompt's new tokens
    expected: int | None  # reference token there; None: the reference had ended
    got: int | None  # artifact token there; None: the artifact's output had ended
    margin: float | None  # reference top-2 logit margin there
    runner_up: int | None
    gap: float | None  # how far the artifact token's reference logit was below the chosen one's
    tie: bool  # the artifact's token was nearly tied with the reference's: tolerated


def first_divergence(ref: PromptReference, got: Sequence[int], *, start: int = 0,
                     tolerance: float) -> Divergence | None:
    """The first place `got` (the artifact's tokens from new token `start` on) leaves the reference;
    None when it matches to the end, length included."""
    want = ref.tokens[start:]
    offset = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if offset is None and len(got) == len(want):
        return None
    if offset is None:  # identical tokens, but one stopped early: an EOS or length bug, never a tie
        offset = min(len(got), len(want))
    position = start + offset
    expected = want[offset] if offset < len(want) else None
    token = got[offset] if offset < len(got) else None
    if expected is None:
        return Divergence(position, None, token, None, None, None, tie=False)
    gap = ref.gap(position, token) if token is not None else None
    return Divergence(position, expected, token, ref.margins[position], ref.runner_up[position], gap,
                      # gap >= margin: the top-2 margin is within too
                      tie=gap is not None and gap <= tolerance)
