"""The run's k advice among the built ks (flows/summary.py), judged against what each build measured, and
always under this run's own settings: a build validated at another cost ratio is re-scored at the run's
(flows/pipeline.py advice_for_run). Crafted timings stand in for validation runs, so the guard is shown
whatever this host's speed."""

from __future__ import annotations

import pytest

from fusedspec.compile.spec import BuildSpec
from fusedspec.flows.artifacts import build_lines_md
from fusedspec.flows.pipeline import ConfigOutcome
from fusedspec.flows.summary import RunSummary, advice_lines, build_lines, counts, recommend
from fusedspec.validate.acceptance import PromptAgreement, predict
from fusedspec.validate.advice import CostModel, advise
from fusedspec.validate.decode_speed import DecodeRun, DecodeSpeed

MODEL = CostModel(0.02)


DRAFT = "/models/draft"
PROSE_HITS = [True, True, True, False]


def _prompts(prose: list[bool]) -> list[PromptAgreement]:
    def synthetic(pattern: list[bool], cls: str) -> PromptAgreement:
        hits = tuple([False] + [pattern[i % len(pattern)] for i in range(63)])
        return PromptAgreement(id=cls, cls=cls, n_tokens=64, draft_hits=hits, target_flips=0)

    return [synthetic([True], "structured"), synthetic(prose, "prose")]


def _outcome(k: int, measured: dict[str, float], *, draft: str = DRAFT, model: CostModel = MODEL,
             prose: list[bool] = PROSE_HITS) -> ConfigOutcome:
    """A validated build of `draft` at k whose validation measured `measured` (class -> speedup) over 100
    tokens, its draft agreeing with the target on prose as `prose` repeats."""
    decode = [DecodeSpeed(cls=cls, k=k, target_runs=(DecodeRun(speedup, 100),) * 3,
                          fused_runs=(DecodeRun(1.0, 100),) * 3)
              for cls, speedup in measured.items()]
    advice = advise(predict(_prompts(prose), range(2, 9)), model, decode=decode).record()
    spec = BuildSpec(1, 256, k, 1, "float32", "cpu")
    return ConfigOutcome(slug=f"tp1-seq256-k{k}-bs1-float32", key=f"{k}{len(draft)}".ljust(64, "0"),
                         spec=spec, draft=draft, status="published", version_uri=f"store://{draft}/k{k}",
                         advice=advice)


def _summary(outcomes: list[ConfigOutcome], drafts: list[str]) -> RunSummary:
    return RunSummary(target="/models/target", drafts=drafts, backend="cpu", store="/store",
                      counts=counts(outcomes), outcomes=outcomes,
                      advice=next((o.advice for o in outcomes if o.advice), None),
                      recommendations=recommend(outcomes, drafts),
                      draft_advice={d: o.advice for o in outcomes for d in drafts
                                    if o.draft == d and o.advice},
                      text="")


def test_a_built_k_measured_slower_is_never_the_runs_advice() -> None:
    outcomes = [_outcome(3, {"structured": 1.6, "prose": 1.1}),
                _outcome(6, {"structured": 2.2, "prose": 0.9})]
    advice = outcomes[0].advice
    assert advice is not None
    prose_predicted = {r.k: r.speedup for c in advice.classes if c.cls == "prose" for r in c.by_k}
    assert prose_predicted[6] > prose_predicted[3] > 1.0  # the prediction alone would serve prose at k=6
    found = {r.cls: r for r in recommend(outcomes)}
    assert found["prose"].k == 3 and found["prose"].measured_speedup == pytest.approx(1.1)
    assert found["prose"].measured_slower == {DRAFT: {6: pytest.approx(0.9)}}
    assert "serve k=3" in found["prose"].describe() and \
        "not k=6 0.90x: measured slower" in found["prose"].describe()
    assert found["structured"].k == 6

    # every built k slower for prose: do not speculate on it, plainly, with the measurements
    slow = [_outcome(3, {"structured": 1.6, "prose": 0.95}), _outcome(6, {"structured": 2.2, "prose": 0.9})]
    prose = {r.cls: r for r in recommend(slow)}["prose"]
    assert prose.k is None
    assert "do not speculate (measured slower than the target alone: k=3 0.95x, k=6 0.90x)" in \
        prose.describe()


def test_a_built_k_measured_faster_is_served_although_predicted_slower() -> None:
    """A real pair's prose class predicted 0.99x at k 4 on its own programs and measured 1.16x; the run said
    "do not speculate", citing only k 8's measured 0.82x."""
    outcomes = [_outcome(3, {"structured": 1.6, "prose": 1.1}, prose=[False]),
                _outcome(6, {"structured": 2.2, "prose": 0.9}, prose=[False])]
    advice = outcomes[0].advice
    assert advice is not None
    assert all(r.speedup is not None and r.speedup <= 1.0 for c in advice.classes if c.cls == "prose"
               for r in c.by_k)  # the prediction alone would not speculate on prose
    prose = {r.cls: r for r in recommend(outcomes)}["prose"]
    assert (prose.k, prose.measured_speedup) == (3, pytest.approx(1.1))
    assert "serve k=3 (predicted" in prose.describe() and "measured 1.10x" in prose.describe() and \
        "not k=6 0.90x: measured slower" in prose.describe()


def test_the_run_table_shows_predicted_measured_and_their_ratio() -> None:
    outcome = _outcome(3, {"prose": 0.9})
    [prose] = outcome.advice.decode  # type: ignore[union-attr]
    assert prose.ratio is not None and \
        abs(prose.ratio - 0.9 / prose.predicted_speedup) < 1e-9  # type: ignore[operator]
    _, decode_line = build_lines(_summary([outcome], [DRAFT]))
    assert decode_line.strip() == (f"decode speedup at k=3, predicted / measured (ratio): prose "
                                   f"{prose.predicted_speedup:.2f}x / 0.90x ({prose.ratio:.2f})")


def test_the_prefect_summary_shows_each_builds_decode_speedup_predicted_and_measured() -> None:
    outcomes = [_outcome(3, {"structured": 1.6, "prose": 0.9}), _outcome(6, {"structured": 2.2})]
    lines = build_lines_md(_summary(outcomes, [DRAFT]))
    assert lines[0] == f"- `{outcomes[0].slug}` published: `store://{DRAFT}/k3`"
    for line, outcome in zip(lines[1::2], outcomes, strict=True):
        cells = line.split("(ratio): ", 1)[1].split(", ")
        assert [c.split(" ")[0] for c in cells] == \
            [d.cls for d in outcome.advice.decode]  # type: ignore[union-attr]
        for cell, d in zip(cells, outcome.advice.decode, strict=True):  # type: ignore[union-attr]
            assert f"{d.predicted_speedup:.2f}x / {d.measured_speedup:.2f}x ({d.ratio:.2f})" in cell
    assert "/ 0.90x" in lines[1]


def test_a_reused_builds_advice_is_rescored_at_this_runs_cost_ratio() -> None:
    """The stored acceptance (steps and tokens per k) under the run's c:
    speedup = tokens / (steps * (1 + k c)), the picks follow, and a class measured slower stays "do not
    speculate" whatever c says."""
    from fusedspec.validate.advice import rescore

    stored = _outcome(3, {"prose": 0.9}).advice  # validated at c = 0.02
    assert stored is not None
    again = rescore(stored, CostModel(0.5, source="given"))
    assert again.cost_model.cost_ratio == 0.5 and again.cost_model.source == "given"
    for before, after in zip(stored.classes, again.classes, strict=True):
        for old, new in zip(before.by_k, after.by_k, strict=True):
            assert (new.steps, new.tokens) == (old.steps, old.tokens)
            assert new.speedup == pytest.approx(new.tokens / (new.steps * (1 + new.k * 0.5)))
    structured = next(c for c in again.classes if c.cls == "structured")
    assert structured.recommended_k == max(structured.by_k, key=lambda r: (r.speedup or 0, -r.k)).k
    prose = next(c for c in again.classes if c.cls == "prose")
    assert prose.recommended_k is None and not prose.pays_off  # measured 0.9x at its k
    [decode] = again.decode
    assert decode.predicted_speedup == pytest.approx(next(r.speedup for r in prose.by_k if r.k == 3))
    assert decode.ratio == pytest.approx(0.9 / decode.predicted_speedup)  # type: ignore[operator]


def test_a_run_of_two_drafts_ranks_every_built_draft_and_k_and_says_why_the_winner_wins() -> None:
    """The write-up's trade, crafted: a small draft that is cheap per step (c 0.01) but agrees on prose one
    token in four, against a bigger one (c 0.1) that agrees three in four. Each build is predicted by its own
    draft's cost model; prose goes to the bigger draft, structured text (both agree always) to the cheaper."""
    small, big = "/models/small", "/models/big"
    cheap, costly = CostModel(0.01, source="given"), CostModel(0.1, source="given")
    outcomes = [_outcome(k, {}, draft=draft, model=model, prose=prose) for k in (3, 6)
                for draft, model, prose in ((big, costly, PROSE_HITS),
                                           (small, cheap, [True, False, False, False]))]
    found = {r.cls: r for r in recommend(outcomes, [big, small])}
    assert (found["prose"].draft, found["structured"].draft) == (big, small)
    for cls, r in found.items():  # the best of every built (draft, k), each under its own draft's c
        predicted = {(o.draft, o.spec.k): next(
            row.speedup for c in o.advice.classes if c.cls == cls  # type: ignore[union-attr]
            for row in c.by_k if row.k == o.spec.k) for o in outcomes}
        assert r.predicted_speedup == max(predicted.values()) == \
            predicted[r.draft, r.k]  # type: ignore[index]
    [why] = found["prose"].why
    assert why.startswith(f"{small}: best k = ") and "cheaper (c 0.010 against 0.100), but it accepts" in why
    assert "fewer draft tokens per step" in why

    lines = advice_lines(_summary(outcomes, [big, small]))
    assert lines[0].startswith("draft and k advice among the built (draft, k)")
    assert any(line.strip().startswith("prose") and f"serve draft big at k={found['prose'].k}" in line
               for line in lines)
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["big", "small"]  # each draft's cost model
    names = [line.split()[0:2] for line in build_lines(_summary(outcomes, [big, small]))
             if "published" in line]
    assert names[:2] == [["big", outcomes[0].slug], ["small", outcomes[1].slug]]  # each build by its draft


def test_a_draft_measured_slower_on_a_class_loses_it_to_the_other_draft() -> None:
    small, big = "/models/small", "/models/big"
    outcomes = [_outcome(3, {"prose": 1.2}, draft=big, model=CostModel(0.1)),
                _outcome(3, {"prose": 0.8}, draft=small, model=CostModel(0.01))]
    prose = {r.cls: r for r in recommend(outcomes, [big, small])}["prose"]
    assert (prose.draft, prose.k, prose.measured_speedup) == (big, 3, pytest.approx(1.2))
    assert prose.measured_slower == {small: {3: pytest.approx(0.8)}}
    assert "not small k=3 0.80x: measured slower" in prose.describe(several=True)


def test_a_draft_whose_builds_all_failed_is_named_as_not_ranked() -> None:
    """A comparison the user asked for is not won by walkover in silence: the draft without a validated build
    is listed, and says why it is not ranked."""
    small, big = "/models/small", "/models/big"
    failed = _outcome(3, {}, draft=big).model_copy(update={"status": "failed", "failed_stage": "compile",
                                                            "advice": None})
    outcomes = [failed, _outcome(3, {}, draft=small)]
    lines = advice_lines(_summary(outcomes, [big, small]))
    assert "  big: not ranked, no build of it was validated (its builds above say why)" in lines
    assert any(line.strip().startswith("small: draft/target step cost") for line in lines)
    assert "big tp1-seq256-k3-bs1-float32 (compile)" in _summary(outcomes, [big, small]).outcome_line()


def test_a_run_limited_before_compiling_names_each_build_left_out_and_ranks_the_built_only() -> None:
    """matrix.top_per_class: the summary's builds list the ones the advice left out, each with its reason, the
    outcome line counts them, the advice says it ranks the built only, and a draft with no build kept is named
    as left out (not as failed)."""
    from fusedspec.flows.artifacts import markdown_summary, table_rows
    from fusedspec.validate.matrix_limit import LeftOut, MatrixLimit

    small, big = "/models/small", "/models/big"
    outcomes = [_outcome(3, {}, draft=small)]
    reason = "not among the first 1 of any class: at best 2nd in prose (predicted 0.95x; the 1st 1.20x)"
    limit = MatrixLimit(top_per_class=1, kept={small: [outcomes[0].slug], big: []}, picks=[],
                        left_out=[LeftOut(draft=big, slug="tp1-seq256-k3-bs1-float32", reason=reason)],
                        advice={}, cost_sources={})
    summary = _summary(outcomes, [big, small]).model_copy(update={"limit": limit})
    assert "; 1 left out before compiling by the k advice (matrix.top_per_class 1)" in summary.outcome_line()
    assert "  big tp1-seq256-k3-bs1-float32" in "\n".join(build_lines(summary))
    assert any(line.strip().endswith(f"left out  {reason}") for line in build_lines(summary))
    lines = advice_lines(summary)
    assert "  big: not ranked, every build of it was left out before compiling by the k advice (above)" in \
        lines
    assert lines[-1].startswith("  ranked among the built only: the k advice before compiling left 1 "
                                "build(s) out")
    assert {"draft": "big", "config": "tp1-seq256-k3-bs1-float32", "status": "left out"}.items() <= \
        table_rows(summary)[-1].items()
    assert f"- `big tp1-seq256-k3-bs1-float32`: {reason}" in markdown_summary(summary, None)
