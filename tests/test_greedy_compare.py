"""The comparison rules of the greedy gate on hand-made outputs (the backend-free half of the gate), and
its continuation past near-ties: the artifact is run again on the reference's tokens through each tie,
so every token of every prompt is compared."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fusedspec.compile.backend import Generation
from fusedspec.core.errors import GreedyMismatchError
from fusedspec.validate.greedy import (
    DEFAULT_TOLERANCES,
    CoverageWarning,
    NearTieWarning,
    check_greedy,
    compare,
    default_tolerance,
)
from fusedspec.validate.reference import PromptReference, Reference

EOS = 9


def _reference() -> Reference:
    prompts = (
        PromptReference(id="a:raw", cls="repeat", prompt_ids=(1, 2), tokens=(5, 6, 7, 8),
                        margins=(1.0, 0.02, 3.0, 2.0), runner_up=(50, 60, 70, 80)),
        PromptReference(id="b:chat", cls="prose", prompt_ids=(3,), tokens=(4, 4, EOS),
                        margins=(2.0, 2.0, 0.0), runner_up=(40, 41, 42),
                        candidates=(((40, 2.0),), ((41, 2.0),), ((42, 0.0), (43, 0.0), (44, 0.3)))),
    )
    return Reference(key="k", dtype="bfloat16", max_new_tokens=4, eos_token_ids=(EOS,),
                     implementation={}, prompts=prompts, seconds=0.0)


class ListRunner:
    """A crafted runner (fault injection, not a backend): it answers each prompt with the output the
    test scripted for it, so a test can make an artifact right up to a near-tie and right or wrong after
    it. `more` maps a continuation's prompt (the prompt plus the reference's tokens through a tie) to
    what the artifact answers; any other call gets `tokens`, the outputs for the reference's prompts."""

    def __init__(self, tokens: list[list[int]], more: dict[tuple[int, ...], list[int]] | None = None):
        self.first, self.more = tokens, more or {}
        # what the gate reads
        self.description = SimpleNamespace(spec=SimpleNamespace(seq_len=64), options={})
        self.calls: list[tuple[list[list[int]], int, list[int] | None]] = []

    def generate(self, prompts, max_new_tokens, eos_token_ids=None):  # noqa: ANN001, ANN201
        self.calls.append((prompts, max_new_tokens, eos_token_ids))
        continuation = all(tuple(p) in self.more for p in prompts)
        tokens = [self.more[tuple(p)] for p in prompts] if continuation else self.first
        return Generation(tokens=tokens, accepted=[[1] * (len(t) - 1) for t in tokens])


def test_exact_match_passes_and_the_runner_gets_the_reference_inputs() -> None:
    runner = ListRunner([[5, 6, 7, 8], [4, 4, EOS]])
    report = check_greedy(runner, _reference())
    assert report.passed and [p.status for p in report.prompts] == ["match", "match"]
    assert runner.calls == [([[1, 2], [3]], 4, [EOS])]
    assert report.tolerance == DEFAULT_TOLERANCES["bfloat16"] == default_tolerance("bf16")


def test_flip_to_the_runner_up_under_the_margin_is_a_near_tie() -> None:
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]], {(1, 2, 5, 6): [7, 8]})
    with pytest.warns(NearTieWarning, match="a:raw"):
        report = check_greedy(runner, _reference(), tolerance=0.05)
    assert report.passed and len(report.near_ties) == 1
    tie = report.near_ties[0]
    assert (tie.position, tie.expected, tie.got, tie.margin) == (1, 6, 60, 0.02)
    with pytest.raises(GreedyMismatchError, match="a:raw") as info:
        check_greedy(runner, _reference(), tolerance=0.01)
    assert info.value.report.mismatches[0].position == 1 and info.value.exit_code == 1


def test_flip_to_another_token_or_above_the_margin_fails() -> None:
    other = compare(Generation(tokens=[[5, 61, 1, 1], [4, 4, EOS]], accepted=[[], []]), _reference(),
                    tolerance=0.05)
    assert [p.status for p in other.prompts] == ["mismatch", "match"]  # 61 is not the runner-up
    above = compare(Generation(tokens=[[5, 6, 7, 8], [4, 4, 44]], accepted=[[], []]), _reference(),
                    tolerance=0.25)
    assert above.mismatches[0].id == "b:chat" and above.mismatches[0].gap == 0.3


def test_a_gap_of_exactly_the_tolerance_is_a_near_tie() -> None:
    """bf16 margins are whole ULPs, so a flip lands exactly on a tolerance that is a whole number of them
    (the real 1.5B pair's batch-4 build flipped a margin of exactly 0.25): that is a tie; a gap above is
    not."""
    exact = compare(Generation(tokens=[[5, 6, 7, 8], [4, 4, 44]], accepted=[[], []]), _reference(),
                    tolerance=0.3)
    assert exact.passed and exact.near_ties[0].gap == 0.3
    above = compare(Generation(tokens=[[5, 6, 7, 8], [4, 4, 44]], accepted=[[], []]), _reference(),
                    tolerance=0.29)
    assert not above.passed and above.mismatches[0].gap == 0.3


def test_any_token_of_a_multi_way_tie_is_a_near_tie() -> None:
    # Coarse bf16 logits: 42 and 43 tie exactly with EOS at the last position.
    for token in (42, 43):
        report = compare(Generation(tokens=[[5, 6, 7, 8], [4, 4, token]], accepted=[[], []]), _reference(),
                         tolerance=0.25)
        assert report.passed and report.near_ties[0].gap == 0.0
    assert compare(Generation(tokens=[[5, 6, 7, 8], [4, 4, 44]], accepted=[[], []]), _reference(),
                   tolerance=0.5).near_ties[0].gap == 0.3


@pytest.mark.parametrize("got, position, expected, token", [
    ([5, 6, 7], 3, 8, None),  # stopped one short without EOS
    ([4, 4], 2, EOS, None),  # missed the EOS at the end
])
def test_length_differences_are_mismatches(got: list[int], position: int, expected: int,
                                           token: int | None) -> None:
    ref = _reference()
    outputs = [got, [4, 4, EOS]] if got[0] == 5 else [[5, 6, 7, 8], got]
    report = compare(Generation(tokens=outputs, accepted=[[], []]), ref, tolerance=10.0)
    bad = report.mismatches
    assert len(bad) == 1 and (bad[0].position, bad[0].expected, bad[0].got) == (position, expected, token)
    assert "(output ended)" in bad[0].describe()


def test_continuing_past_eos_is_a_mismatch() -> None:
    ref = Reference(key="k", dtype="float32", max_new_tokens=5, eos_token_ids=(EOS,), implementation={},
                    prompts=(PromptReference(id="c:raw", cls="x", prompt_ids=(1,), tokens=(4, EOS),
                                             margins=(1.0, 1.0), runner_up=(0, 0)),), seconds=0.0)
    report = compare(Generation(tokens=[[4, EOS, 3]], accepted=[[]]), ref, tolerance=1.0)
    assert report.mismatches[0].position == 2 and report.mismatches[0].expected is None


# ---- past a near-tie: every token compared ---------------------------------------------------------


def test_a_correct_continuation_after_a_near_tie_compares_every_token() -> None:
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]], {(1, 2, 5, 6): [7, 8]})
    with pytest.warns(NearTieWarning, match="a:raw"):
        report = check_greedy(runner, _reference(), tolerance=0.05)
    # the artifact ran again from the prompt plus the reference's tokens through the tie, for the rest
    assert runner.calls[1] == ([[1, 2, 5, 6]], 2, [EOS])
    assert report.passed and (report.tokens_compared, report.tokens_generated) == (7, 7)
    assert report.coverage["a:raw"].compared == 4 and report.coverage["a:raw"].not_compared is None
    section = report.section()
    assert (section.counts.tokens_compared, section.counts.tokens_generated,
            section.counts.near_ties) == (7, 7, 1)
    assert "tokens compared 7 of 7 generated" in report.summary()


def test_an_artifact_exact_to_a_near_tie_and_wrong_after_it_fails() -> None:
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]], {(1, 2, 5, 6): [7, 1]})  # 1 is not close to 8
    with (pytest.warns(NearTieWarning, match="a:raw"),
          pytest.raises(GreedyMismatchError, match="a:raw") as info):
        check_greedy(runner, _reference(), tolerance=0.05)
    report = info.value.report
    bad = report.mismatches[0]
    assert (bad.id, bad.position, bad.expected, bad.got, bad.continued_from) == ("a:raw", 3, 8, 1, 2)
    assert "run on the reference's tokens through new token 1" in bad.describe()
    assert len(report.near_ties) == 1 and report.tokens_compared == report.tokens_generated == 7


def test_every_near_tie_is_continued_and_counted() -> None:
    ties = Reference(key="k", dtype="bfloat16", max_new_tokens=4, eos_token_ids=(EOS,), implementation={},
                     prompts=(PromptReference(id="t:raw", cls="x", prompt_ids=(1,), tokens=(5, 6, 7, 8),
                                              margins=(1.0, 0.02, 0.01, 2.0), runner_up=(50, 60, 70, 80)),),
                     seconds=0.0)
    runner = ListRunner([[5, 60, 2, 2]], {(1, 5, 6): [70, 3], (1, 5, 6, 7): [8]})
    with pytest.warns(NearTieWarning):
        report = check_greedy(runner, ties, tolerance=0.05)
    assert [(t.position, t.got, t.continued_from) for t in report.near_ties] == [(1, 60, None), (2, 70, 2)]
    assert report.passed and report.tokens_compared == report.tokens_generated == 4
    assert report.section().counts.near_ties == 2 and report.prompts[0].status == "near-tie"


def test_a_tie_at_the_last_token_leaves_nothing_to_continue() -> None:
    runner = ListRunner([[5, 6, 7, 8], [4, 4, 42]])
    with pytest.warns(NearTieWarning, match="b:chat"):
        report = check_greedy(runner, _reference(), tolerance=0.25)
    assert len(runner.calls) == 1 and report.tokens_compared == report.tokens_generated == 7


def test_a_continuation_that_does_not_fit_the_artifact_is_reported_not_compared() -> None:
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]])
    with (pytest.warns(NearTieWarning),
          pytest.warns(CoverageWarning, match="a:raw: 2 of 4 tokens not compared")):
        report = check_greedy(runner, _reference(), tolerance=0.05, context_limit=3)  # [1, 2, 5, 6] is 4
    assert len(runner.calls) == 1 and report.passed
    assert (report.tokens_compared, report.tokens_generated) == (5, 7)
    assert "max_context_length 3" in (report.coverage["a:raw"].not_compared or "")
    row = next(r for r in report.section().prompts if r.id == "a:raw")
    assert (row.tokens_compared, row.tokens_generated) == (2, 4) and \
        "max_context_length 3" in (row.not_compared or "")
    assert "a:raw: 2 of 4 tokens not compared" in report.summary()


def test_a_validation_document_from_before_these_checks_still_parses() -> None:
    from fusedspec.compile.documents.validation import ValidationDocument
    from fusedspec.compile.spec import BuildSpec
    from tests.fixtures.fake_artifacts import passing_validation

    new = passing_validation("k" * 64, BuildSpec(1, 128, 3, 4, "float32", "cpu")).model_dump(mode="json")
    old = {key: value for key, value in new.items() if key != "staggered"}  # what the older gate wrote
    old["greedy"]["counts"] = {k: v for k, v in old["greedy"]["counts"].items()
                               if not k.startswith("tokens_")}
    document = ValidationDocument.model_validate(old)
    assert document.staggered is None and document.greedy.counts.tokens_compared is None and document.passed


def test_the_continuations_of_a_round_share_one_call_cut_to_their_own_length() -> None:
    ref = Reference(key="k", dtype="bfloat16", max_new_tokens=4, eos_token_ids=(EOS,), implementation={},
                    prompts=(PromptReference(id="x", cls="x", prompt_ids=(1,), tokens=(5, 6, 7, 8),
                                             margins=(0.01, 1.0, 1.0, 1.0), runner_up=(50, 0, 0, 0)),
                             PromptReference(id="y", cls="x", prompt_ids=(2,), tokens=(4, 4, 4, 4),
                                             margins=(1.0, 1.0, 0.01, 1.0), runner_up=(0, 0, 40, 0))),
                    seconds=0.0)
    # y's continuation asks for 1 token; in a call asking for 3 its extra tokens (99) are not its own
    runner = ListRunner([[50, 1, 1, 1], [4, 4, 40, 1]], {(1, 5): [6, 7, 8], (2, 4, 4, 4): [4, 99, 99]})
    with pytest.warns(NearTieWarning):
        report = check_greedy(runner, ref, tolerance=0.05)
    assert [(call[1], len(call[0])) for call in runner.calls] == [(4, 2), (3, 2)]
    assert report.passed and report.tokens_compared == report.tokens_generated == 8
