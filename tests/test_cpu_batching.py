"""Continuous batching on real exports of the tiny Qwen3 pair (compile/cpu/batching.py): a request is
admitted into a free line while others decode and never touches their lines; requests that end at their
first token never hold a line; lines freed by EOS, length or cancel are reused; every call the batcher
cannot honour is refused, naming what is wrong."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fusedspec.compile.backend import get_backend
from fusedspec.compile.cpu.batching import ContinuousBatcher, NoFreeLineError, QueueFullError
from fusedspec.core.errors import ArtifactError, PromptError
from fusedspec.validate.staggered import coverage_gaps, mismatches, run_staggered, staggered_schedule
from tests.fixtures.cpu_artifacts import NEW_TOKENS

COPY = {"tp": 1, "k": 7, "batch": 4, "draft": "copy"}  # shared with test_cpu_runner / test_cpu_equivalence
TWO_LINES = {"tp": 1, "k": 3, "batch": 2, "draft": "perturbed"}


def _drain(batcher: ContinuousBatcher) -> dict[Any, tuple[list[int], list[int], str]]:
    """Step until idle; every completed request's (tokens, accepted, reason)."""
    done = {}
    while not batcher.idle:
        for completion in batcher.step().completions:
            done[completion.request_id] = (list(completion.tokens), list(completion.accepted),
                                           completion.reason)
    return done


def test_a_prefill_leaves_every_other_line_untouched(build_tiny: Callable[..., Path],
                                                     cpu_runner: Callable[[Path], Any],
                                                     tiny_prompts: list[list[int]],
                                                     hf_reference: list[list[int]]) -> None:
    """Line 0 decodes; three requests are admitted into lines 1..3 between its steps. Line 0's K/V
    (both models) stay bit for bit what they were, and its tokens and steps are those it gets alone."""
    runner = cpu_runner(build_tiny(**COPY))
    alone = runner.batcher()
    alone.admit(tiny_prompts[4], NEW_TOKENS, request_id="a")
    expected = _drain(alone)["a"]
    assert expected[0] == hf_reference[4]

    batcher = runner.batcher()
    batcher.admit(tiny_prompts[4], NEW_TOKENS, request_id="a")
    batcher.step()
    for line, prompt in zip((1, 2, 3), (tiny_prompts[6], tiny_prompts[2], [9707]), strict=True):
        before = [cache[:, 0].clone() for layers in runner.caches for cache in layers]
        event = batcher.admit(prompt, NEW_TOKENS, request_id=f"other-{line}")
        assert event.line == line and event.prefill
        after = [cache[:, 0] for layers in runner.caches for cache in layers]
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), f"prefill into line {line}"
        batcher.step()
    done = _drain(batcher)
    assert done["a"] == expected
    assert done["other-1"][0] == hf_reference[6] and done["other-2"][0] == hf_reference[2]


def test_requests_that_end_at_their_first_token_never_hold_a_line(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    batcher = cpu_runner(build_tiny(**COPY)).batcher()
    event = batcher.admit(tiny_prompts[0], 1)
    assert event.tokens == (hf_reference[0][0],) and event.completion is not None
    assert (event.completion.reason, event.completion.accepted) == ("length", ())
    event = batcher.admit(tiny_prompts[1], NEW_TOKENS, eos_token_ids=[hf_reference[1][0]])
    assert event.completion is not None and event.completion.reason == "eos"
    assert batcher.free_lines == [0, 1, 2, 3] and batcher.idle
    report = batcher.step()  # nothing to decode: no step runs
    assert report.decoded == () and report.step_s == 0.0


def test_eos_on_the_first_step_ends_the_request_inside_that_step(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    ref = hf_reference[3]
    eos = ref[2]  # the copy draft at k=7 would accept 7 tokens; EOS cuts the step after 2
    assert eos not in ref[:2]
    batcher = cpu_runner(build_tiny(**COPY)).batcher()
    batcher.admit(tiny_prompts[3], NEW_TOKENS, eos_token_ids=[eos], request_id="r")
    report = batcher.step()
    (event,) = report.decoded
    assert event.tokens == tuple(ref[1:3]) and report.accepted == {event.line: 2}
    assert event.completion is not None and event.completion.reason == "eos"
    assert event.completion.tokens == tuple(ref[:3]) and event.completion.accepted == (2,)
    assert batcher.idle


def test_a_one_token_prompt_decodes_beside_long_ones(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    batcher = cpu_runner(build_tiny(**COPY)).batcher()
    batcher.admit(tiny_prompts[4], 20, request_id="long")
    batcher.step()
    batcher.admit([9707], 20, request_id="one")
    done = _drain(batcher)
    assert done["one"][0] == hf_greedy([9707], 20)
    assert done["long"][0] == hf_greedy(tiny_prompts[4], 20)


def test_when_every_line_is_busy_requests_wait_and_take_the_first_line_freed(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    batcher = cpu_runner(build_tiny(**COPY)).batcher(max_waiting=1)
    for i in range(4):
        assert batcher.admit(tiny_prompts[i], NEW_TOKENS, request_id=i).line == i
    with pytest.raises(NoFreeLineError, match=r"all 4 cache lines of this batch-4 artifact are decoding; "
                                              r"submit\(\) the request to queue it, or release a line first"):
        batcher.admit(tiny_prompts[4], NEW_TOKENS)
    batcher.submit(tiny_prompts[5], NEW_TOKENS, request_id=5)
    with pytest.raises(QueueFullError, match=r"the queue is full \(1 waiting, max_waiting=1\); retry when a "
                                             r"line frees up"):
        batcher.submit(tiny_prompts[6], NEW_TOKENS)

    cancelled = batcher.cancel(2)  # a client went away: line 2 is the next request's
    assert cancelled.reason == "cancelled" and cancelled.line == 2
    assert list(cancelled.tokens) == hf_reference[2][: len(cancelled.tokens)]
    report = batcher.step()
    assert [(e.request_id, e.line) for e in report.admitted] == [(5, 2)] and report.waiting == 0
    done = _drain(batcher)
    assert {i: done[i][0] for i in (0, 1, 3, 5)} == {i: hf_reference[i] for i in (0, 1, 3, 5)}


def test_a_batch_2_artifact_serves_100_requests_reusing_its_lines(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    runner = cpu_runner(build_tiny(**TWO_LINES))
    schedule = staggered_schedule(len(tiny_prompts), requests=100, lines=2, seed=7, spread=60)  # busy lines
    run = run_staggered(runner.batcher(), tiny_prompts, schedule, 8)
    assert len(run.results) == 100 and coverage_gaps(run) == [] and run.reused_lines == 98
    assert mismatches(run, [ref[:8] for ref in hf_reference]) == []
    assert {r.line for r in run.results} == {0, 1}


def test_bad_calls_are_refused_naming_what_is_wrong(build_tiny: Callable[..., Path],
                                                    cpu_runner: Callable[[Path], Any]) -> None:
    runner = cpu_runner(build_tiny(**COPY))  # seq_len 128, context 128, batch 4
    batcher = runner.batcher()
    with pytest.raises(PromptError, match="line 1 is not decoding a request \\(it is free\\); nothing to "
                                          "release"):
        batcher.release(1)
    with pytest.raises(PromptError, match=r"line 4 is not a cache line of this artifact \(0..3\)"):
        batcher.release(4)
    with pytest.raises(PromptError, match=r"line 4 is not a cache line of this artifact \(0..3\)"):
        runner.prefill(4, [1, 2])
    with pytest.raises(PromptError, match="request 'gone' is neither waiting nor decoding"):
        batcher.cancel("gone")
    with pytest.raises(PromptError, match=r"the prompt has 129 tokens but this artifact was compiled for "
                                          r"prompts of at most 128"):
        batcher.admit([5] * 129, 4)
    with pytest.raises(PromptError, match=r"the prompt has 100 tokens \+ max_new_tokens=29 = 129 > "
                                          r"seq_len=128"):
        batcher.submit([5] * 100, 29)
    with pytest.raises(PromptError, match="the prompt is empty"):
        batcher.submit([], 4)
    with pytest.raises(PromptError, match="max_new_tokens=0 must be a positive integer"):
        batcher.admit([1], 0)
    batcher.submit([1, 2], 4, request_id="x")
    with pytest.raises(PromptError, match="request id 'x' is already in flight"):
        batcher.admit([1, 2], 4, request_id="x")
    assert batcher.waiting == 1 and batcher.free_lines == [0, 1, 2, 3]  # nothing was half-admitted
    with pytest.raises(PromptError, match=r"max_waiting=-1 must be a non-negative integer or None"):
        runner.batcher(max_waiting=-1)

    runner.generate([[1, 2]], 2)  # takes the caches over: the old batcher must not decode from them
    with pytest.raises(PromptError, match="taken over by another batcher or generate\\(\\) on the same "
                                          "runner"):
        batcher.step()


def test_plain_greedy_needs_the_target_alone_programs(build_tiny: Callable[..., Path],
                                                      cpu_runner: Callable[[Path], Any]) -> None:
    with pytest.raises(ArtifactError, match=r"no target-alone programs.*compile option target_alone: true"):
        cpu_runner(build_tiny(**COPY)).batcher(speculate=False)


def test_an_artifact_whose_context_programs_prefill_a_whole_batch_is_refused(build_tiny: Callable[..., Path],
                                                                          tmp_path: Path) -> None:
    """cpu code version 2 built context programs over the whole batch; the runner cannot admit one
    request at a time with them, so loading says to rebuild."""
    copy = tmp_path / "artifact"
    shutil.copytree(build_tiny(**COPY), copy)
    description = json.loads((copy / "build.json").read_text())
    del description["cpu"]["ctx_batch_size"]
    (copy / "build.json").write_text(json.dumps(description))
    with pytest.raises(ArtifactError, match=r"context programs prefill a whole batch at once "
                                            r"\(ctx_batch_size absent; built by an older fusedspec\).*"
                                            r"rebuild it"):
        get_backend("cpu").load(copy)
