"""Choosing the draft as well as k (issue 23): every (draft, k) ranked per class by each draft's own cost,
why the winner wins, and `fusedspec advise` with several drafts on tiny real models and a local Hub."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import yaml

from fusedspec.compile.documents.validation import AdviceRecord
from fusedspec.core.errors import ConfigError
from fusedspec.flows.cli import main
from fusedspec.validate.acceptance import OVERALL, PromptAgreement, predict
from fusedspec.validate.advice import CostModel, advise
from fusedspec.validate.draft_choice import format_ranking, rank_drafts
from fusedspec.validate.step_costs import BYTES_MODEL_SOURCE
from tests.test_advice import _advise

PROMPTS = [
    {"id": "rep", "class": "repeat", "text": "Repeat this line 5 times: all work and no play"},
    {"id": "story", "class": "prose", "text": "Once upon a time, in a quiet village,"},
]


def _prompt(pattern: list[bool], cls: str, pid: str, n: int = 64) -> PromptAgreement:
    hits = tuple([False] + [pattern[i % len(pattern)] for i in range(n - 1)])
    return PromptAgreement(id=pid, cls=cls, n_tokens=n, draft_hits=hits, target_flips=0)


def _record(patterns: dict[str, list[bool]], cost_ratio: float) -> AdviceRecord:
    prompts = [_prompt(pattern, cls, cls) for cls, pattern in patterns.items()]
    return advise(predict(prompts, range(2, 12)), CostModel(cost_ratio)).record()


def test_the_larger_draft_wins_where_acceptance_outweighs_the_cheaper_steps() -> None:
    # The write-up's case: the small draft costs a third, but agrees on structured text far less often.
    large = _record({"structured": [True] * 9 + [False], "prose": [True, False]}, cost_ratio=0.15)
    small = _record({"structured": [True, False, False], "prose": [True, False, False, False]},
                    cost_ratio=0.05)
    ranking = rank_drafts({"large": large, "small": small})

    for cls in ("structured", "prose", OVERALL):
        everything = [(row.speedup, -row.k, draft) for draft, rec in (("large", large), ("small", small))
                      for c in rec.classes if c.cls == cls for row in c.by_k]
        speedup, minus_k, draft = max(everything, key=lambda t: (t[0], t[1]))
        best = ranking.best(cls)
        assert best is not None and (best.draft, best.k, best.speedup) == (draft, -minus_k, speedup)
        ranked = [o.speedup for o in ranking.options[cls]]
        assert ranked == sorted(ranked, reverse=True) and len(ranked) == 2 * 10  # every (draft, k)
    assert ranking.best("structured").draft == "large"
    why = ranking.explain("structured")
    assert "serve draft large at k = " in why
    assert "small: best k = " in why and "its draft step is 3.0x cheaper" in why
    assert "fewer draft tokens per step" in why and "but" in why
    # what decides, in numbers the user can check: speedup = tokens per fused step / that step's cost
    for option in ranking.options["structured"]:
        assert option.speedup == pytest.approx(option.tokens_per_step / option.step_cost)
    small_best = ranking.best_of("structured", "small")
    assert small_best is not None and f"yields {small_best.tokens_per_step:.2f} tokens" in why
    assert [o.draft for o in ranking.top("structured", 3)] == \
        [o.draft for o in ranking.options["structured"][:3]]
    text = format_ranking(ranking)
    assert "[structured]" in text and "[overall]" in text and "given" in text
    doc = ranking.to_json()
    assert doc["classes"]["structured"]["best"]["draft"] == "large"  # type: ignore[index]


def test_a_tie_is_called_one_and_goes_to_the_draft_named_first() -> None:
    same = {"structured": [True] * 4 + [False]}
    ranking = rank_drafts({"first": _record(same, 0.1), "second": _record(same, 0.1)})
    assert ranking.best("structured").draft == "first"  # type: ignore[union-attr]
    assert "tied at" in ranking.explain("structured") and \
        "first wins by being named first" in ranking.explain("structured")


def test_no_draft_that_pays_off_means_do_not_speculate() -> None:
    costly = {"a": _record({"prose": [True, False]}, cost_ratio=1.0),
              "b": _record({"prose": [False, True, False]}, cost_ratio=0.9)}
    ranking = rank_drafts(costly)
    assert ranking.best("prose") is None and ranking.top("prose", 3) == []
    assert "do not speculate" in ranking.explain("prose")


def test_drafts_advised_on_other_prompts_are_refused() -> None:
    with pytest.raises(ConfigError, match="same prompt set"):
        rank_drafts({"a": _record({"prose": [True]}, 0.1), "b": _record({"code": [True]}, 0.1)})
    with pytest.raises(ConfigError, match="at least one --draft"):
        rank_drafts({})


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("draft-choice") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS))
    return path


def test_advise_ranks_two_drafts_of_different_size_and_agreement(tiny_target: Path,
                                                                 tiny_drafts: dict[str, Path],
                                                                 prompts: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # 2 layers with noise; 1 of 2 layers
    perturbed, cut = str(tiny_drafts["perturbed"]), str(tiny_drafts["cut"])
    plot = tmp_path / "drafts.png"
    common = ["--target", str(tiny_target), "--draft", perturbed, "--draft", cut, "--prompts", str(prompts),
              "--max-new-tokens", "12", "--k-range", "2..6"]
    code, out, err = _advise(capsys, *common, "--cost-ratio", "0.3", "--cost-ratio", "0.15", "--plot",
                             str(plot), "--top-per-class", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    kept = doc["top_per_class"]  # what a run config with matrix.top_per_class 2 would build: the same rule
    for cls, options in kept["by_class"].items():
        assert [(o["draft"], o["k"]) for o in options] == [
            (o["draft"], o["k"]) for o in doc["ranking"]["classes"][cls]["ranked"][:2]]
    assert {(d, k) for d, ks in kept["builds"].items() for k in ks} == {
        (o["draft"], o["k"]) for options in kept["by_class"].values() for o in options}
    assert [d["draft"] for d in doc["drafts"]] == [perturbed, cut]
    assert [d["advice"]["cost_model"]["cost_ratio"] for d in doc["drafts"]] == [0.3, 0.15]  # each its own c
    assert plot.read_bytes()[:4] == b"\x89PNG"
    for cls in ("repeat", "prose", OVERALL):
        rows = [(row["speedup"], -row["k"], -i, d["draft"]) for i, d in enumerate(doc["drafts"])
                for c in d["advice"]["classes"] if c["class"] == cls for row in c["by_k"]]
        speedup, minus_k, _, draft = max(rows)
        best = doc["ranking"]["classes"][cls]["best"]
        assert (best["draft"], best["k"]) == (draft, -minus_k) if speedup > 1 else best is None

    code, out, err = _advise(capsys, *common, "--cost-ratio", "0.3", "--cost-ratio", "0.15")
    assert code == 0, err
    assert f"=== draft {perturbed}" in out and f"=== draft {cut}" in out
    assert "drafts and k ranked per class" in out and "[overall]" in out


def test_advise_measures_each_drafts_own_cost_on_this_host(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                          prompts: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(tiny_drafts["perturbed"]),
                             "--draft", str(tiny_drafts["cut"]), "--prompts", str(prompts),
                             "--max-new-tokens", "8", "--k-range", "2..4", "--variants", "raw", "--json")
    assert code == 0, err
    measured = [d["advice"]["measurement"] for d in json.loads(out)["drafts"]]
    # the same target timed for both; the 1-layer draft's step is its own, measured, not the other's
    assert all(m["t_draft_s"] > 0 and m["t_target_s"] > 0 for m in measured)
    assert measured[0]["t_draft_s"] != measured[1]["t_draft_s"]


@pytest.mark.parametrize("extra, words", [
    (["--cost-ratio", "0.1"], "--cost-ratio is given once for 2 drafts"),
    (["--draft", "{perturbed}/", "--cost-ratio", "0.1", "--cost-ratio", "0.1", "--cost-ratio", "0.1"],
     "is --draft {perturbed} again"),  # the same directory, spelled another way
    (["--draft", "{target}", "--cost-ratio", "0.1", "--cost-ratio", "0.1", "--cost-ratio", "0.1"],
     "is the target {target} again"),
    (["--plot", "{folder}"], "is a directory"),
    (["--plot", "{steps}/x.png"], "is a file, not a directory"),
    (["--step-times", "{steps}"], "with several drafts give --cost-ratio once per --draft"),
    (["--cost-ratio", "0.1", "--cost-ratio", "0"], "--cost-ratio 0.0"),
])
def test_advise_with_drafts_refuses_options_that_do_not_fit_them(tiny_target: Path,
                                                                 tiny_drafts: dict[str, Path],
                                                                 prompts: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 extra: list[str], words: str) -> None:
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"where": "trn2", "k": 4, "target_step_s": 0.02, "fused_step_s": 0.03}))
    plot = tmp_path / "p.png"
    folder = tmp_path / "plots.png"  # a directory a careless --plot names
    folder.mkdir()
    values = {"perturbed": tiny_drafts["perturbed"], "steps": steps, "target": tiny_target, "folder": folder}
    filled = [e.format(**values) for e in extra]
    code, _, err = _advise(capsys, "--target", str(tiny_target), "--draft", str(tiny_drafts["perturbed"]),
                           "--draft", str(tiny_drafts["cut"]), "--prompts", str(prompts), "--plot", str(plot),
                           *filled)
    assert code == 2 and words.format(**values) in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["plots.png", "steps.json"]  # no plot, nothing else


def test_a_draft_with_another_tokenizer_is_refused_by_name_before_any_weights_move(
        hub, tiny_target: Path, tiny_drafts: dict[str, Path], prompts: Path, tmp_path: Path,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other-draft"
    shutil.copytree(tiny_drafts["cut"], other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    hub.add_repo("choice/target", tiny_target)
    hub.add_repo("choice/good-draft", tiny_drafts["perturbed"])
    hub.add_repo("choice/other-draft", other)
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.reset_counters()
    code, _, err = _advise(capsys, "--target", "hf://choice/target", "--draft", "hf://choice/good-draft",
                           "--draft", "hf://choice/other-draft", "--prompts", str(prompts),
                           "--cost-ratio", "0.2", "--cost-ratio", "0.1")
    assert code == 1 and "draft hf://choice/other-draft" in err and "chat template" in err, err
    for repo in ("choice/target", "choice/good-draft", "choice/other-draft"):
        assert "model.safetensors" not in hub.files_served(repo), repo  # configs and tokenizers only


def _qwen3_config_dir(directory: Path, name: str, tokenizer: Path) -> Path:
    from tests.test_neuron_translate import qwen3_config, write_config

    write_config(directory, qwen3_config(name))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer / file, directory / file)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")  # pinned, never read
    return directory


def test_a_neuron_dry_run_compares_the_drafts_stated_costs_before_any_compile(
        qwen3_tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23 must-show 3: Qwen3-32B with drafts Qwen3-0.6B and Qwen3-1.7B, config-only directories."""
    target = _qwen3_config_dir(tmp_path / "Qwen3-32B", "Qwen3-32B", qwen3_tokenizer)
    small = _qwen3_config_dir(tmp_path / "Qwen3-0.6B", "Qwen3-0.6B", qwen3_tokenizer)
    large = _qwen3_config_dir(tmp_path / "Qwen3-1.7B", "Qwen3-1.7B", qwen3_tokenizer)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "target": str(target), "draft": str(large), "backend": "neuron",
        "matrix": {"tp_degree": [32], "seq_len": [1024], "speculation_length": [5, 7], "batch_size": [4],
                   "dtype": ["bfloat16"]}}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    assert main(["compile", str(config), "--dry-run", "--draft", str(small), "--draft", str(large),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["draft"] for d in doc["drafts"]] == [str(small), str(large)]
    rows = doc["ranking_inputs"]["cost_ratio_per_build"]
    assert [row["slug"] for row in rows] == ["tp32-seq1024-k5-bs4-bfloat16", "tp32-seq1024-k7-bs4-bfloat16"]
    for row in rows:
        c_small, c_large = (row["cost"][str(d)]["cost_ratio"] for d in (small, large))
        assert row["cost"][str(small)]["source"] == BYTES_MODEL_SOURCE
        # the 0.6B reads less per step than the 1.7B; both far less than 32B
        assert 0 < c_small < c_large < 0.15
    keys = [{b["key"] for b in d["builds"]} for d in doc["drafts"]]
    assert not keys[0] & keys[1]  # another draft, other builds
    assert "fusedspec advise --target" in doc["ranking_inputs"]["acceptance"]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # a dry run writes nothing

    assert main(["compile", str(config), "--dry-run", "--draft", str(small), "--draft", str(large)]) == 0
    out = capsys.readouterr().out
    assert f"=== draft {small}" in out and f"=== draft {large}" in out
    assert "the ranking's inputs" in out and f"{small}: c = " in out and BYTES_MODEL_SOURCE in out

    # A run config that lists both drafts: its dry run is the same comparison, and its plan builds both
    listed = tmp_path / "both.yaml"
    listed.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()),
                                      "draft": [str(small), str(large)]}))
    assert main(["compile", str(listed), "--dry-run", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["ranking_inputs"] == doc["ranking_inputs"] and \
        [d["draft"] for d in same["drafts"]] == [str(small), str(large)]
    assert main(["plan", str(listed), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [d["ref"] for d in planned["drafts"]] == [str(small), str(large)]
    assert [(b["draft"], b["spec"]["speculation_length"]) for b in planned["builds"]] == [
        (str(d), k) for d in (small, large) for k in (5, 7)]
    assert {b["key"] for b in planned["builds"]} == keys[0] | keys[1]  # the keys of each draft's own plan
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == \
        sorted([*before, Path("both.yaml")])


def test_the_dry_runs_advise_command_ranks_what_the_run_would(qwen3_tokenizer: Path, prompts: Path,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The dry run's ranking inputs name the `fusedspec advise` command that measures the acceptance: with the
    run's prompts, length, ks, dtype, given costs and top_per_class. It named the models only, so advise ran
    at its defaults (the shipped prompt set, k 2..16, costs measured) and ranked something else."""
    target = _qwen3_config_dir(tmp_path / "Qwen3-32B", "Qwen3-32B", qwen3_tokenizer)
    small = _qwen3_config_dir(tmp_path / "Qwen3-0.6B", "Qwen3-0.6B", qwen3_tokenizer)
    large = _qwen3_config_dir(tmp_path / "Qwen3-1.7B", "Qwen3-1.7B", qwen3_tokenizer)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "target": str(target), "draft": [str(small), str(large)], "backend": "neuron",
        "matrix": {"tp_degree": [32], "seq_len": [1024], "speculation_length": [7, 5], "batch_size": [4],
                   "dtype": ["bfloat16"], "top_per_class": 2},
        "validation": {"prompts": str(prompts), "max_new_tokens": 24, "cost_ratio": [0.05, 0.125]}}))

    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    advise = json.loads(capsys.readouterr().out)["ranking_inputs"]["acceptance"]
    assert advise.startswith(f"fusedspec advise --target {target} --draft {small} --draft {large} "), advise
    for flag in (f"--prompts {prompts}", "--k-range 5,7", "--max-new-tokens 24", "--dtype bfloat16",
                 "--cost-ratio 0.05 --cost-ratio 0.125", "--top-per-class 2"):
        assert flag in advise, (flag, advise)


@pytest.mark.parametrize("extra, words", [
    ([], "--draft compares drafts in a dry run: add --dry-run"),
    (["--dry-run", "--key", "abc"], "--key and --draft"),
    (["--dry-run", "--draft", "{small}"], "is given twice"),
])
def test_comparing_drafts_refuses_a_real_compile_and_a_key(qwen3_tokenizer: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          extra: list[str], words: str) -> None:
    target = _qwen3_config_dir(tmp_path / "Qwen3-32B", "Qwen3-32B", qwen3_tokenizer)
    small = _qwen3_config_dir(tmp_path / "Qwen3-0.6B", "Qwen3-0.6B", qwen3_tokenizer)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"target": str(target), "draft": str(small), "backend": "neuron",
                                      "matrix": {"tp_degree": [32], "seq_len": [1024],
                                                 "speculation_length": [7], "batch_size": [4],
                                                 "dtype": ["bfloat16"]}}))
    filled = [e.format(small=small) for e in extra]
    assert main(["compile", str(config), "--draft", str(small), *filled]) == 2
    assert words in capsys.readouterr().err


def test_a_compared_draft_with_another_tokenizer_is_named(qwen3_tokenizer: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = _qwen3_config_dir(tmp_path / "Qwen3-32B", "Qwen3-32B", qwen3_tokenizer)
    large = _qwen3_config_dir(tmp_path / "Qwen3-1.7B", "Qwen3-1.7B", qwen3_tokenizer)
    other = _qwen3_config_dir(tmp_path / "other", "Qwen3-0.6B", qwen3_tokenizer)
    settings = json.loads((other / "tokenizer_config.json").read_text())
    settings["chat_template"] = "{{ messages[0]['content'] }}"
    (other / "tokenizer_config.json").write_text(json.dumps(settings))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"target": str(target), "draft": str(large), "backend": "neuron",
                                      "matrix": {"tp_degree": [32], "seq_len": [1024],
                                                 "speculation_length": [7], "batch_size": [4],
                                                 "dtype": ["bfloat16"]}}))
    assert main(["compile", str(config), "--dry-run", "--draft", str(large), "--draft", str(other)]) == 1
    assert f"draft {other}" in capsys.readouterr().err
