"""The staggered-arrival schedule (validate/staggered.py): a batch-4 artifact serving 12 requests that
arrive at seeded random steps, lines reused, gives every request the target's greedy tokens and the
acceptance teacher forcing predicts, speculating or not; a context program that writes every cache line
passes one prompt at a time but fails the schedule; the schedule is deterministic and refuses nonsense."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from compile.backend import get_backend
from compile.cpu.export import export_module, save_program
from compile.cpu.model import Weights
from compile.cpu.programs import ContextEncoding
from compile.errors import PromptError
from tests.fixtures.cpu_artifacts import NEW_TOKENS, predicted_steps
from validate.staggered import coverage_gaps, mismatches, run_staggered, staggered_schedule

BATCHED = {"tp": 1, "k": 4, "batch": 4, "draft": "cut"}  # also a (slow) case of test_cpu_equivalence
PLAIN = {"tp": 2, "k": 3, "batch": 4, "draft": "copy", "target_alone": True}  # shared with test_cpu_runner
SEED = 14


def test_staggered_requests_get_the_targets_greedy_tokens_and_the_predicted_acceptance(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]], hf_agreement: dict[str, list[list[bool]]]) -> None:
    runner = cpu_runner(build_tiny(**BATCHED))
    schedule = staggered_schedule(len(tiny_prompts), requests=12, lines=4, seed=SEED)
    run = run_staggered(runner.batcher(), tiny_prompts, schedule, NEW_TOKENS)

    assert [r.request for r in run.results] == list(range(12))
    assert coverage_gaps(run) == [] and run.reused_lines >= 8
    assert [m.describe() for m in mismatches(run, hf_reference)] == []
    for r in run.results:  # each line accepts its own number of tokens: what its own prompt predicts
        assert r.accepted == predicted_steps(hf_agreement["cut"][r.prompt], len(hf_reference[r.prompt]), 4), r


def test_staggered_plain_greedy_with_the_target_alone(build_tiny: Callable[..., Path],
                                                      cpu_runner: Callable[[Path], Any],
                                                      tiny_prompts: list[list[int]],
                                                      hf_reference: list[list[int]]) -> None:
    runner = cpu_runner(build_tiny(**PLAIN))
    schedule = staggered_schedule(len(tiny_prompts), requests=12, lines=4, seed=SEED + 1)
    run = run_staggered(runner.batcher(speculate=False), tiny_prompts, schedule, NEW_TOKENS)
    assert coverage_gaps(run) == [] and mismatches(run, hf_reference) == []
    assert all(r.accepted == [1] * (len(r.tokens) - 1) for r in run.results)


class WritesEveryLine(ContextEncoding):
    """A deliberately broken context program, the bug class continuous batching brings: NxDI's context
    encoding without `is_continuous_batching` writes every batch line (`fill_prefix`), so a request's
    prefill overwrites the caches of the requests already decoding. It exists so the tests can show
    that the staggered schedule catches that bug while one prompt at a time does not."""

    def forward(self, weights: Weights, tokens: torch.Tensor, length: torch.Tensor, line: torch.Tensor,
                target_k: list[torch.Tensor], target_v: list[torch.Tensor],
                draft_k: list[torch.Tensor], draft_v: list[torch.Tensor]) -> torch.Tensor:
        first = super().forward(weights, tokens, length, line, target_k, target_v, draft_k, draft_v)
        for layers in (target_k, target_v, draft_k, draft_v):
            for cache in layers:  # [tp, B, heads, S, hd]: the prompt's line copied over every line
                cache.copy_(cache.index_select(1, line).expand_as(cache))
        return first


def test_a_context_program_that_writes_every_line_fails_the_schedule(
        build_tiny: Callable[..., Path], tmp_path: Path, tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    copy = tmp_path / "artifact"
    shutil.copytree(build_tiny(**BATCHED), copy)
    runner = get_backend("cpu").load(copy)
    lay = runner.layout
    program = export_module("context_encoding", WritesEveryLine(lay.target, lay.draft), lay.target, lay.draft,
                            runner.weights, batch=lay.batch, context_len=lay.context_len,
                            cache_len=lay.cache_len, dtype=lay.torch_dtype)
    save_program(program, copy / "programs", "context_encoding", aot_inductor=False)
    broken = get_backend("cpu").load(copy)

    # one prompt at a time it is right: no other line is in use when a prefill overwrites them all
    assert [broken.generate([prompt], NEW_TOKENS).tokens[0] for prompt in tiny_prompts[:2]] == hf_reference[:2]
    schedule = staggered_schedule(len(tiny_prompts), requests=12, lines=4, seed=SEED)
    run = run_staggered(broken.batcher(), tiny_prompts, schedule, NEW_TOKENS)
    assert mismatches(run, hf_reference), "the schedule did not catch a context program that writes every line"


def test_the_schedule_is_deterministic_and_staggers_arrivals() -> None:
    schedule = staggered_schedule(8, requests=12, lines=4, seed=SEED)
    assert schedule == staggered_schedule(8, requests=12, lines=4, seed=SEED)
    assert schedule != staggered_schedule(8, requests=12, lines=4, seed=SEED + 1)
    steps = [a.step for a in schedule]
    assert steps == sorted(steps) and steps[0] == 0 and all(1 <= s < 24 for s in steps[1:])
    assert [a.request for a in schedule] == list(range(12))
    assert sorted(a.prompt for a in schedule[:8]) == list(range(8))  # a round deals every prompt once
    assert len({a.prompt for a in schedule[8:]}) == 4


def test_nonsense_schedules_and_runs_are_refused(build_tiny: Callable[..., Path],
                                                 cpu_runner: Callable[[Path], Any]) -> None:
    with pytest.raises(PromptError, match="needs at least one prompt, request and line"):
        staggered_schedule(0, requests=3, lines=2, seed=0)
    with pytest.raises(PromptError, match="spread=1 leaves no room to stagger arrivals"):
        staggered_schedule(3, requests=3, lines=2, seed=0, spread=1)
    batcher = cpu_runner(build_tiny(**BATCHED)).batcher()
    with pytest.raises(PromptError, match="the schedule uses prompt index 2 but only 2 prompts were given"):
        run_staggered(batcher, [[1], [2]], staggered_schedule(6, requests=6, lines=4, seed=0), 4)
    batcher.submit([1, 2], 4)
    with pytest.raises(PromptError, match="the batcher is already decoding or holding requests"):
        run_staggered(batcher, [[1], [2]], staggered_schedule(2, requests=2, lines=4, seed=0), 4)
