"""The run summary: what a run did, as a typed document (the flow's result) and as text for a terminal.

    summarize(plan, outcomes) -> RunSummary
    RunSummary.outcome_line()   one line: counts, bytes, where the versions are (logged last, state message)
    RunSummary.text             the terminal summary: the line, one row per build, the k advice
    RunStopped                  why a run stopped before any build (plan, tokenizer gate)
    FlowFailure                 the data of a Failed run: its one-line message and one of the two above

The k advice here is a recommendation among the ks the matrix built (or "do not speculate"), never both,
made from every build of this run, reused ones included, each under this run's validation settings (the
pipeline re-scores a reused build's stored acceptance at this run's cost ratio, and validates it again
where the prompts or lengths differ): `recommend` picks, per prompt class, the built k with the best
predicted speedup among those not measured slower than the target alone, and says "do not speculate" when
none is left or none is predicted faster. Each build's validation measured its own k per class (target
alone against fused, same artifact); the table puts that next to the prediction with their ratio, so the
prediction's error is in plain view.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from fusedspec.compile.documents.validation import AdviceRecord, DecodeSpeedRecord
from fusedspec.core.errors import FusedspecError
from fusedspec.flows.pipeline import ConfigOutcome
from fusedspec.flows.planning import RunPlan
from fusedspec.validate.acceptance import OVERALL


class Counts(BaseModel):
    configs: int
    compiled: int
    programs_reused: int  # builds that sharded weights into programs compiled before (same graph key)
    published: int
    reused: int
    failed: int
    repaired: int
    bytes_uploaded: int
    files_uploaded: int
    files_copied: int


class Recommendation(BaseModel):
    """For one prompt class: the k to serve among the built ones, or None (do not speculate)."""

    cls: str
    k: int | None
    predicted_speedup: float | None
    agreement: float | None
    measured_speedup: float | None = None  # of k, when a build of it was validated with a measurement
    measured_slower: dict[int, float] = {}  # built ks that decoded this class slower than the target alone

    def describe(self) -> str:
        agreement = "-" if self.agreement is None else f"{self.agreement:.2f}"
        slower = ", ".join(f"k={k} {sp:.2f}x" for k, sp in sorted(self.measured_slower.items()))
        if self.k is None:
            if slower:
                why = f" (measured slower than the target alone: {slower})"
            else:
                why = "" if self.predicted_speedup is None else f" (best built k predicts {self.predicted_speedup:.2f}x)"
            return f"{self.cls:<10} agreement {agreement}  do not speculate{why}"
        measured = "" if self.measured_speedup is None else f", measured {self.measured_speedup:.2f}x"
        skipped = f"; not {slower}: measured slower" if slower else ""
        return (f"{self.cls:<10} agreement {agreement}  serve k={self.k} (predicted {self.predicted_speedup:.2f}x"
                f"{measured}{skipped})")


class RunStopped(BaseModel):
    """Why a run stopped before any build: its plan or its tokenizer gate refused it."""

    stage: str
    reason: str  # the error's whole text (a config's problems one per line)
    problems: list[str] = []  # each problem, when the error lists them (MatrixError)
    exit_code: int

    @classmethod
    def of(cls, stage: str, error: FusedspecError) -> RunStopped:
        return cls(stage=stage, reason=str(error), problems=list(getattr(error, "problems", [])),
                   exit_code=error.exit_code)

    def one_line(self) -> str:
        """The reason as one line, for a state message: the problem itself when there is one."""
        if len(self.problems) == 1:
            return self.problems[0]
        if self.problems:
            return f"{len(self.problems)} problems: " + "; ".join(self.problems)
        return " ".join(self.reason.split())


class FlowFailure(Exception):  # noqa: N818 - what a Failed run carries, not an error raised by our code
    """The data of a Failed compile-fused state: its one-line message and what ended it, a RunSummary (some
    builds failed; the rest are published) or a RunStopped (the plan or the tokenizer gate refused the run).
    An exception, because a Prefect engine running a deployment raises the data of a Failed state at the
    end: its traceback then ends with this one line, not with "cannot be resolved into an exception"."""

    def __init__(self, message: str, outcome: RunSummary | RunStopped) -> None:
        super().__init__(message, outcome)  # both in args: it pickles as a persisted result
        self.message, self.outcome = message, outcome

    def __str__(self) -> str:
        return self.message


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str
    draft: str
    backend: str
    store: str
    counts: Counts
    outcomes: list[ConfigOutcome]
    advice: AdviceRecord | None
    recommendations: list[Recommendation]
    text: str

    def outcome_line(self) -> str:
        c = self.counts
        failed = [f"{o.slug} ({o.failed_stage})" for o in self.outcomes if o.status == "failed"]
        head = (f"{c.configs} config(s): {c.compiled} compiled, {c.programs_reused} from reused programs, "
                f"{c.published} published, {c.reused} reused, "
                f"{c.failed} failed; {c.bytes_uploaded:,} bytes uploaded; versions under {self.store}")
        return head + (f"; failed: {', '.join(failed)}" if failed else "")

    def details(self) -> str:
        """Everything of the terminal summary but its outcome line: the builds, then the k advice."""
        return "\n".join(build_lines(self) + advice_lines(self))


def counts(outcomes: list[ConfigOutcome]) -> Counts:
    by_status = Counter(o.status for o in outcomes)
    return Counts(configs=len(outcomes), compiled=sum(o.compiled for o in outcomes),
                  programs_reused=sum(o.status != "failed" and o.programs_from is not None for o in outcomes),
                  published=by_status["published"],
                  reused=by_status["reused"], failed=by_status["failed"], repaired=sum(o.repaired for o in outcomes),
                  bytes_uploaded=sum(o.bytes_sent for o in outcomes),
                  files_uploaded=sum(o.files_uploaded for o in outcomes),
                  files_copied=sum(o.files_copied for o in outcomes))


def measured_decode(outcomes: list[ConfigOutcome]) -> dict[str, dict[int, float]]:
    """Per class, the measured decode speedup of each built k, from the builds' validations; the lowest
    when several builds share a k (another TP, say): a k slower on any of them is not advised."""
    found: dict[str, dict[int, float]] = {}
    for o in outcomes:
        for row in decode_rows(o):
            by_k = found.setdefault(row.cls, {})
            by_k[row.k] = min(row.measured_speedup, by_k.get(row.k, row.measured_speedup))
    return found


def decode_rows(outcome: ConfigOutcome) -> list[DecodeSpeedRecord]:
    if outcome.status == "failed" or outcome.advice is None:
        return []
    return outcome.advice.decode


def predicted_at_built_k(outcomes: list[ConfigOutcome]) -> dict[str, dict[int, float]]:
    """Per class, each built k's predicted speedup by its own builds' advice; the lowest when several builds
    share a k (each may have measured its own cost ratio on its own programs)."""
    found: dict[str, dict[int, float]] = {}
    for o in outcomes:
        if o.status == "failed" or o.advice is None:
            continue
        for cls in o.advice.classes:
            speedup = next((row.speedup for row in cls.by_k if row.k == o.spec.k), None)
            if speedup is not None:
                by_k = found.setdefault(cls.cls, {})
                by_k[o.spec.k] = min(speedup, by_k.get(o.spec.k, speedup))
    return found


def recommend(outcomes: list[ConfigOutcome]) -> list[Recommendation]:
    """Per class, the built k with the best predicted speedup when it beats the target alone, else None;
    a built k measured slower than the target alone for the class is never the one."""
    advice = run_advice(outcomes)
    if advice is None:
        return []
    predicted, measured = predicted_at_built_k(outcomes), measured_decode(outcomes)
    found = []
    for cls in advice.classes:
        by_k, speeds = measured.get(cls.cls, {}), predicted.get(cls.cls, {})
        slower = {k: sp for k, sp in by_k.items() if sp <= 1.0}
        candidates = [(sp, k) for k, sp in speeds.items() if k not in slower]
        best = max(candidates, key=lambda t: (t[0], -t[1]), default=None)
        speedup = best[0] if best is not None else None
        k = best[1] if best is not None and best[0] > 1.0 else None
        found.append(Recommendation(cls=cls.cls, k=k, predicted_speedup=speedup, agreement=cls.agreement,
                                    measured_speedup=by_k.get(k) if k is not None else None,
                                    measured_slower=slower))
    return found


def run_advice(outcomes: list[ConfigOutcome]) -> AdviceRecord | None:
    """The advice record the run's summary shows (its cost line and plot): the one of the build of the k
    predicted best overall, or the first build's with one. Every build's advice is under this run's
    settings, so any of them gives this run's cost model and acceptance curves."""
    advised = [o for o in outcomes if o.status != "failed" and o.advice is not None]
    best = max(predicted_at_built_k(advised).get(OVERALL, {}).items(), key=lambda t: (t[1], -t[0]), default=None)
    chosen = next((o for o in advised if best is not None and o.spec.k == best[0]), advised[0] if advised else None)
    return chosen.advice if chosen is not None else None


def summarize(plan: RunPlan, outcomes: list[ConfigOutcome]) -> RunSummary:
    summary = RunSummary(target=plan.config.target, draft=plan.config.draft, backend=plan.config.backend,
                         store=plan.publish_uri, counts=counts(outcomes), outcomes=outcomes,
                         advice=run_advice(outcomes), recommendations=recommend(outcomes), text="")
    return summary.model_copy(update={"text": _text(summary)})


def _text(summary: RunSummary) -> str:
    return "\n".join([summary.outcome_line(), summary.details()])


def build_lines(summary: RunSummary) -> list[str]:
    """One line per build: status, short key, what it did, tokens per step, near-ties, and the version URI (or
    why not)."""
    lines = []
    width = max((len(o.slug) for o in summary.outcomes), default=10)
    for o in summary.outcomes:
        tps = f"{o.tokens_per_step:.2f} tok/step" if o.tokens_per_step is not None else ""
        ties = f"{o.near_ties} near-tie(s)" if o.near_ties else ""
        where = o.version_uri or f"{o.failed_stage}: {(o.reason or '').splitlines()[0][:160]}"
        lines.append(f"  {o.slug:<{width}}  {o.status:<9} {o.key[:12]}  {o.work:<14} {tps:<14} {ties:<13} {where}")
        rows = decode_rows(o)
        if rows:
            lines.append(f"  {'':<{width}}  decode speedup at k={o.spec.k}, predicted / measured (ratio): "
                         + decode_cells(rows))
    return lines


def decode_cells(rows: list[DecodeSpeedRecord]) -> str:
    """Per class, predicted / measured decode speedup at the build's k and their ratio (measured / predicted)."""
    return ", ".join(_decode_cell(row) for row in rows)


def _decode_cell(row: DecodeSpeedRecord) -> str:
    predicted = "-" if row.predicted_speedup is None else f"{row.predicted_speedup:.2f}x"
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
    return f"{row.cls} {predicted} / {row.measured_speedup:.2f}x ({ratio}{', noisy' if row.noisy() else ''})"


def advice_lines(summary: RunSummary) -> list[str]:
    """The k advice, one line per prompt class, among the ks this run built."""
    if summary.advice is None:
        return ["k advice: not available (no build of this run was validated)"]
    model = summary.advice.cost_model
    models = {(o.advice.cost_model.cost_ratio, o.advice.cost_model.verify_slope) for o in summary.outcomes
              if o.status != "failed" and o.advice is not None}
    ratios = sorted(c for c, _ in models)
    each = f"; each build's prediction by its own, c {ratios[0]:.3f} to {ratios[-1]:.3f}" if len(models) > 1 else ""
    lines = [f"k advice among the built ks (draft/target step cost c = {model.cost_ratio:.3f}, verify slope "
             f"b = {model.verify_slope:.3f}; {model.source}{each}):"]
    return lines + [f"  {r.describe()}" for r in summary.recommendations]
