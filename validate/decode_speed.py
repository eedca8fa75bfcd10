"""Measured decode speedup per prompt class: the artifact fused against the same artifact's target alone.

For each class, its prompts are generated with speculation and without (the target-alone programs,
same weights, same batch), alternating which goes first, `repeats` times. A run's seconds per token
is its decode steps' seconds over its decode tokens (the first token of each prompt comes from context
encoding in both modes and is left out, as in the prediction). A run's speedup is its target-alone
seconds per token over its fused seconds per token, the two timed back to back, so a host whose load
drifts over minutes slows both alike; the measured speedup is the median of the runs' speedups, and
their spread says how much to trust it. Nothing here is predicted: advice.py puts it next to the prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fusedspec.compile.backend import DECODE_STEPS_S, Runner
from fusedspec.validate.acceptance import OVERALL
from fusedspec.validate.step_costs import spread

DEFAULT_REPEATS = 3


@dataclass(frozen=True)
class DecodeRun:
    seconds: float  # decode steps only
    tokens: int  # decode tokens (each prompt's first token excluded)

    @property
    def per_token(self) -> float:
        return self.seconds / self.tokens


@dataclass(frozen=True)
class DecodeSpeed:
    """One class: per-run target-alone and fused decode, and the speedup they give."""

    cls: str
    k: int
    target_runs: tuple[DecodeRun, ...]
    fused_runs: tuple[DecodeRun, ...]

    @property
    def target_s_per_token(self) -> float:
        return statistics.median(r.per_token for r in self.target_runs)

    @property
    def fused_s_per_token(self) -> float:
        return statistics.median(r.per_token for r in self.fused_runs)

    @property
    def run_speedups(self) -> list[float]:
        return [t.per_token / f.per_token for t, f in zip(self.target_runs, self.fused_runs, strict=True)]

    @property
    def speedup(self) -> float:
        return statistics.median(self.run_speedups)

    @property
    def spread(self) -> float:
        return spread(self.run_speedups)

    @property
    def tokens(self) -> int:
        return self.fused_runs[0].tokens


def measure_decode(runner: Runner, prompts: Mapping[str, Sequence[Sequence[int]]], max_new_tokens: int,
                   eos_token_ids: Sequence[int], *, repeats: int = DEFAULT_REPEATS) -> list[DecodeSpeed]:
    """Per class of `prompts` (class -> prompt token ids), then overall (the sums of every class's runs).
    Needs a runner with target-alone programs (`runner.target_alone`)."""
    k = runner.spec.k
    runs: dict[str, dict[bool, list[DecodeRun]]] = {cls: {True: [], False: []} for cls in prompts}
    for repeat in range(repeats):
        for cls, group in prompts.items():
            for speculate in ((True, False) if repeat % 2 else (False, True)):
                generation = runner.generate(list(group), max_new_tokens, eos_token_ids, speculate=speculate)
                tokens = sum(max(len(t) - 1, 0) for t in generation.tokens)
                runs[cls][speculate].append(DecodeRun(seconds=generation.timings[DECODE_STEPS_S],
                                                      tokens=tokens))
    found = [DecodeSpeed(cls=cls, k=k, target_runs=tuple(by[False]), fused_runs=tuple(by[True]))
             for cls, by in runs.items() if by[True][0].tokens > 0]

    def total(speculate: bool, i: int) -> DecodeRun:
        return DecodeRun(seconds=sum(runs[c][speculate][i].seconds for c in runs),
                         tokens=sum(runs[c][speculate][i].tokens for c in runs))

    if found:
        found.append(DecodeSpeed(cls=OVERALL, k=k, target_runs=tuple(total(False, i) for i in range(repeats)),
                                 fused_runs=tuple(total(True, i) for i in range(repeats))))
    return found
