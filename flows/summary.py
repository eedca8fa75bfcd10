"""The run summary: what a run did, as a typed document (the flow's result) and as text for a terminal.

    summarize(plans, outcomes) -> RunSummary
    RunSummary.outcome_line()   one line: counts, bytes, where the versions are (logged last, state message)
    RunSummary.text             the terminal summary: the line, one row per build, the k advice
    RunStopped                  why a run stopped before any build (plan, tokenizer gate)
    FlowFailure                 the data of a Failed run: its one-line message and one of the two above

The k advice here is a recommendation among the (draft, k) the matrix built (or "do not speculate"), never
both, made from every build of this run, reused ones included, each under this run's validation settings
(the pipeline re-scores a reused build's stored acceptance at this run's cost ratio, and validates it again
where the prompts or lengths differ): `recommend` picks, per prompt class, the built (draft, k) with the
best predicted speedup among those not measured slower than the target alone, and says "do not speculate"
when none is left or none is predicted faster; a built (draft, k) measured faster than the target alone
is served although predicted slower (the measurement on its own programs outranks the prediction, as a
measured loss does). A run of several drafts ranks them with
validate.draft_choice, each build under its own draft's cost model, and says why the winner wins. Each
build's validation measured its own k per class (target alone against fused, same artifact); the table
puts that next to the prediction with their ratio, so the prediction's error is in plain view. A run whose
matrix the advice limited before compiling (matrix.top_per_class) lists each build left out with why, and
its advice says that it ranks the built (draft, k) only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from fusedspec.compile.documents.validation import AdviceRecord, DecodeSpeedRecord
from fusedspec.core.errors import FusedspecError
from fusedspec.flows.pipeline import ConfigOutcome
from fusedspec.flows.planning import RunPlans, short_name
from fusedspec.validate.acceptance import OVERALL
from fusedspec.validate.draft_choice import DraftRanking, Option, option_at, ranking_of
from fusedspec.validate.matrix_limit import MatrixLimit


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
    """For one prompt class: the (draft, k) to serve among the built ones, or None (do not speculate)."""

    cls: str
    draft: str | None = None  # the draft of k (None: do not speculate)
    k: int | None
    predicted_speedup: float | None
    agreement: float | None  # of the draft of k, or of the best built (draft, k) when none pays off
    measured_speedup: float | None = None  # of k, when a build of it was validated with a measurement
    measured_slower: dict[str, dict[int, float]] = {}  # draft -> its built ks that decoded this class slower
    why: list[str] = []  # in a run of several drafts: the winner against each other draft's best built k

    def describe(self, *, several: bool = False) -> str:
        """The line of the class; with `several` drafts, the draft is named with each k."""
        def name(draft: str, k: int) -> str:
            return f"{short_name(draft)} k={k}" if several else f"k={k}"

        agreement = "-" if self.agreement is None else f"{self.agreement:.2f}"
        slower = ", ".join(f"{name(d, k)} {sp:.2f}x" for d, by_k in self.measured_slower.items()
                           for k, sp in sorted(by_k.items()))
        if self.k is None or self.draft is None:
            if slower:
                why = f" (measured slower than the target alone: {slower})"
            else:
                what = "(draft, k)" if several else "k"
                why = "" if self.predicted_speedup is None else \
                    f" (best built {what} predicts {self.predicted_speedup:.2f}x)"
            return f"{self.cls:<10} agreement {agreement}  do not speculate{why}"
        measured = "" if self.measured_speedup is None else f", measured {self.measured_speedup:.2f}x"
        skipped = f"; not {slower}: measured slower" if slower else ""
        serve = f"draft {short_name(self.draft)} at k={self.k}" if several else f"k={self.k}"
        return (f"{self.cls:<10} agreement {agreement}  serve {serve} (predicted "
                f"{self.predicted_speedup:.2f}x{measured}{skipped})")


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
    drafts: list[str]  # pinned, in the run config's order
    backend: str
    store: str
    counts: Counts
    outcomes: list[ConfigOutcome]
    advice: AdviceRecord | None  # the advice of the draft advised overall (or of the first draft with one)
    draft_advice: dict[str, AdviceRecord] = {}  # each draft's run advice (run_advice of its builds)
    recommendations: list[Recommendation]
    limit: MatrixLimit | None = None  # what matrix.top_per_class kept of the matrix, before compiling
    text: str

    def several(self) -> bool:
        return len(self.drafts) > 1

    def outcome_line(self) -> str:
        c = self.counts
        failed = [f"{build_name(self, o)} ({o.failed_stage})" for o in self.outcomes if o.status == "failed"]
        head = (f"{c.configs} config(s): {c.compiled} compiled, {c.programs_reused} from reused programs, "
                f"{c.published} published, {c.reused} reused, "
                f"{c.failed} failed; {c.bytes_uploaded:,} bytes uploaded; versions under {self.store}")
        left = (f"; {len(self.limit.left_out)} left out before compiling by the k advice "
                f"(matrix.top_per_class {self.limit.top_per_class})" if self.limit is not None else "")
        return head + left + (f"; failed: {', '.join(failed)}" if failed else "")

    def details(self) -> str:
        """Everything of the terminal summary but its outcome line: the builds, then the k advice."""
        return "\n".join(build_lines(self) + advice_lines(self))


def counts(outcomes: list[ConfigOutcome]) -> Counts:
    by_status = Counter(o.status for o in outcomes)
    return Counts(configs=len(outcomes), compiled=sum(o.compiled for o in outcomes),
                  programs_reused=sum(o.status != "failed" and o.programs_from is not None for o in outcomes),
                  published=by_status["published"],
                  reused=by_status["reused"], failed=by_status["failed"],
                  repaired=sum(o.repaired for o in outcomes),
                  bytes_uploaded=sum(o.bytes_sent for o in outcomes),
                  files_uploaded=sum(o.files_uploaded for o in outcomes),
                  files_copied=sum(o.files_copied for o in outcomes))


def measured_decode(outcomes: list[ConfigOutcome]) -> dict[str, dict[tuple[str, int], float]]:
    """Per class, the measured decode speedup of each built (draft, k), from the builds' validations;
    the lowest when several builds share it (another TP, say):
    a (draft, k) slower on any of them is not advised."""
    found: dict[str, dict[tuple[str, int], float]] = {}
    for o in outcomes:
        for row in decode_rows(o):
            by_pair = found.setdefault(row.cls, {})
            by_pair[o.draft, row.k] = min(row.measured_speedup,
                                          by_pair.get((o.draft, row.k), row.measured_speedup))
    return found


def decode_rows(outcome: ConfigOutcome) -> list[DecodeSpeedRecord]:
    if outcome.status == "failed" or outcome.advice is None:
        return []
    return outcome.advice.decode


def built_options(outcomes: list[ConfigOutcome]) -> dict[str, dict[tuple[str, int], Option]]:
    """Per class, each built (draft, k) as its own builds predict it (validate.draft_choice.Option); the
    lowest speedup when several builds share it (each may have measured its own cost ratio)."""
    found: dict[str, dict[tuple[str, int], Option]] = {}
    for o in outcomes:
        if o.status == "failed" or o.advice is None:
            continue
        for cls in o.advice.classes:
            option = option_at(o.draft, o.advice, cls, o.spec.k)
            pair = (o.draft, o.spec.k)
            by_pair = found.setdefault(cls.cls, {})
            if option is not None and (pair not in by_pair or option.speedup < by_pair[pair].speedup):
                by_pair[pair] = option
    return found


def built_ranking(outcomes: list[ConfigOutcome], drafts: list[str]) -> DraftRanking | None:
    """The built (draft, k) per class not measured slower than the target alone, ranked (None: no advice)."""
    advice = {draft: record for draft in drafts if (record := run_advice(outcomes, draft)) is not None}
    if not advice:
        return None
    measured = measured_decode(outcomes)
    classes = [c.cls for c in next(iter(advice.values())).classes]
    options = {cls: [option for pair, option in by_pair.items() if measured.get(cls, {}).get(pair, 2.0) > 1.0]
               for cls, by_pair in built_options(outcomes).items()}
    return ranking_of([d for d in drafts if d in advice], classes, options,
                      {draft: record.cost_model.source for draft, record in advice.items()})


def recommend(outcomes: list[ConfigOutcome], drafts: list[str] | None = None) -> list[Recommendation]:
    """Per class, the built (draft, k) with the best predicted speedup when it beats the target alone, else
    the one measured fastest among those measured faster than the target alone, else None; a built
    (draft, k) measured slower than the target alone for the class is never the one."""
    drafts = drafts or list(dict.fromkeys(o.draft for o in outcomes))
    ranking = built_ranking(outcomes, drafts)
    if ranking is None:
        return []
    measured = measured_decode(outcomes)
    first = run_advice(outcomes)
    fallback = {c.cls: c.agreement for c in first.classes} if first is not None else {}
    found = []
    for cls in ranking.classes:
        slower: dict[str, dict[int, float]] = {}
        for (draft, k), speedup in sorted(measured.get(cls, {}).items()):
            if speedup <= 1.0:
                slower.setdefault(draft, {})[k] = speedup
        ranked, predicted = ranking.options.get(cls, ()), ranking.best(cls)
        win = predicted or _measured_faster(ranked, measured.get(cls, {}))
        top = win or (ranked[0] if ranked else None)
        why = ([line.strip() for line in ranking.explain(cls).splitlines()[1:]]
               if predicted and len(ranking.drafts) > 1 else [])
        found.append(Recommendation(
            cls=cls, draft=win.draft if win else None, k=win.k if win else None,
            predicted_speedup=top.speedup if top else None,
            agreement=top.agreement if top else fallback.get(cls),
            measured_speedup=measured.get(cls, {}).get((win.draft, win.k)) if win else None,
            measured_slower=slower, why=why))
    return found


def _measured_faster(ranked: Sequence[Option], measured: Mapping[tuple[str, int], float]) -> Option | None:
    """Of options all predicted no faster than the target alone, the one measured fastest above it."""
    faster = [o for o in ranked if measured.get((o.draft, o.k), 0.0) > 1.0]
    return max(faster, key=lambda o: measured[(o.draft, o.k)], default=None)


def run_advice(outcomes: list[ConfigOutcome], draft: str | None = None) -> AdviceRecord | None:
    """The advice record the run's summary shows (its cost line and plot), of `draft`'s builds or of all:
    the one of the build of the (draft, k) predicted best overall, or the first build's with one. Every
    build's advice is under this run's settings, so any build of a draft gives its cost model and acceptance
    curves."""
    advised = [o for o in outcomes
               if o.status != "failed" and o.advice is not None and draft in (None, o.draft)]
    overall = built_options(advised).get(OVERALL, {})
    best = max(overall.items(), key=lambda t: (t[1].speedup, -t[0][1]), default=None)
    chosen = next((o for o in advised if best is not None and (o.draft, o.spec.k) == best[0]),
                  advised[0] if advised else None)
    return chosen.advice if chosen is not None else None


def summarize(plans: RunPlans, outcomes: list[ConfigOutcome], limit: MatrixLimit | None = None) -> RunSummary:
    drafts = list(plans.config.drafts)
    recommendations = recommend(outcomes, drafts)
    overall = next((r for r in recommendations if r.cls == OVERALL and r.draft is not None), None)
    draft_advice = {d: record for d in drafts if (record := run_advice(outcomes, d)) is not None}
    advice = draft_advice.get(overall.draft) if overall and overall.draft else run_advice(outcomes)
    summary = RunSummary(target=plans.config.target, drafts=drafts, backend=plans.config.backend,
                         store=plans.publish_uri, counts=counts(outcomes), outcomes=outcomes, advice=advice,
                         draft_advice=draft_advice, recommendations=recommendations, limit=limit, text="")
    return summary.model_copy(update={"text": _text(summary)})


def _text(summary: RunSummary) -> str:
    return "\n".join([summary.outcome_line(), summary.details()])


def build_lines(summary: RunSummary) -> list[str]:
    """One line per build: status, short key, what it did, tokens per step, near-ties, and the version URI (or
    why not)."""
    lines = []
    width = max((len(build_name(summary, o)) for o in summary.outcomes), default=10)
    for o in summary.outcomes:
        tps = f"{o.tokens_per_step:.2f} tok/step" if o.tokens_per_step is not None else ""
        ties = f"{o.near_ties} near-tie(s)" if o.near_ties else ""
        where = o.version_uri or f"{o.failed_stage}: {(o.reason or '').splitlines()[0][:160]}"
        lines.append(f"  {build_name(summary, o):<{width}}  {o.status:<9} {o.key[:12]}  {o.work:<14} "
                     f"{tps:<14} {ties:<13} {where}")
        rows = decode_rows(o)
        if rows:
            lines.append(f"  {'':<{width}}  decode speedup at k={o.spec.k}, predicted / measured (ratio): "
                         + decode_cells(rows))
    for left in summary.limit.left_out if summary.limit is not None else []:
        name = f"{short_name(left.draft)} {left.slug}" if summary.several() else left.slug
        lines.append(f"  {name:<{width}}  left out  {left.reason}")
    return lines


def decode_cells(rows: list[DecodeSpeedRecord]) -> str:
    """Per class, predicted / measured decode speedup at the build's k
    and their ratio (measured / predicted)."""
    return ", ".join(_decode_cell(row) for row in rows)


def _decode_cell(row: DecodeSpeedRecord) -> str:
    predicted = "-" if row.predicted_speedup is None else f"{row.predicted_speedup:.2f}x"
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
    return f"{row.cls} {predicted} / {row.measured_speedup:.2f}x ({ratio}{', noisy' if row.noisy() else ''})"


def advice_lines(summary: RunSummary) -> list[str]:
    """The advice, one line per prompt class, among the (draft, k) this run built; with several drafts, each
    draft's cost model first and, under each class, why its winner wins."""
    if summary.advice is None:
        return ["k advice: not available (no build of this run was validated)"]
    limit = summary.limit
    only_built = [] if limit is None or not limit.left_out else [
        f"  ranked among the built only: the k advice before compiling left {len(limit.left_out)} build(s) "
        "out (above), and one of those could have measured better"]
    if summary.several():
        lines = ["draft and k advice among the built (draft, k), each draft by its own cost model:"]
        lines += [f"  {short_name(draft)}: {_cost_line(summary, draft)}" if draft in summary.draft_advice
                  else f"  {short_name(draft)}: not ranked, {_not_ranked(summary, draft)}"
                  for draft in summary.drafts]
        for r in summary.recommendations:
            lines += [f"  {r.describe(several=True)}", *[f"    {line}" for line in r.why]]
        return lines + only_built
    return [f"k advice among the built ks ({_cost_line(summary, summary.drafts[0])}):",
            *[f"  {r.describe()}" for r in summary.recommendations], *only_built]


def _not_ranked(summary: RunSummary, draft: str) -> str:
    if summary.limit is not None and not summary.limit.kept.get(draft):
        return "every build of it was left out before compiling by the k advice (above)"
    return "no build of it was validated (its builds above say why)"


def _cost_line(summary: RunSummary, draft: str) -> str:
    """The draft's cost model (c and b, and where they come from), and their range when its builds differ."""
    model = summary.draft_advice[draft].cost_model
    models = {(o.advice.cost_model.cost_ratio, o.advice.cost_model.verify_slope) for o in summary.outcomes
              if o.status != "failed" and o.advice is not None and o.draft == draft}
    ratios = sorted(c for c, _ in models)
    each = (f"; each build's prediction by its own, c {ratios[0]:.3f} to {ratios[-1]:.3f}"
            if len(models) > 1 else "")
    return (f"draft/target step cost c = {model.cost_ratio:.3f}, verify slope b = {model.verify_slope:.3f}; "
            f"{model.source}{each}")


def build_name(summary: RunSummary, outcome: ConfigOutcome) -> str:
    """A build's name in the summary: its spec, after its draft's short name in a run of several drafts."""
    return f"{short_name(outcome.draft)} {outcome.slug}" if summary.several() else outcome.slug
