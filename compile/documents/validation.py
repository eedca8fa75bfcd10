"""validation.json: what the greedy gate found for one artifact, and the k advice computed with it.

Written by `validate.greedy.validate_artifact` into the artifact (atomically); read by the flow (reuse
of a passed gate, acceptance figures), by publishing (the manifest's summary) and by the run's report.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from compile.documents.base import Document
from compile.errors import ArtifactError, InputError
from compile.spec import BuildSpec

VALIDATION_FILE = "validation.json"
NOISY_SPREAD = 0.5
Status = Literal["match", "near-tie", "mismatch"]


class Part(Document):
    """A part of a document: strict like the whole; `class` is spelt `cls` in Python."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)


class PromptResult(Part):
    """The gate's verdict on one prompt. `position` is 0-based among the new tokens; None for a match."""

    id: str
    cls: str = Field(alias="class")
    status: Status
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

    def describe(self) -> str:
        if self.status == "match":
            return f"{self.id}: match ({self.n_got} tokens)"
        margin = "n/a" if self.margin is None else f"{self.margin:.3g}"
        gap = "not close" if self.gap is None else f"{self.gap:.3g}"

        def token(tid: int | None, text: str | None) -> str:
            return "(output ended)" if tid is None else f"{tid} {text!r}"

        prompt = self.prompt_text if len(self.prompt_text) <= 60 else self.prompt_text[:57] + "..."
        return (f"{self.id} [{self.cls}] {self.status} at new token {self.position}: reference "
                f"{token(self.expected, self.expected_text)}, artifact {token(self.got, self.got_text)}, "
                f"reference top-2 margin {margin}, artifact token's gap {gap}; prompt {prompt!r}")


class PromptRow(Part):
    id: str
    cls: str = Field(alias="class")
    status: Status
    n_tokens: int
    steps: int


class GreedyCounts(Part):
    prompts: int
    exact: int
    near_ties: int
    mismatches: int


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


class StepTimesRecord(Part):
    """Seconds per call of the steps the cost model is computed from, every sample kept (interleaved
    repeats); also the format of a recorded device step-times file (`fusedspec advise --step-times`)."""

    where: str = Field(description="what was timed, e.g. \"this artifact's programs\"")
    k: int = Field(ge=2, description="the k of the fused step timed")
    target_step_s: list[float] = Field(min_length=1, description="one target-alone decode step")
    fused_step_s: list[float] = Field(min_length=1, description="one fused step at k")
    verify_step_s: list[float] | None = Field(
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
        adds at most k tokens and costs at least a target step) unless the host's load changed between runs."""
        return self.spread > NOISY_SPREAD or self.measured_speedup > self.k


class AdviceRecord(Part):
    cost_model: CostModelRecord
    measurement: CostMeasurementRecord | None = None
    step_times: StepTimesRecord | None = None
    recommended_k: dict[str, int | None]
    classes: list[ClassAdviceRecord]
    decode: list[DecodeSpeedRecord] = Field(
        default_factory=list, description="measured against predicted decode speedup per class at the built k")


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
    """validation.json. `passed` is true only when the greedy gate passed."""

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
    acceptance: AcceptanceSection | None = None
    advice: AdviceRecord | None = None
    created_at: str

    def summary_record(self) -> ValidationSummary:
        greedy = self.greedy
        overall = self.advice.recommended_k.get("overall") if self.advice is not None else None
        return ValidationSummary(
            passed=self.passed, summary=self.summary, prompts=greedy.counts.prompts,
            near_ties=greedy.counts.near_ties, mismatches=greedy.counts.mismatches, tolerance=greedy.tolerance,
            dtype=greedy.dtype, max_new_tokens=greedy.max_new_tokens,
            steps_match=self.acceptance.steps_match if self.acceptance is not None else None,
            recommended_k=overall, prompt_set_hash=self.prompt_set_hash, created_at=self.created_at)
