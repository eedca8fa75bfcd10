"""Attacks on the greedy gate with crafted runners and batchers (fault injection, not backends): each
artifact here is wrong in one way a passing gate must not hide, and the gate must fail, or say plainly
what it did not check."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from compile.errors import GreedyMismatchError
from tests.test_greedy_compare import EOS, ListRunner, _reference
from tests.test_staggered import ReplayBatcher, ReplayBatcherRunner
from validate.greedy import check_greedy
from validate.reference import PromptReference, Reference
from validate.staggered_gate import check_staggered

ONE = Reference(key="k", dtype="bfloat16", max_new_tokens=3, eos_token_ids=(9,), implementation={},
                prompts=(PromptReference(id="a", cls="x", prompt_ids=(1,), tokens=(5, 6, 7),
                                         margins=(1.0, 1.0, 1.0), runner_up=(50, 0, 0)),), seconds=0.0)


class DroppingRunner(ReplayBatcherRunner):
    """Fault injection: a batcher right for the request arriving alone at step 0 that silently drops every
    request arriving while another is decoding (never reports it admitted or completed)."""

    def batcher(self) -> Any:
        batcher = ReplayBatcher(self.outputs)
        submit = batcher.submit

        def drop_later(prompt: list[int], max_new_tokens: int, eos: Any, *, request_id: int) -> int:
            return submit(prompt, max_new_tokens, eos, request_id=request_id) if request_id == 0 else request_id

        batcher.submit = drop_later  # type: ignore[method-assign]
        return batcher


class SerialBatcher(ReplayBatcher):
    """Fault injection: a batcher that admits one request at a time and answers it at admission, so no
    context encoding ever runs while another request decodes: the run cannot show the bug class."""

    def step(self) -> Any:
        if not self.queue:
            return SimpleNamespace(admitted=[], completions=[])
        request_id, prompt = self.queue.pop(0)
        done = SimpleNamespace(request_id=request_id, tokens=tuple(self.outputs[prompt]), accepted=(),
                               reason="length")
        return SimpleNamespace(admitted=[SimpleNamespace(request_id=request_id, line=0, completion=done)],
                               completions=[done])


class SerialRunner(ReplayBatcherRunner):
    def batcher(self) -> Any:
        return SerialBatcher(self.outputs)


def test_a_sound_fake_batcher_passes_with_every_request_and_no_coverage_gap() -> None:
    section = check_staggered(ReplayBatcherRunner({(1,): [5, 6, 7]}), ONE, tolerance=0.25, alone={"a": [5, 6, 7]})
    assert section.passed and section.requests == 6 and section.exact == 6 and not section.coverage_gaps
    assert section.admitted_while_decoding > 0 and section.reused_lines > 0


def test_a_batcher_that_drops_staggered_requests_fails() -> None:
    section = check_staggered(DroppingRunner({(1,): [5, 6, 7]}), ONE, tolerance=0.25, alone={"a": [5, 6, 7]})
    assert not section.passed and section.requests == 6 and section.mismatches == 5
    assert "1 of 6 requests completed" in section.summary
    assert any("request 1 (a, arriving at step" in d and "never completed" in d for d in section.details)


def test_a_run_that_never_batches_cannot_pass_the_check() -> None:
    section = check_staggered(SerialRunner({(1,): [5, 6, 7]}), ONE, tolerance=0.25, alone={"a": [5, 6, 7]})
    assert section.exact == 6 and section.mismatches == 0  # every token right, yet batching never ran
    assert not section.passed and "no context encoding ran while another request was decoding" in section.summary
    assert any("cannot vouch" in d for d in section.details)


def test_a_continuation_longer_than_asked_is_never_cut_to_fit() -> None:
    # Fault injection: right through a near-tie and after it, then two tokens more than its call asked for.
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]], {(1, 2, 5, 6): [7, 8, 99, 99]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GreedyMismatchError, match="a:raw") as info:
            check_greedy(runner, _reference(), tolerance=0.05)
    bad = info.value.report.mismatches[0]
    assert (bad.position, bad.expected, bad.got, bad.continued_from) == (4, None, 99, 2)

