"""The comparison rules of the greedy gate on hand-made outputs (the backend-free half of the gate)."""

from __future__ import annotations

import pytest

from compile.backend import Generation
from compile.errors import GreedyMismatchError
from validate.greedy import DEFAULT_TOLERANCES, NearTieWarning, check_greedy, compare, default_tolerance
from validate.reference import PromptReference, Reference

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
    """A runner that replays fixed outputs: the comparison is under test here, not a backend."""

    def __init__(self, tokens: list[list[int]]):
        self.tokens = tokens
        self.calls: list[tuple[list[list[int]], int, list[int] | None]] = []

    def generate(self, prompts, max_new_tokens, eos_token_ids=None):  # noqa: ANN001, ANN201
        self.calls.append((prompts, max_new_tokens, eos_token_ids))
        return Generation(tokens=self.tokens, accepted=[[1] * (len(t) - 1) for t in self.tokens])


def test_exact_match_passes_and_the_runner_gets_the_reference_inputs() -> None:
    runner = ListRunner([[5, 6, 7, 8], [4, 4, EOS]])
    report = check_greedy(runner, _reference())
    assert report.passed and [p.status for p in report.prompts] == ["match", "match"]
    assert runner.calls == [([[1, 2], [3]], 4, [EOS])]
    assert report.tolerance == DEFAULT_TOLERANCES["bfloat16"] == default_tolerance("bf16")


def test_flip_to_the_runner_up_under_the_margin_is_a_near_tie() -> None:
    runner = ListRunner([[5, 60, 1, 1], [4, 4, EOS]])
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
