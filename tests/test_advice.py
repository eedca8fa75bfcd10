"""k advice: the cost model, the recommendation, the plot, and `fusedspec advise` on tiny real models."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from fusedspec.compile.documents.validation import ARTIFACT_PROGRAMS
from fusedspec.core.errors import ConfigError
from fusedspec.flows.cli import main
from fusedspec.validate.acceptance import OVERALL, KStats, PromptAgreement, predict
from fusedspec.validate.advice import (
    HOST_FORWARDS,
    CostModel,
    advise,
    format_table,
    measure_costs,
    plot_advice,
)
from fusedspec.validate.decode_speed import DecodeRun, DecodeSpeed
from fusedspec.validate.step_costs import cost_model_from_times

SMALL_SET = [
    {"id": "rep", "class": "repeat", "text": "Repeat this line 5 times: all work and no play"},
    {"id": "seq", "class": "sequence", "text": "1, 2, 3, 4, 5, 6,"},
    {"id": "story", "class": "prose", "text": "Once upon a time, in a quiet village,"},
]


def test_speedup_formula() -> None:
    stats = KStats(k=4, prompts=1, steps=10, tokens=30, proposed=30, accepted=20)
    assert CostModel(0.1).speedup(stats) == pytest.approx(30 / (10 * (1 + 4 * 0.1)))
    assert CostModel(0.1, verify_slope=0.5).speedup(stats) == pytest.approx(30 / (10 * (1 + 0.5 * 3 + 0.4)))
    assert CostModel(0.1).speedup(KStats(k=4, prompts=1, steps=0, tokens=0, proposed=0, accepted=0)) is None
    for bad in (0.0, -1.0):
        with pytest.raises(ConfigError, match="cost ratio"):
            CostModel(bad)
    with pytest.raises(ConfigError, match="verify slope"):
        CostModel(0.1, verify_slope=-0.1)


def _synthetic(n: int, pattern: list[bool], cls: str, pid: str) -> PromptAgreement:
    hits = tuple([False] + [pattern[i % len(pattern)] for i in range(n - 1)])
    return PromptAgreement(id=pid, cls=cls, n_tokens=n, draft_hits=hits, target_flips=0)


def test_recommendation_is_the_argmax_per_class() -> None:
    prompts = [_synthetic(64, [True], "structured", "a"), _synthetic(64, [True, False], "prose", "b")]
    table = predict(prompts, range(2, 17))
    result = advise(table, CostModel(0.05))
    for c in result.classes:
        best = max((sp, -s.k) for s, sp in c.rows if sp is not None)
        assert (c.best_speedup, -c.recommended_k) == best
    # A draft that always agrees is worth a long window; one that agrees every other token is not.
    assert result.for_class("structured").recommended_k > result.for_class("prose").recommended_k
    assert result.for_class("prose").recommended_k == 2
    assert result.recommended_k == result.for_class(OVERALL).recommended_k
    # An expensive draft never pays off.
    assert not advise(table, CostModel(1.0)).for_class(OVERALL).pays_off
    text = format_table(result)
    assert "[structured]" in text and "[overall]" in text and "recommended k" in text


def test_plot_is_a_png_and_nothing_else_is_left(tmp_path: Path) -> None:
    import matplotlib.image

    prompts = [_synthetic(40, [True], "repeat", "a"), _synthetic(40, [True, True, False], "prose", "b")]
    result = advise(predict(prompts, range(2, 17)), CostModel(0.1))
    out = plot_advice(result, tmp_path / "advice.png", title="tiny pair", mark_k=5)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(out).shape[:2]
    assert width >= 600 and height >= 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advice.png"]


def test_measured_costs_are_positive(tiny_target: Path, tiny_drafts: dict[str, Path]) -> None:
    m = measure_costs(tiny_target, tiny_drafts["cut"], repeats=3, verify_k=4)
    assert m.t_target > 0 and m.t_draft > 0 and m.cost_ratio > 0 and m.verify_slope >= 0


def _decode(cls: str, k: int, target_s: list[float], fused_s: list[float]) -> DecodeSpeed:
    """A crafted timing: per run, seconds of 100 decode tokens in each mode."""
    return DecodeSpeed(cls=cls, k=k, target_runs=tuple(DecodeRun(t, 100) for t in target_s),
                       fused_runs=tuple(DecodeRun(f, 100) for f in fused_s))


def test_a_built_k_measured_slower_is_never_advised() -> None:
    # prose is predicted to gain at k=4 (cheap draft), but the artifact decoded it slower than its target
    # alone: the advice for prose is "do not speculate", plainly, and the prediction error is reported.
    prompts = [_synthetic(64, [True], "structured", "a"), _synthetic(64, [True, True, False], "prose", "b")]
    table = predict(prompts, range(2, 9))
    model = CostModel(0.02)
    assert advise(table, model).for_class("prose").pays_off  # the prediction alone would speculate
    decode = [_decode("structured", 4, [1.0, 1.1, 1.0], [0.5, 0.55, 0.5]),
              _decode("prose", 4, [1.0, 1.0, 1.1], [1.2, 1.25, 1.2])]
    result = advise(table, model, decode=decode)
    prose, structured = result.for_class("prose"), result.for_class("structured")
    assert prose.recommended_k is None and not prose.pays_off and prose.measured_slower
    assert structured.recommended_k is not None and structured.pays_off
    record = result.record()
    assert record.recommended_k["prose"] is None
    rows = {d.cls: d for d in record.decode}
    assert rows["prose"].measured_speedup == pytest.approx(1.0 / 1.2)
    assert rows["prose"].ratio == pytest.approx(rows["prose"].measured_speedup / prose.predicted_at(4))
    assert rows["structured"].measured_speedup == pytest.approx(2.0)
    text = format_table(result)
    assert "[prose] agreement" in text and "do not speculate (the built k measured slower" in text
    assert "measured at built k=4: predicted" in text and "measured 0.83x" in text
    assert "too noisy" not in text
    # runs that disagree (a busy host) are flagged, and still keep the slower k out of the advice
    noisy = advise(table, model, decode=[_decode("prose", 4, [1.0, 1.0, 1.1], [1.2, 0.5, 2.5])])
    assert noisy.for_class("prose").recommended_k is None
    assert "spread 187%) - too noisy to judge the prediction by" in format_table(noisy)


def test_recorded_step_times_set_c_and_b() -> None:
    from fusedspec.compile.documents.validation import StepTimesRecord

    # target step 10 ms, verify of 4 positions 13 ms, fused step 17 ms: b = 0.1, c = (17 - 13) / (4 * 10)
    times = StepTimesRecord(where=ARTIFACT_PROGRAMS, k=4, target_step_s=[0.010, 0.011, 0.009],
                            fused_step_s=[0.017, 0.018, 0.016], verify_step_s=[0.013, 0.013, 0.014])
    model = cost_model_from_times(times)
    assert model.verify_slope == pytest.approx(0.1) and model.cost_ratio == pytest.approx(0.1)
    assert model.source.startswith("measured on this artifact's programs at k=4 (median of 3, spread 20%")
    # a device's fused step is one graph: b is stated 0, and the whole excess is the draft's
    device = cost_model_from_times(times.model_copy(update={"verify_step_s": None}))
    assert device.verify_slope == 0 and device.cost_ratio == pytest.approx((1.7 - 1) / 4)
    assert "b = 0 stated" in device.source


@pytest.fixture(scope="module")
def small_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("advise") / "small.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in SMALL_SET))
    return path


def _advise(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["advise", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_advise_cli_per_class_table_json_and_plot(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                  small_prompts: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "curves.png"
    common = ["--target", str(tiny_target), "--prompts", str(small_prompts), "--max-new-tokens", "12",
              "--k-range", "2..8", "--json"]
    code, out, err = _advise(capsys, *common, "--draft", str(tiny_drafts["copy"]), "--cost-ratio", "0.05",
                             "--plot", str(plot))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["plot"] == str(plot) and plot.read_bytes()[:4] == b"\x89PNG"
    classes = {c["class"]: c for c in doc["advice"]["classes"]}
    assert set(classes) == {"repeat", "sequence", "prose", OVERALL}
    assert doc["prompts"]["count"] == 2 * len(SMALL_SET)
    for c in classes.values():
        assert c["agreement"] == 1.0 and c["pays_off"]
        rows = c["by_k"]
        assert [r["k"] for r in rows] == list(range(2, 9))
        for r in rows:  # the reported speedup is the documented formula of the reported steps
            assert r["speedup"] == pytest.approx(r["tokens"] / (r["steps"] * (1 + r["k"] * 0.05)))
        assert c["recommended_k"] == max(rows, key=lambda r: (r["speedup"], -r["k"]))["k"]

    code, out, err = _advise(capsys, *common, "--draft", str(tiny_drafts["unrelated"]))
    assert code == 0, err
    doc = json.loads(out)
    # no artifact to time: the source says the numbers are transformers forwards here, not an artifact's
    assert doc["advice"]["cost_model"]["source"] == HOST_FORWARDS
    assert doc["advice"]["measurement"]["t_target_s"] > 0
    overall = next(c for c in doc["advice"]["classes"] if c["class"] == OVERALL)
    assert overall["agreement"] < 0.5

    code, out, err = _advise(capsys, *common[:-1], "--draft", str(tiny_drafts["cut"]), "--cost-ratio", "0.5")
    assert code == 0, err
    assert "[repeat]" in out and "[prose]" in out and "recommended k = 2 (no k beats the target alone" in out


@pytest.mark.parametrize("extra, words", [
    (["--k-range", "1..4"], "at least 2"),
    (["--k-range", "two..four"], "k range"),
    # the bound: tests/test_draft_choice.py
    (["--cost-ratio", "0"], "--cost-ratio is given 2 times for 1 draft"),
    (["--dtype", "int8"], "dtype"),
    (["--max-new-tokens", "1"], "--max-new-tokens 1: input should be greater than or equal to 2"),
    (["--variants", "html"], "variant 'html'"),
])
def test_advise_bad_options_exit_2_and_write_nothing(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                     small_prompts: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str], extra: list[str],
                                                     words: str) -> None:
    plot = tmp_path / "p.png"
    code, _, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(tiny_drafts["copy"]),
                           "--prompts", str(small_prompts), "--cost-ratio", "0.1", "--plot", str(plot),
                          *extra)
    assert code == 2 and words in err
    assert list(tmp_path.iterdir()) == []


def test_advise_bad_prompt_file_and_plot_name(tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"class": "repeat", "text": "ok"}\n{"class": "prose"}\n')
    base = ["--target", str(tiny_target), "--draft", str(tiny_drafts["copy"]), "--cost-ratio", "0.1"]
    code, out, err = _advise(capsys, *base, "--prompts", str(bad), "--plot", str(tmp_path / "p.png"),
                             "--json")
    assert code == 2 and "line 2: field 'text' is missing" in err
    assert json.loads(out)["ok"] is False
    code, _, err = _advise(capsys, *base, "--plot", str(tmp_path / "p.jpg"))
    assert code == 2 and ".png" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_advise_refuses_a_draft_with_another_tokenizer(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                       small_prompts: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other-draft"
    shutil.copytree(tiny_drafts["unrelated"], other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    code, _, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(other), "--prompts",
                           str(small_prompts), "--cost-ratio", "0.1")
    assert code == 1 and "chat template" in err


def test_validation_times_the_artifact_it_advises_on(build_tiny, small_prompts: Path,  # noqa: ANN001
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`fusedspec validate` on a cpu artifact with target-alone programs: c and b come from its own programs,
    and the measured decode speedup per class sits next to the predicted one, with their ratio (values are
    not asserted: timing)."""
    from fusedspec.compile.documents.validation import VALIDATION_FILE, ValidationDocument

    # test_cpu_runner's PLAIN: built once
    artifact = build_tiny(tp=2, k=3, batch=4, draft="copy", target_alone=True)
    assert main(["validate", str(artifact), "--prompts", str(small_prompts), "--max-new-tokens", "12",
                 "--variants", "raw"]) == 0
    out = capsys.readouterr().out
    advice = ValidationDocument.read(artifact / VALIDATION_FILE).advice
    assert advice is not None and advice.measurement is None  # no transformers timing of other code
    assert advice.step_times is not None and advice.step_times.where == ARTIFACT_PROGRAMS
    assert advice.step_times.k == 3 and len(advice.step_times.verify_step_s or []) == 9
    assert advice.cost_model.cost_ratio == cost_model_from_times(advice.step_times).cost_ratio
    assert advice.cost_model.source.startswith("measured on this artifact's programs at k=3 (median of 9")
    predicted = {c.cls: next(r.speedup for r in c.by_k if r.k == 3) for c in advice.classes}
    decode = {d.cls: d for d in advice.decode}
    assert set(decode) == {"repeat", "sequence", "prose", OVERALL}
    for cls, row in decode.items():
        assert row.k == 3 and row.repeats == 3 and row.tokens > 0
        assert row.predicted_speedup == predicted[cls]
        assert len(row.run_speedups) == 3 and row.measured_speedup == statistics.median(row.run_speedups)
        assert row.ratio == pytest.approx(row.measured_speedup / row.predicted_speedup)
        if row.measured_speedup <= 1.0:  # the guard, whichever way this host's timing went
            assert advice.recommended_k[cls] is None
        assert (f"at built k=3: predicted {row.predicted_speedup:.2f}x, measured "
                f"{row.measured_speedup:.2f}x") in out
    assert f"k advice cost model: c = {advice.cost_model.cost_ratio:.3f}" in out
    assert "measured on this artifact's programs at k=3" in out


DEVICE_STEP_TIMES = Path(__file__).parent / "fixtures" / "device_step_times.json"


def test_advise_uses_recorded_device_step_times(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                small_prompts: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Step times recorded on a device (fixture) set c, with b = 0 stated, and the advice says so."""
    recorded = json.loads(DEVICE_STEP_TIMES.read_text())
    code, out, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(tiny_drafts["cut"]),
                             "--prompts", str(small_prompts), "--max-new-tokens", "12", "--k-range", "2..8",
                             "--step-times", str(DEVICE_STEP_TIMES), "--json")
    assert code == 0, err
    advice = json.loads(out)["advice"]
    # medians 20.0 ms and 26.0 ms at k=5: c = (26.0 / 20.0 - 1) / 5
    assert advice["cost_model"]["cost_ratio"] == pytest.approx(0.06)
    assert advice["cost_model"]["verify_slope"] == 0
    source = advice["cost_model"]["source"]
    assert source.startswith("measured on a Trainium device") and \
        "recorded in device_step_times.json" in source
    assert "b = 0 stated" in source and advice["measurement"] is None
    assert advice["step_times"]["fused_step_s"] == recorded["fused_step_s"]
    for c in advice["classes"]:
        for r in c["by_k"]:
            assert r["speedup"] == pytest.approx(r["tokens"] / (r["steps"] * (1 + r["k"] * 0.06)))

    code, _, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(tiny_drafts["cut"]),
                           "--step-times", str(DEVICE_STEP_TIMES), "--cost-ratio", "0.1")
    assert code == 2 and "give one" in err


def test_validation_takes_step_times_recorded_on_the_serving_hardware(
        build_tiny, small_prompts: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    """`fusedspec validate --step-times` (e.g. times recorded on the Trainium host the artifact serves on)
    sets c and b instead of this host's timing of the artifact's programs, and the advice names the file.
    The fixture's k (5) differs from the artifact's (3): c is per draft step, and the source says k=5."""
    from fusedspec.compile.documents.validation import VALIDATION_FILE, ValidationDocument

    artifact = build_tiny(tp=2, k=3, batch=4, draft="copy", target_alone=True)
    assert main(["validate", str(artifact), "--prompts", str(small_prompts), "--max-new-tokens", "12",
                 "--variants", "raw", "--step-times", str(DEVICE_STEP_TIMES)]) == 0
    out = capsys.readouterr().out
    advice = ValidationDocument.read(artifact / VALIDATION_FILE).advice
    assert advice is not None and advice.step_times is not None
    assert advice.step_times.fused_step_s == json.loads(DEVICE_STEP_TIMES.read_text())["fused_step_s"]
    assert advice.cost_model.cost_ratio == pytest.approx(0.06)  # the fixture's medians, as in advise
    assert "recorded in device_step_times.json" in advice.cost_model.source
    assert "k advice cost model: c = 0.060" in out and "recorded in device_step_times.json" in out
    # this host's decode says nothing about the hardware the times were recorded on: not measured, not judged
    assert advice.decode == [] and \
        "decode speedup not measured: the step times were recorded on other hardware" in out
    for cls in advice.classes:
        for row in cls.by_k:
            assert row.speedup == pytest.approx(row.tokens / (row.steps * (1 + row.k * 0.06)))
