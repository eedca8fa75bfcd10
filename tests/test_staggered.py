"""The staggered-arrival schedule (validate/staggered.py): a batch-4 artifact serving 12 requests that
arrive at seeded random steps, lines reused, gives every request the target's greedy tokens and the
acceptance teacher forcing predicts, speculating or not; a context program that writes every cache line
passes one prompt at a time but fails the schedule; the schedule is deterministic and refuses nonsense.
The greedy gate runs the schedule for every batch > 1 artifact (validate/staggered_gate.py): a sound
batch-4 artifact passes it with every token compared, the broken context program fails the gate
(`fusedspec validate` exits 1, nothing passes), and where it cannot run it says why."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fusedspec.compile.backend import get_backend
from fusedspec.compile.cpu.export import export_module, save_program
from fusedspec.compile.cpu.model import Weights
from fusedspec.compile.cpu.programs import ContextEncoding
from fusedspec.compile.documents.validation import VALIDATION_FILE, ValidationDocument
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import PromptError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.validate.reference import Reference
from fusedspec.validate.staggered import coverage_gaps, mismatches, run_staggered, staggered_schedule
from fusedspec.validate.staggered_gate import check_staggered
from tests.fixtures.cpu_artifacts import NEW_TOKENS, predicted_steps

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


@pytest.fixture(scope="module")
def writes_every_line(build_tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the BATCHED artifact whose context program is WritesEveryLine."""
    copy = tmp_path_factory.mktemp("writes-every-line") / "artifact"
    shutil.copytree(build_tiny(**BATCHED), copy)
    runner = get_backend("cpu").load(copy)
    lay = runner.layout
    program = export_module("context_encoding", WritesEveryLine(lay.target, lay.draft), lay.target, lay.draft,
                            runner.weights, batch=lay.batch, context_len=lay.context_len,
                            cache_len=lay.cache_len, dtype=lay.torch_dtype)
    save_program(program, copy / "programs", "context_encoding", aot_inductor=False)
    return copy


def test_a_context_program_that_writes_every_line_fails_the_schedule(
        writes_every_line: Path, tiny_prompts: list[list[int]], hf_reference: list[list[int]]) -> None:
    broken = get_backend("cpu").load(writes_every_line)

    # one prompt at a time it is right: no other line is in use when a prefill overwrites them all
    assert [broken.generate([prompt], NEW_TOKENS).tokens[0]
            for prompt in tiny_prompts[:2]] == hf_reference[:2]
    schedule = staggered_schedule(len(tiny_prompts), requests=12, lines=4, seed=SEED)
    run = run_staggered(broken.batcher(), tiny_prompts, schedule, NEW_TOKENS)
    assert mismatches(run, hf_reference), \
        "the schedule did not catch a context program that writes every line"


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


# ---- the gate runs the schedule --------------------------------------------------------------------

GATE_PROMPTS = [  # 3 prompts x raw,chat = 6 validation prompts: the schedule makes 3 x 4 = 12 requests
    {"id": "rep", "class": "repeat", "text": "Repeat this line 3 times: all work and no play"},
    {"id": "code", "class": "code", "text": "def add(a, b):"},
    {"id": "story", "class": "prose", "text": "Once upon a time, in a quiet village,"},
]
GATE_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gate_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gate-prompts") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in GATE_PROMPTS))
    return path


def test_the_gate_runs_the_schedule_on_a_batched_artifact(build_tiny: Callable[..., Path],
                                                          cpu_settings: Settings, tiny_target: Path,
                                                          tiny_drafts: dict[str, Path], gate_prompts: Path,
                                                          tmp_path: Path) -> None:
    from fusedspec.compile.backend import read_build_description
    from fusedspec.validate.greedy import ValidationRequest, validate_artifact
    from fusedspec.validate.prompts import load_prompt_set

    artifact = tmp_path / "artifact"  # a copy sharing file data: validation.json is written into it
    shutil.copytree(build_tiny(**BATCHED), artifact, copy_function=os.link)
    result = validate_artifact(ValidationRequest(artifact, read_build_description(artifact), tiny_target,
                                                 tiny_drafts["cut"], load_prompt_set(str(gate_prompts)),
                                                 max_new_tokens=GATE_NEW_TOKENS, advice=False), cpu_settings)
    staggered = result.document.staggered
    assert result.passed and staggered is not None and staggered.ran and staggered.passed, staggered
    assert (staggered.requests, staggered.lines, staggered.mismatches, staggered.near_ties) == (12, 4, 0, 0)
    assert staggered.reused_lines >= 8 and staggered.admitted_while_decoding > 0 and \
        staggered.coverage_gaps == []
    assert staggered.tokens_compared == staggered.tokens_generated > 0
    counts = result.document.greedy.counts
    assert counts.tokens_compared == counts.tokens_generated == \
        sum(len(p.tokens) for p in result.reference.prompts)
    written = ValidationDocument.read(artifact / VALIDATION_FILE)
    assert written.staggered == staggered and written.passed


def test_a_context_program_that_writes_every_line_fails_the_gate(writes_every_line: Path, gate_prompts: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", str(writes_every_line), "--prompts", str(gate_prompts), "--max-new-tokens",
                 str(GATE_NEW_TOKENS), "--no-advice"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "staggered batching FAILED" in err and "mismatch at new token" in err
    written = ValidationDocument.read(writes_every_line / VALIDATION_FILE)
    assert written.passed is False
    # The gate's own run fails it too: generate() fills several lines in a row, each prefill overwriting
    # the others. The staggered requests, arriving while others decode, fail it on their own.
    assert written.staggered is not None and written.staggered.ran and not written.staggered.passed
    assert written.staggered.mismatches > 0 and written.staggered.requests == 12


class NoBatcherRunner:
    """A runner shaped like the neuron one: it generates, but has no continuous batcher to drive."""

    continuous_batching = False

    def __init__(self, batch: int):
        self.spec = BuildSpec(1, 128, 4, batch, "bfloat16", "neuron")
        self.description = SimpleNamespace(backend="neuron")
        self.lines = batch


def test_the_check_says_why_it_did_not_run() -> None:
    reference = Reference(key="k", dtype="bfloat16", max_new_tokens=2, eos_token_ids=(9,), implementation={},
                          prompts=(), seconds=0.0)
    neuron = check_staggered(NoBatcherRunner(4), reference, tolerance=0.25, alone={})
    assert not neuron.ran and neuron.passed and "exposes no continuous batcher" in (neuron.skipped or "")
    assert neuron.summary.startswith("staggered batching skipped: the neuron runner")
    single = check_staggered(NoBatcherRunner(1), reference, tolerance=0.25, alone={})
    assert not single.ran and "batch 1: one cache line" in (single.skipped or "")


class ReplayBatcherRunner:
    """A crafted runner (fault injection, not a backend) whose batcher replays scripted tokens per prompt,
    so the gate's staggered verdicts can be shown on near-ties without finding one in a real model."""

    continuous_batching = True
    lines = 2

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]):
        self.spec = BuildSpec(1, 128, 4, 2, "bfloat16", "cpu")
        self.description = SimpleNamespace(backend="cpu")
        self.outputs = outputs

    def batcher(self) -> Any:
        return ReplayBatcher(self.outputs)


class ReplayBatcher:
    """ContinuousBatcher's surface as run_staggered drives it: a request is admitted into a free line
    (of 2) and ends, with its scripted tokens, at the next step, so later requests are admitted while it
    holds its line, and lines are reused."""

    lines = 2

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]):
        self.outputs = outputs
        self.queue: list[tuple[int, tuple[int, ...]]] = []
        self.held: dict[int, tuple[int, tuple[int, ...]]] = {}  # line -> request

    @property
    def active_lines(self) -> list[int]:
        return sorted(self.held)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.held

    def submit(self, prompt: list[int], max_new_tokens: int, eos: Any, *, request_id: int) -> int:
        self.queue.append((request_id, tuple(prompt)))
        return request_id

    def step(self) -> Any:
        admitted = []
        for line in range(self.lines):
            if line not in self.held and self.queue:
                self.held[line] = self.queue.pop(0)
                admitted.append(SimpleNamespace(request_id=self.held[line][0], line=line, completion=None))
        done = [self.held.pop(line)
                for line in [ln for ln in self.held if ln not in {a.line for a in admitted}]]
        completions = [SimpleNamespace(request_id=request_id, tokens=tuple(self.outputs[prompt]), accepted=(),
                                       reason="length") for request_id, prompt in done]
        return SimpleNamespace(admitted=admitted, completions=completions)


def test_staggered_requests_at_a_near_tie_are_near_ties_and_must_then_follow_the_lone_run() -> None:
    from fusedspec.validate.reference import PromptReference

    reference = Reference(key="k", dtype="bfloat16", max_new_tokens=3, eos_token_ids=(9,), implementation={},
                          prompts=(PromptReference(id="a", cls="x", prompt_ids=(1,), tokens=(5, 6, 7),
                                                   margins=(0.01, 1.0, 1.0), runner_up=(50, 0, 0)),),
                          seconds=0.0)
    tie_then_lone = check_staggered(ReplayBatcherRunner({(1,): [50, 3, 4]}), reference, tolerance=0.25,
                                    alone={"a": [50, 3, 4]})
    assert tie_then_lone.requests == 6  # 3 per line
    assert tie_then_lone.passed and (tie_then_lone.near_ties, tie_then_lone.mismatches) == (6, 0)
    assert tie_then_lone.tokens_compared == tie_then_lone.tokens_generated == 18
    tie_then_other = check_staggered(ReplayBatcherRunner({(1,): [50, 3, 8]}), reference, tolerance=0.25,
                                     alone={"a": [50, 3, 4]})
    assert not tie_then_other.passed and tie_then_other.mismatches == 6
    assert "differs from the artifact's own output run alone at new token 2" in tie_then_other.details[0]
    other_side = check_staggered(ReplayBatcherRunner({(1,): [50, 3, 4]}), reference, tolerance=0.25,
                                 alone={"a": [5, 6, 7]})
    assert other_side.passed and other_side.tokens_compared == 6 and "2 tokens after it not compared" in \
        other_side.details[0]


def test_a_batcher_that_keeps_a_reused_lines_cache_length_fails_the_gates_check(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection in the real cpu batcher: a line reused by a later request keeps the cache length
    its previous request ended at (not reset at admission), so the new request attends to stale entries.
    Requests on fresh lines stay right; the gate's staggered check must fail on the reused ones."""
    from fusedspec.compile.cpu.batching import ContinuousBatcher
    from fusedspec.validate.reference import PromptReference

    prefill, advance = ContinuousBatcher._prefill, ContinuousBatcher._advance
    ended_at: dict[tuple[int, int], int] = {}  # (batcher, line) -> cache length its last request ended at

    def leaky_prefill(self: ContinuousBatcher, line: int, request: Any) -> Any:
        event = prefill(self, line, request)
        slot = self._slots[line]
        if slot is not None and (id(self), line) in ended_at:
            slot.pos = max(slot.pos, ended_at[id(self), line])
        return event

    def recording_advance(self: ContinuousBatcher, line: int, greedy: list[int], accepted: int) -> Any:
        pos = self._slots[line].pos + accepted  # type: ignore[union-attr]
        event = advance(self, line, greedy, accepted)
        if event.completion is not None:
            ended_at[id(self), line] = pos
        return event

    monkeypatch.setattr(ContinuousBatcher, "_prefill", leaky_prefill)
    monkeypatch.setattr(ContinuousBatcher, "_advance", recording_advance)
    runner = get_backend("cpu").load(build_tiny(**BATCHED))
    # a prefix of the greedy reference is the greedy reference for fewer tokens (kept short: time)
    new_tokens = 8
    assert all(len(tokens) >= new_tokens for tokens in hf_reference[:2])
    prompts = tuple(PromptReference(id=f"p{i}", cls="x", prompt_ids=tuple(p),
                                    tokens=tuple(hf_reference[i][:new_tokens]),
                                    margins=(10.0,) * new_tokens, runner_up=(0,) * new_tokens)
                    for i, p in enumerate(tiny_prompts[:2]))
    reference = Reference(key="k", dtype="float32", max_new_tokens=new_tokens,
                          eos_token_ids=tuple(sorted(runner.target_eos())), implementation={},
                          prompts=prompts, seconds=0.0)
    section = check_staggered(runner, reference, tolerance=1e-4,
                              alone={p.id: list(p.tokens) for p in prompts})
    assert not section.passed and section.mismatches > 0 and section.reused_lines > 0, section.summary
    assert section.exact > 0  # requests on fresh lines are right: only reuse shows the leak
