"""Attacks on the greedy gate with crafted runners and batchers (fault injection, not backends): each
artifact here is wrong in one way a passing gate must not hide, and the gate must fail, or say plainly
what it did not check."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fusedspec.compile.backend import read_build_description
from fusedspec.compile.documents.validation import GATE_VERSION, VALIDATION_FILE, ValidationDocument
from fusedspec.core.errors import ArtifactError, GreedyMismatchError
from fusedspec.core.settings import Settings, load_settings
from fusedspec.flows.pipeline import passed_validation
from fusedspec.registry.publish import prepare
from fusedspec.validate.greedy import NearTieWarning, artifact_content_hash, check_greedy
from fusedspec.validate.reference import PromptReference, Reference
from fusedspec.validate.staggered_gate import check_staggered
from tests.test_greedy_compare import EOS, ListRunner, _reference
from tests.test_staggered import ReplayBatcher, ReplayBatcherRunner

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
            return (submit(prompt, max_new_tokens, eos, request_id=request_id) if request_id == 0
                    else request_id)

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
    section = check_staggered(ReplayBatcherRunner({(1,): [5, 6, 7]}), ONE, tolerance=0.25,
                              alone={"a": [5, 6, 7]})
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
    assert (not section.passed
            and "no context encoding ran while another request was decoding" in section.summary)
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


# ---- a validation.json reused by the pipeline, or published: checked against the artifact ---------------


def _reusable(tmp_path: Path) -> tuple[Path, Any, Settings, ValidationDocument]:
    """A fake artifact with the validation.json this gate would write for it (no gate run), the plan and
    settings a pipeline run would reuse it under."""
    from tests.fixtures.fake_artifacts import make_artifact, write_vouching_validation

    settings = replace(load_settings(), work_dir=tmp_path / "work")
    artifact = make_artifact(tmp_path / "artifact", weight_mib=0.01, validation=False)
    description = read_build_description(artifact)
    document = write_vouching_validation(artifact, description.key, description.spec)
    assert document.content_hash == artifact_content_hash(artifact, settings)  # what the gate would record
    plan = SimpleNamespace(prompt_set=SimpleNamespace(hash=document.prompt_set_hash), cost_ratio=None,
                           config=SimpleNamespace(validation=SimpleNamespace(max_new_tokens=8,
                                                                             near_tie_tolerance=None)))
    return artifact, plan, settings, document


def test_an_honest_validation_is_reused_and_published(tmp_path: Path) -> None:
    artifact, plan, settings, _ = _reusable(tmp_path)
    assert passed_validation(artifact, read_build_description(artifact), plan, settings) is not None
    assert prepare(artifact, settings, unvalidated=False).validation is not None


@pytest.mark.parametrize("craft", [
    pytest.param(lambda d: {"gate_version": None}, id="older-gate"),
    pytest.param(lambda d: {"gate_version": GATE_VERSION - 1}, id="other-gate-version"),
    pytest.param(lambda d: {"greedy": d.greedy.model_copy(update={
        "passed": False, "counts": d.greedy.counts.model_copy(update={"mismatches": 1})})},
        id="failed-marked-passed"),
    pytest.param(lambda d: {"spec": d.spec.model_copy(update={"dtype": "bfloat16"}),
                            "greedy": d.greedy.model_copy(update={"tolerance": 0.25})},
                 id="loosened-tolerance"),
    pytest.param(lambda d: {"key": "f" * 64}, id="another-build"),
    pytest.param(lambda d: {"content_hash": "sha256:" + "0" * 64}, id="other-content"),
])
def test_a_crafted_or_stale_validation_is_neither_reused_nor_published(
        tmp_path: Path, craft: Callable[[Any], dict[str, Any]]) -> None:
    """One rule for both (compile.validated): what a run would not reuse, publishing does not call
    validated."""
    artifact, plan, settings, document = _reusable(tmp_path)
    document.model_copy(update=craft(document)).write(artifact / VALIDATION_FILE)
    # validated again, never reused
    assert passed_validation(artifact, read_build_description(artifact), plan, settings) is None
    with pytest.raises(ArtifactError, match=r"validation.json says passed but .*; validate it again"):
        prepare(artifact, settings, unvalidated=False)
    assert prepare(artifact, settings, unvalidated=True).validation is None  # allowed: published unvalidated


def test_an_artifact_changed_after_validation_is_neither_reused_nor_published(tmp_path: Path) -> None:
    artifact, plan, settings, _ = _reusable(tmp_path)
    shard = artifact / "weights" / "tp0_sharded_checkpoint.safetensors"
    shard.write_bytes(shard.read_bytes()[::-1])  # a perturbed shard under a report of the original
    assert passed_validation(artifact, read_build_description(artifact), plan, settings) is None
    with pytest.raises(ArtifactError, match="changed since validation.json was written"):
        prepare(artifact, settings, unvalidated=False)


def test_a_failed_validation_marked_passed_is_not_published(tmp_path: Path) -> None:
    artifact, _, settings, document = _reusable(tmp_path)
    counts = document.greedy.counts.model_copy(update={"mismatches": 2})
    document.model_copy(update={"greedy": document.greedy.model_copy(update={"counts": counts})}).write(
        artifact / VALIDATION_FILE)
    with pytest.raises(ArtifactError, match="says passed but its greedy section failed"):
        prepare(artifact, settings, unvalidated=False)


def test_an_artifact_taking_the_other_side_of_every_near_tie_passes_but_says_so() -> None:
    """Fault injection: at token 0 of every prompt the artifact takes the reference's runner-up (a near-tie
    by construction), and is otherwise right. No ceiling (docs/design.md says why), but every tie is warned
    about and the summary line counts them against the prompts."""
    tied = Reference(key="k", dtype="bfloat16", max_new_tokens=3, eos_token_ids=(EOS,), implementation={},
                     prompts=tuple(PromptReference(id=f"p{i}", cls="x", prompt_ids=(i,), tokens=(5, 6, 7),
                                                   margins=(0.0625, 1.0, 1.0), runner_up=(50, 0, 0))
                                   for i in range(3)), seconds=0.0)
    runner = ListRunner([[50, 1, 1]] * 3, {(i, 5): [6, 7] for i in range(3)})
    with pytest.warns(NearTieWarning) as caught:
        report = check_greedy(runner, tied)
    assert len([w for w in caught if issubclass(w.category, NearTieWarning)]) == 3
    assert report.passed and report.tokens_compared == report.tokens_generated == 9
    assert "3 prompts, 0 exact, 3 near-tie(s) in 3 prompt(s), 0 mismatch(es)" in report.summary()
    assert report.section().counts.near_ties == 3


class Vocab:
    """A stand-in tokenizer of 100 tokens that, like a fast Hugging Face tokenizer, cannot decode an id
    outside its vocabulary (OverflowError for a negative or huge one)."""

    def __len__(self) -> int:
        return 100

    def decode(self, ids: list[int]) -> str:
        if not all(0 <= i < 2**32 for i in ids):
            raise OverflowError("out of range integral type conversion attempted")
        return "".join(f"<{i}>" for i in ids)


@pytest.mark.parametrize("bad", [-1, 10**12])
def test_a_token_outside_the_vocabulary_is_a_reported_mismatch_not_a_crash(bad: int) -> None:
    # Fault injection: right to the last token, then an id no tokenizer has.
    runner = ListRunner([[5, 6, 7, bad], [4, 4, EOS]])
    with pytest.raises(GreedyMismatchError, match="not in the vocabulary") as info:
        check_greedy(runner, _reference(), tokenizer=Vocab())
    bad_row = info.value.report.mismatches[0]
    assert (bad_row.id, bad_row.position, bad_row.got, bad_row.expected_text) == ("a:raw", 3, bad, "<8>")
    assert info.value.report.tokens_compared == info.value.report.tokens_generated == 7


@pytest.mark.parametrize("bad", [8.0, 8.5, "8", True])
def test_a_token_that_is_not_an_integer_breaks_the_runner_contract(bad: object) -> None:
    # Fault injection: 8.0 == 8 would otherwise pass as the reference's token.
    runner = ListRunner([[5, 6, 7, bad], [4, 4, EOS]])  # type: ignore[list-item]
    with pytest.raises(ArtifactError, match="not an integer token id"):
        check_greedy(runner, _reference())
