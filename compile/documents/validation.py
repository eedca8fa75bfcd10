"""validation.json: what the greedy gate found for one artifact, and the k advice computed with it.

Written by `validate.greedy.validate_artifact` into the artifact (atomically); read by the flow (reuse
of a passed gate, acceptance figures), by publishing (the manifest's summary) and by the run's report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from fusedspec.compile.documents.base import Document
from fusedspec.compile.spec import MAX_K, BuildSpec
from fusedspec.core.errors import ArtifactError, InputError

VALIDATION_FILE = "validation.json"
ADVICE_FILE = "advice.png"
# The gate's rules. Bump it whenever they change (what is compared, what fails, what the report must hold),
# so that a validation.json written under older rules is validated again rather than reused. 2: every token
# compared past near-ties, the staggered check fails on dropped requests and on a run that never batched,
# the content hash. 3: the k advice measured on the artifact (cost model source, decode speedup per class).
# 4: a gap equal to the near-tie tolerance is a tie (margins are whole ULPs), and the bf16 default is 0.5.
GATE_VERSION = 4
NOISY_SPREAD = 0.5
ARTIFACT_PROGRAMS = "this artifact's programs"  # StepTimesRecord.where: timed on the artifact, in validation
PromptStatus = Literal["match", "near-tie", "mismatch"]


class Part(Document):
    """A part of a document: strict like the whole; `class` is spelt `cls` in Python."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)


class PromptResult(Part):
    """The gate's verdict on one prompt. `position` is 0-based among the new tokens; None for a match."""

    id: str
    cls: str = Field(alias="class")
    status: PromptStatus
    n_expected: int
    n_got: int
    steps: int = Field(description="fused steps the artifact took")
    position: int | None = None
    expected: int | None = Field(default=None, description="reference token at position (None: it had ended)")
    got: int | None = Field(default=None, description="artifact token at position (None: it had ended)")
    expected_text: str | None = None
    got_text: str | None = None
    margin: float | None = Field(default=None, description="reference top-2 logit margin at position")
    runner_up: int | None = None
    gap: float | None = Field(default=None, description="reference logit gap of the artifact's token")
    prompt_text: str = ""
    continued_from: int | None = Field(
        default=None, description="new token the artifact was run from, teacher-forced through the "
                                  "reference's tokens before it (after an earlier near-tie); None: run from "
                                  "the prompt")

    def describe(self) -> str:
        if self.status == "match":
            return f"{self.id}: match ({self.n_got} tokens)"
        margin = "n/a" if self.margin is None else f"{self.margin:.3g}"
        gap = "not close" if self.gap is None else f"{self.gap:.3g}"

        def token(tid: int | None, text: str | None) -> str:
            return "(output ended)" if tid is None else f"{tid} {text!r}"

        prompt = self.prompt_text if len(self.prompt_text) <= 60 else self.prompt_text[:57] + "..."
        forced = ("" if self.continued_from is None
                  else f" (run on the reference's tokens through new token {self.continued_from - 1})")
        return (f"{self.id} [{self.cls}] {self.status} at new token {self.position}{forced}: reference "
                f"{token(self.expected, self.expected_text)}, artifact {token(self.got, self.got_text)}, "
                f"reference top-2 margin {margin}, artifact token's gap {gap}; prompt {prompt!r}")


class PromptRow(Part):
    """One prompt's verdict. The token counts are None in documents written before the gate compared
    past near-ties (then only the tokens up to the first near-tie were compared)."""

    id: str
    cls: str = Field(alias="class")
    status: PromptStatus
    n_tokens: int
    steps: int
    tokens_generated: int | None = Field(default=None, description="new tokens of the reference")
    tokens_compared: int | None = Field(default=None, description="of them, compared with the artifact's")
    not_compared: str | None = Field(default=None, description="why the rest was not compared")


class GreedyCounts(Part):
    """near_ties counts every near-tie (a prompt continued past one can have several); before the gate
    compared past near-ties, at most one per prompt. tokens_*: None in those older documents."""

    prompts: int
    exact: int
    near_ties: int
    mismatches: int
    tokens_generated: int | None = None
    tokens_compared: int | None = None


class GreedySection(Part):
    passed: bool
    summary: str
    tolerance: float
    dtype: str
    max_new_tokens: int
    reference_key: str
    counts: GreedyCounts
    mismatches: list[PromptResult]
    near_ties: list[PromptResult]
    prompts: list[PromptRow]
    runner_seconds: float | None = None


class StepsRow(Part):
    id: str
    predicted: int
    measured: int
    predicted_accepted: list[int]
    measured_accepted: list[int]


class AcceptanceSection(Part):
    """Predicted fused steps at the artifact's k against the runner's, per exactly matching prompt."""

    k: int
    steps_match: bool
    differing: list[str]
    compared: int
    prompts: list[StepsRow]

    def tokens_per_step(self) -> tuple[float | None, float | None]:
        """(measured, predicted) mean tokens per fused step over the compared prompts."""
        measured = [a for row in self.prompts for a in row.measured_accepted]
        predicted = [a for row in self.prompts for a in row.predicted_accepted]

        def mean(values: list[int]) -> float | None:
            return round(sum(values) / len(values), 3) if values else None

        return mean(measured), mean(predicted)


class KRow(Part):
    k: int
    prompts: int
    steps: int
    tokens: int
    proposed_draft_tokens: int
    accepted_draft_tokens: int
    tokens_per_step: float | None
    acceptance_rate: float | None
    speedup: float | None = None


class ClassAdviceRecord(Part):
    cls: str = Field(alias="class")
    agreement: float | None
    recommended_k: int | None
    best_speedup: float | None
    pays_off: bool
    by_k: list[KRow]


class CostModelRecord(Part):
    cost_ratio: float
    verify_slope: float
    source: str
    formula: str


class CostMeasurementRecord(Part):
    t_target_s: float
    t_draft_s: float
    cost_ratio: float
    verify_slope_measured: float
    verify_k: int


MAX_STEP_SAMPLES = 1000  # repeats of one step; more says nothing the median of fewer does not
# One step of any model this tool builds, on any hardware: above 0.1 us and below an hour. Outside that
# a time is a unit mistake (ns for s) or an overflow, and would make c infinite or zero.
StepSeconds = Annotated[float, Field(ge=1e-7, le=3600.0, allow_inf_nan=False)]
StepSamples = Annotated[list[StepSeconds], Field(min_length=1, max_length=MAX_STEP_SAMPLES)]


class StepTimesRecord(Part):
    """Seconds per call of the steps the cost model is computed from, every sample kept (interleaved
    repeats); also the format of a recorded device step-times file (`fusedspec advise --step-times`)."""

    where: str = Field(max_length=500, description="what was timed, e.g. \"this artifact's programs\"")
    k: int = Field(ge=2, le=MAX_K, description="the k of the fused step timed")
    target_step_s: StepSamples = Field(description="one target-alone decode step")
    fused_step_s: StepSamples = Field(description="one fused step at k")
    verify_step_s: StepSamples | None = Field(
        default=None, description="the target scoring k positions alone; null where it cannot be timed apart "
                                  "(a Neuron fused step is one graph)")


class DecodeSpeedRecord(Part):
    """For one prompt class: measured decode speedup at the artifact's k next to the predicted one.
    measured = the median over runs of target-alone seconds per token / fused seconds per token, the two
    timed back to back on the same artifact (validate.decode_speed)."""

    cls: str = Field(alias="class")
    k: int
    predicted_speedup: float | None
    measured_speedup: float
    ratio: float | None = Field(description="measured / predicted")
    target_s_per_token: float = Field(description="median over runs")
    fused_s_per_token: float = Field(description="median over runs")
    tokens: int = Field(description="decode tokens per run (the first of each prompt is context encoding's)")
    run_speedups: list[float] = Field(default_factory=list, description="each run's measured speedup")
    repeats: int
    spread: float = Field(description="(max - min) / median of the per-run measured speedups")

    def noisy(self) -> bool:
        """Too noisy to judge a prediction by: the runs spread over more than half their median (seen at
        150-1300% on a shared, busy 2-core host), or a speedup above k, which is impossible (a fused step
        adds at most k tokens and costs at least a target step) unless the host's load changed between
        runs."""
        return self.spread > NOISY_SPREAD or self.measured_speedup > self.k


class AdviceRecord(Part):
    cost_model: CostModelRecord
    measurement: CostMeasurementRecord | None = None
    step_times: StepTimesRecord | None = None
    recommended_k: dict[str, int | None]
    classes: list[ClassAdviceRecord]
    decode: list[DecodeSpeedRecord] = Field(
        default_factory=list,
        description="measured against predicted decode speedup per class at the built k")


class StaggeredSection(Part):
    """The gate's continuous-batching check (validate.staggered_gate): requests arriving at seeded
    random steps into the artifact's cache lines, lines reused, each compared with the reference.

    ran=False with `skipped` saying why (batch 1, a runner without a batcher); then the counts are 0.
    Absent (None in ValidationDocument) in documents written before the gate ran it."""

    ran: bool
    passed: bool
    skipped: str | None = None
    summary: str
    requests: int = 0
    lines: int = 0
    seed: int = 0
    steps: int = 0
    admitted_while_decoding: int = 0
    reused_lines: int = 0
    exact: int = 0
    near_ties: int = 0
    mismatches: int = 0
    tokens_generated: int = 0
    tokens_compared: int = 0
    coverage_gaps: list[str] = Field(default_factory=list, description="why the run could not catch a "
                                     "context encoding that writes other lines, if it could not")
    details: list[str] = Field(default_factory=list, description="every mismatch and near-tie, one line each")
    seconds: float | None = None


class ReferenceRecord(Part):
    key: str
    implementation: dict[str, str]
    dtype: str
    from_cache: bool


class ValidationSummary(Part):
    """The short fields a manifest carries about its version's validation."""

    passed: bool
    summary: str
    prompts: int
    near_ties: int
    mismatches: int
    tolerance: float
    dtype: str
    max_new_tokens: int
    steps_match: bool | None
    recommended_k: int | None
    prompt_set_hash: str
    created_at: str


class ValidationDocument(Document):
    """validation.json. `passed` is true only when the greedy gate passed (and the staggered check,
    when it ran)."""

    FIX: ClassVar[str] = "validate the artifact again (`fusedspec validate ARTIFACT`)"
    ERROR: ClassVar[type[InputError]] = ArtifactError

    passed: bool
    summary: str
    details: list[str]
    key: str
    spec: BuildSpec
    prompt_set_hash: str
    tokenizer_hash: str | None = None
    reference: ReferenceRecord
    greedy: GreedySection
    staggered: StaggeredSection | None = None
    acceptance: AcceptanceSection | None = None
    advice: AdviceRecord | None = None
    created_at: str
    # GATE_VERSION of the gate that wrote it; None: written before it was recorded
    gate_version: int | None = None
    content_hash: str | None = None  # `content_hash` of the artifact's files the gate ran on

    def contradictions(self) -> list[str]:
        """Why a document that says it passed contradicts its own sections (empty when it does not)."""
        if not self.passed:
            return []
        greedy, staggered, found = self.greedy, self.staggered, []
        if not greedy.passed or greedy.counts.mismatches or greedy.mismatches:
            found.append(f"its greedy section failed ({greedy.counts.mismatches} mismatch(es))")
        if staggered is not None and (not staggered.passed or staggered.mismatches):
            found.append(f"its staggered section failed ({staggered.mismatches} mismatch(es))")
        return found

    def summary_record(self) -> ValidationSummary:
        greedy = self.greedy
        overall = self.advice.recommended_k.get("overall") if self.advice is not None else None
        return ValidationSummary(
            passed=self.passed, summary=self.summary, prompts=greedy.counts.prompts,
            near_ties=greedy.counts.near_ties, mismatches=greedy.counts.mismatches,
            tolerance=greedy.tolerance, dtype=greedy.dtype, max_new_tokens=greedy.max_new_tokens,
            steps_match=self.acceptance.steps_match if self.acceptance is not None else None,
            recommended_k=overall, prompt_set_hash=self.prompt_set_hash, created_at=self.created_at)


def content_hash(files: Iterable[tuple[str, str]]) -> str:
    """sha256 over an artifact's files, as (relative path, sha256) pairs, leaving out the two the gate writes
    into it (validation.json, advice.png): what a validation.json says it validated."""
    lines = sorted(f"{rel}\t{digest}" for rel, digest in files if rel not in (VALIDATION_FILE, ADVICE_FILE))
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
