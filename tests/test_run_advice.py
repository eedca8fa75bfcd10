"""The run's k advice among the built ks (flows/summary.py), judged against what each build measured, and
always under this run's own settings: a build validated at another cost ratio is re-scored at the run's
(flows/pipeline.py advice_for_run). Crafted timings stand in for validation runs, so the guard is shown
whatever this host's speed."""

from __future__ import annotations

import pytest

from fusedspec.compile.spec import BuildSpec
from fusedspec.flows.artifacts import build_lines_md
from fusedspec.flows.pipeline import ConfigOutcome
from fusedspec.flows.summary import build_lines, recommend
from fusedspec.validate.acceptance import PromptAgreement, predict
from fusedspec.validate.advice import CostModel, advise
from fusedspec.validate.decode_speed import DecodeRun, DecodeSpeed

MODEL = CostModel(0.02)


def _prompts() -> list[PromptAgreement]:
    def synthetic(pattern: list[bool], cls: str) -> PromptAgreement:
        hits = tuple([False] + [pattern[i % len(pattern)] for i in range(63)])
        return PromptAgreement(id=cls, cls=cls, n_tokens=64, draft_hits=hits, target_flips=0)

    return [synthetic([True], "structured"), synthetic([True, True, True, False], "prose")]


def _outcome(k: int, measured: dict[str, float]) -> ConfigOutcome:
    """A validated build at k whose validation measured `measured` (class -> speedup) over 100 tokens."""
    decode = [DecodeSpeed(cls=cls, k=k, target_runs=(DecodeRun(speedup, 100),) * 3, fused_runs=(DecodeRun(1.0, 100),) * 3)
              for cls, speedup in measured.items()]
    advice = advise(predict(_prompts(), range(2, 9)), MODEL, decode=decode).record()
    spec = BuildSpec(1, 256, k, 1, "float32", "cpu")
    return ConfigOutcome(slug=f"tp1-seq256-k{k}-bs1-float32", key=f"{k}" * 64, spec=spec, status="published",
                         version_uri=f"store://k{k}", advice=advice)


def test_a_built_k_measured_slower_is_never_the_runs_advice() -> None:
    outcomes = [_outcome(3, {"structured": 1.6, "prose": 1.1}), _outcome(6, {"structured": 2.2, "prose": 0.9})]
    advice = outcomes[0].advice
    assert advice is not None
    prose_predicted = {r.k: r.speedup for c in advice.classes if c.cls == "prose" for r in c.by_k}
    assert prose_predicted[6] > prose_predicted[3] > 1.0  # the prediction alone would serve prose at k=6
    found = {r.cls: r for r in recommend(outcomes)}
    assert found["prose"].k == 3 and found["prose"].measured_speedup == pytest.approx(1.1)
    assert found["prose"].measured_slower == {6: pytest.approx(0.9)}
    assert "serve k=3" in found["prose"].describe() and "not k=6 0.90x: measured slower" in found["prose"].describe()
    assert found["structured"].k == 6

    # every built k slower for prose: do not speculate on it, plainly, with the measurements
    slow = [_outcome(3, {"structured": 1.6, "prose": 0.95}), _outcome(6, {"structured": 2.2, "prose": 0.9})]
    prose = {r.cls: r for r in recommend(slow)}["prose"]
    assert prose.k is None
    assert "do not speculate (measured slower than the target alone: k=3 0.95x, k=6 0.90x)" in prose.describe()


def test_the_run_table_shows_predicted_measured_and_their_ratio() -> None:
    outcome = _outcome(3, {"prose": 0.9})
    [prose] = outcome.advice.decode  # type: ignore[union-attr]
    assert prose.ratio is not None and abs(prose.ratio - 0.9 / prose.predicted_speedup) < 1e-9  # type: ignore[operator]
    summary = type("S", (), {"outcomes": [outcome]})()
    _, decode_line = build_lines(summary)  # type: ignore[arg-type]
    assert decode_line.strip() == (f"decode speedup at k=3, predicted / measured (ratio): prose "
                                   f"{prose.predicted_speedup:.2f}x / 0.90x ({prose.ratio:.2f})")


def test_the_prefect_summary_shows_each_builds_decode_speedup_predicted_and_measured() -> None:
    outcomes = [_outcome(3, {"structured": 1.6, "prose": 0.9}), _outcome(6, {"structured": 2.2})]
    summary = type("S", (), {"outcomes": outcomes, "advice": outcomes[0].advice})()
    lines = build_lines_md(summary)  # type: ignore[arg-type]
    assert lines[0] == f"- `{outcomes[0].slug}` published: `store://k3`"
    for line, outcome in zip(lines[1::2], outcomes, strict=True):
        cells = line.split("(ratio): ", 1)[1].split(", ")
        assert [c.split(" ")[0] for c in cells] == [d.cls for d in outcome.advice.decode]  # type: ignore[union-attr]
        for cell, d in zip(cells, outcome.advice.decode, strict=True):  # type: ignore[union-attr]
            assert f"{d.predicted_speedup:.2f}x / {d.measured_speedup:.2f}x ({d.ratio:.2f})" in cell
    assert "/ 0.90x" in lines[1]


def test_a_reused_builds_advice_is_rescored_at_this_runs_cost_ratio() -> None:
    """The stored acceptance (steps and tokens per k) under the run's c: speedup = tokens / (steps * (1 + k c)),
    the picks follow, and a class measured slower stays "do not speculate" whatever c says."""
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
