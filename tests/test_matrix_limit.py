"""A matrix limited to the k advice's top N (draft, k) per prompt class before any compile
(matrix.top_per_class, validate/matrix_limit.py), and each draft's own given cost ratio in a run config.
Crafted acceptance stands in for the advice's forward passes; tests/test_flow.py runs the limit end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.compile.documents.validation import AdviceRecord
from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError
from fusedspec.validate.acceptance import OVERALL, PromptAgreement, predict
from fusedspec.validate.advice import CostModel, advise
from fusedspec.validate.matrix_limit import (
    advice_key,
    cached_advice,
    limit_matrix,
    store_advice,
)
from fusedspec.validate.prompts import RenderedPrompt

BIG, SMALL = "/models/big", "/models/small"
KS = (3, 5, 7)


def _record(patterns: dict[str, list[bool]], cost_ratio: float) -> AdviceRecord:
    """A draft's advice at KS: per class, the draft agrees with the target as `pattern` repeats."""
    prompts = [PromptAgreement(id=cls, cls=cls, n_tokens=64, draft_hits=tuple(
        [False] + [pattern[i % len(pattern)] for i in range(63)]), target_flips=0)
        for cls, pattern in patterns.items()]
    return advise(predict(prompts, KS), CostModel(cost_ratio, source="given")).record()


# The write-up's trade: the big draft agrees on prose three tokens in four, the small one in four; both always
# agree on structured text, where the small draft's cheaper step wins
ADVICE = {(BIG, "float32"): _record({"structured": [True], "prose": [True, True, True, False]}, 0.1),
          (SMALL, "float32"): _record({"structured": [True], "prose": [True, False, False, False]}, 0.01)}


def _builds(tps: tuple[int, ...] = (1,)) -> list[tuple[str, BuildSpec]]:
    return [(draft, BuildSpec(tp, 256, k, 1, "float32")) for draft in (BIG, SMALL) for tp in tps for k in KS]


def _given(draft: str, spec: BuildSpec) -> CostModel | None:
    return None


def _ranked(cls: str, records: dict[str, AdviceRecord]) -> list[tuple[float, str, int]]:
    return sorted(((row.speedup or 0.0, draft, row.k) for draft, record in records.items()
                   for c in record.classes if c.cls == cls for row in c.by_k), reverse=True)


def test_the_first_n_of_each_class_are_kept_and_a_pair_kept_by_several_classes_is_built_once() -> None:
    limit = limit_matrix(_builds(), ADVICE, 1, _given)
    records = {draft: record for (draft, _), record in ADVICE.items()}
    firsts = {cls: _ranked(cls, records)[0][1:] for cls in ("structured", "prose", OVERALL)}
    assert firsts["prose"][0] == BIG and firsts["structured"][0] == SMALL  # each class its own winner
    kept = {(draft, int(slug.split("-k")[1].split("-")[0]))
            for draft, slugs in limit.kept.items() for slug in slugs}
    assert kept == set(firsts.values())  # the union: a pair several classes keep is one build
    assert len(limit.left_out) + sum(map(len, limit.kept.values())) == len(_builds())
    assert [(p.cls, p.place, p.draft, p.k) for p in limit.picks] == [
        (cls, 1, *firsts[cls]) for cls in ("structured", "prose", OVERALL)]

    wider = limit_matrix(_builds(), ADVICE, 2, _given)
    assert {p.cls for p in wider.picks if p.place == 2} == {"structured", "prose", OVERALL}
    assert set(kept) <= {(d, int(s.split("-k")[1].split("-")[0]))
                         for d, slugs in wider.kept.items() for s in slugs}


def test_each_build_left_out_says_where_its_pair_stood_in_the_class_that_ranked_it_best() -> None:
    limit = limit_matrix(_builds(), ADVICE, 1, _given)
    records = {draft: record for (draft, _), record in ADVICE.items()}
    for left in limit.left_out:
        k = int(left.slug.split("-k")[1].split("-")[0])
        places = [(next(i for i, (_, d, kk) in enumerate(_ranked(cls, records), 1)
                        if (d, kk) == (left.draft, k)), cls)
                  for cls in ("structured", "prose", OVERALL)]
        place, cls = min(places, key=lambda found: found[0])
        first = _ranked(cls, records)[0][0]
        assert left.reason.startswith("not among the first 1 of any class: at best ")
        assert f"in {cls} (predicted " in left.reason and f"the 1st {first:.2f}x)" in left.reason, left.reason
        assert f" {place}{'st' if place == 1 else 'nd' if place == 2 else 'rd' if place == 3 else 'th'} " in \
            left.reason


def test_a_stated_cost_model_ranks_each_setup_by_its_own() -> None:
    """On Neuron the stated bytes model depends on TP: here the small draft is nearly free at TP 2 and as
    costly as the big one at TP 1, so structured text keeps another draft in each setup."""
    def stated(draft: str, spec: BuildSpec) -> CostModel:
        c = 0.1 if draft == BIG or spec.tp_degree == 1 else 0.001
        return CostModel(c, source="stated")

    limit = limit_matrix(_builds((1, 2)), ADVICE, 1, stated)
    structured = {p.setup: p.draft for p in limit.picks if p.cls == "structured"}
    assert structured == {"tp1-seq256-bs1-float32": BIG, "tp2-seq256-bs1-float32": SMALL}
    assert any(slug.startswith("tp2-") for slug in limit.kept[SMALL])
    assert not any(slug.startswith("tp1-") for slug in limit.kept[SMALL])
    assert limit.cost_sources == {BIG: "stated", SMALL: "stated"}


def test_the_advice_before_compiling_is_cached_by_what_it_depends_on(tmp_path: Path) -> None:
    rendered = [RenderedPrompt(id="p:raw", prompt_id="p", cls="prose", variant="raw", text="x",
                               ids=(1, 2, 3))]
    target, draft = ({"commit": None, "files": {"model.safetensors": "sha256:a"}},
                     {"commit": "c" * 40, "files": {}})
    common = {"max_new_tokens": 8, "dtype": "float32", "ks": [3, 5], "cost_ratio": None, "stated": False}
    key = advice_key(target, draft, rendered, **common)  # type: ignore[arg-type]
    assert advice_key(target, draft, rendered, **{**common, "ks": [5, 3]}) == key  # type: ignore[arg-type]
    for change in ({"dtype": "bfloat16"}, {"ks": [3]}, {"cost_ratio": 0.1}, {"stated": True},
                   {"max_new_tokens": 9}):
        assert advice_key(target, draft, rendered,
                          **{**common, **change}) != key, change  # type: ignore[arg-type]
    assert advice_key(target, {**draft, "commit": "d" * 40}, rendered,
                      **common) != key  # type: ignore[arg-type]

    assert cached_advice(tmp_path, key) is None
    store_advice(tmp_path, key, ADVICE[BIG, "float32"])
    assert cached_advice(tmp_path, key) == ADVICE[BIG, "float32"]
    (tmp_path / "matrix-advice" / f"{key}.json").write_text("{broken")
    assert cached_advice(tmp_path, key) is None  # a damaged entry is a miss: computed again


def _config(**validation: object) -> dict[str, object]:
    return {"target": "/t", "draft": ["/a", "/b"], "matrix": {"tp_degree": [1], "seq_len": [64],
                                                              "speculation_length": [3, 4]},
            "validation": validation}


def test_a_run_config_gives_each_draft_its_own_cost_ratio_or_one_for_all() -> None:
    config = run_config_from_dict(_config(cost_ratio=[0.2, 0.05]))
    assert [config.for_draft(d).validation.cost_ratio for d in ("/a", "/b")] == [0.2, 0.05]
    assert [config.cost_ratio_of(d) for d in ("/a", "/b")] == [0.2, 0.05]
    one = run_config_from_dict(_config(cost_ratio=0.1))
    assert [one.for_draft(d).validation.cost_ratio for d in ("/a", "/b")] == [0.1, 0.1]
    with pytest.raises(ConfigError,
                       match=r"validation.cost_ratio: 3 numbers for 2 drafts; give one per draft"):
        run_config_from_dict(_config(cost_ratio=[0.2, 0.05, 0.1]))


def test_a_top_per_class_as_large_as_the_ranking_is_refused() -> None:
    data = _config()
    data["matrix"] = {**data["matrix"], "top_per_class": 4}  # type: ignore[dict-item]
    with pytest.raises(ConfigError,
                       match=r"matrix.top_per_class: 4 keeps every \(draft, k\) of 2 draft\(s\) x 2 k"):
        run_config_from_dict(data)
    data["matrix"] = {**data["matrix"], "top_per_class": 3}  # type: ignore[dict-item]
    assert run_config_from_dict(data).matrix.top_per_class == 3


def test_a_top_per_class_of_more_than_one_drafts_ks_is_planned(
        tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """2 drafts x 2 k with top_per_class 2 limits the run (4 pairs per class); each draft's plan has 2 k, and
    its config, validated again (the plan is JSON between processes), refused 2 as limiting nothing: `plan`
    ended in "internal error (ValidationError ...)". The run's config keeps the limit."""
    import json

    import yaml

    from fusedspec.core.settings import load_settings
    from fusedspec.flows.cli import main
    from fusedspec.flows.planning import RunPlan, plan_file

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "target": str(tiny_target), "draft": [str(tiny_drafts["perturbed"]), str(tiny_drafts["cut"])],
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3, 4], "dtype": ["float32"],
                   "top_per_class": 2},
        "compile": {"aot_inductor": False}, "publish": {"uri": str(tmp_path / "store")}}))
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))

    assert main(["plan", str(config), "--json"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["builds"]) == 4
    plans = plan_file(config, load_settings())
    assert plans.config.matrix.top_per_class == 2
    for plan in plans.plans:
        assert RunPlan.model_validate_json(plan.model_dump_json()) == plan


def test_a_dry_run_says_the_advice_runs_first_then_which_builds_it_leaves_out(
        tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before the advice has run in this work dir, `compile --dry-run` lists every build and says that a run
    computes the advice first; once it ran (a compile or a run computes it), the dry run marks each build it
    leaves out, with why, from the cache, without downloading or computing anything."""
    import json

    import yaml

    from fusedspec.core.settings import load_settings
    from fusedspec.flows.cli import main
    from fusedspec.flows.matrix_advice import matrix_limit
    from fusedspec.flows.planning import plan_file

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "count", "class": "sequence", "text": "1, 2, 3, 4, 5, 6, 7,"})
                       + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "target": str(tiny_target), "draft": [str(tiny_drafts["perturbed"]), str(tiny_drafts["cut"])],
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3, 4], "dtype": ["float32"],
                   "top_per_class": 1},
        "validation": {"prompts": str(prompts), "max_new_tokens": 8, "cost_ratio": [0.1, 0.01]},
        "compile": {"aot_inductor": False}, "publish": {"uri": str(tmp_path / "store")}}))
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))

    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert all(b["action"] != "left out" for d in first["drafts"] for b in d["builds"])
    assert any("first downloads the weights" in note for d in first["drafts"] for note in d["notes"])

    settings = load_settings()
    limit = matrix_limit(plan_file(config, settings), settings, compute=True)
    assert limit is not None and len(limit.left_out) == 3
    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    marked = {(b["draft"], b["slug"]): b["action_detail"]
              for d in json.loads(capsys.readouterr().out)["drafts"]
              for b in d["builds"] if b["action"] == "left out"}
    assert marked == {(o.draft, o.slug): f"by the k advice: {o.reason}" for o in limit.left_out}
    assert not (tmp_path / "work" / "builds").exists() or not any((tmp_path / "work" / "builds").iterdir())
