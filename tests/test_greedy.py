"""The greedy gate on real cpu artifacts built from tiny Qwen3 checkpoints: correct artifacts pass, a
perturbed shard fails with a report, near-ties are tolerated only up to the tolerance (and every token
after them is still compared, on the reference's path), batch-4 artifacts pass the staggered check,
measured fused steps equal the predicted ones, the reference is computed once per matrix, bad inputs
exit 2."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fusedspec.compile.documents.validation import ValidationDocument
from fusedspec.core.errors import ArtifactError, GreedyMismatchError, PromptError
from fusedspec.core.files import is_temp_name
from fusedspec.core.settings import Settings, load_settings
from fusedspec.flows.cli import main
from fusedspec.validate.greedy import (
    VALIDATION_FILE,
    ArtifactValidation,
    NearTieWarning,
    ValidationRequest,
    check_greedy,
    compare,
    validate_artifact,
)
from fusedspec.validate.reference import Reference

pytestmark = pytest.mark.slow  # compiles four artifacts (cached under the work dir after the first run)

SMALL_SET = [
    {"id": "rep", "class": "repeat", "text": "Repeat this line 3 times: all work and no play"},
    {"id": "code", "class": "code", "text": "def add(a, b):"},
    {"id": "story", "class": "prose", "text": "Once upon a time, in a quiet village,"},
]
MAX_NEW = 12
# (tp, k, draft, batch): four configs over one target, drafts from identical to unrelated. They are
# builds that tests/test_cpu_equivalence.py makes too, so a full run compiles them once (session fixture).
MATRIX = [(1, 7, "copy", 4), (2, 2, "cut", 1), (4, 4, "unrelated", 4), (2, 4, "copy", 1)]


@pytest.fixture(scope="module")
def small_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("greedy-prompts") / "small.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in SMALL_SET))
    return path


@pytest.fixture(scope="module")
def artifacts(build_tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Hard-linked copies of the session's builds (directory names, so keys, kept): validation writes its
    report and plot into the artifact, and other test files check the builds' own layout."""
    copies = tmp_path_factory.mktemp("greedy-artifacts")
    return {f"tp{tp}-k{k}-{draft}-bs{batch}": _copy_artifact(built, copies / built.name)
            for tp, k, draft, batch in MATRIX
            for built in [build_tiny(tp=tp, k=k, batch=batch, draft=draft)]}


@pytest.fixture(scope="module")
def fresh_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The work dir's settings with an empty cache, so reference computations can be counted."""
    return replace(load_settings(), work_dir=tmp_path_factory.mktemp("greedy-work"))


def _validate(artifact: Path, settings: Settings, prompts: Path | str = "default",
              **options: object) -> ArtifactValidation:
    """validate_artifact with what a caller hands it: the artifact's models (found from its build.json, as
    `fusedspec validate` finds them) and the loaded prompt set."""
    from fusedspec.compile.backend import read_build_description
    from fusedspec.flows.artifact_models import artifact_model_dirs
    from fusedspec.validate.prompts import load_prompt_set

    description = read_build_description(artifact)
    target_dir, draft_dir = artifact_model_dirs(description, settings)
    request = ValidationRequest(artifact, description, target_dir, draft_dir, load_prompt_set(prompts),
                                **options)  # type: ignore[arg-type]
    return validate_artifact(request, settings)


@pytest.fixture(scope="module")
def validated(artifacts: dict[str, Path], fresh_settings: Settings,
              small_prompts: Path) -> tuple[dict[str, ArtifactValidation], int, list[str]]:
    results = {name: _validate(path, fresh_settings, small_prompts, max_new_tokens=MAX_NEW, cost_ratio=0.1)
               for name, path in artifacts.items()}
    computed = [r.reference.key for r in results.values() if not r.reference.from_cache]
    return results, len(computed), computed


def _copy_artifact(artifact: Path, dest: Path) -> Path:
    """A copy sharing file data by hard links; every change below replaces a file, never writes into one."""
    shutil.copytree(artifact, dest, copy_function=os.link)
    (dest / VALIDATION_FILE).unlink(missing_ok=True)
    return dest


def _rewrite_tensor(shard: Path, name: str, change) -> None:  # noqa: ANN001 - tensor -> tensor
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(shard))
    tensors[name] = change(tensors[name].clone())
    tmp = shard.with_name(shard.name + ".new")
    save_file(tensors, str(tmp))
    tmp.replace(shard)  # a new file: the original artifact's hard-linked data stays untouched


# ---- Must show 1, 3, 4: the matrix ----------------------------------------------------------------


def test_correct_artifacts_pass_and_say_so(validated, artifacts: dict[str, Path]) -> None:  # noqa: ANN001
    results, _, _ = validated
    for name, result in results.items():
        assert result.passed, result.greedy.summary()
        assert all(p.status == "match" for p in result.greedy.prompts)
        document = ValidationDocument.read(artifacts[name] / VALIDATION_FILE)
        assert document.passed is True and document.greedy.counts.mismatches == 0
        counts, staggered = document.greedy.counts, document.staggered
        assert counts.tokens_compared == counts.tokens_generated and staggered is not None
        assert staggered.ran == (document.spec.batch_size > 1) and staggered.passed, staggered.summary
        summary = document.summary_record()
        assert (summary.mismatches, summary.near_ties, summary.steps_match) == (0, 0, True)
        assert summary.recommended_k in range(2, 17)
        assert (artifacts[name] / "advice.png").read_bytes()[:4] == b"\x89PNG"
        assert not [path for path in artifacts[name].iterdir() if is_temp_name(path.name)]


def test_measured_steps_equal_predicted_steps_for_every_artifact_and_prompt(validated) -> None:  # noqa: ANN001
    results, _, _ = validated
    for name, result in results.items():
        steps = result.document.acceptance
        assert steps is not None and steps.compared == 2 * len(SMALL_SET), name
        for row in steps.prompts:
            assert row.measured == row.predicted, (name, row)
            assert row.measured_accepted == row.predicted_accepted, (name, row)
        assert steps.steps_match is True
    # The drafts differ, so the check is not vacuous: the copy needs the fewest steps, unrelated the most.
    per_step = {n: res.document.acceptance.tokens_per_step()[0] for n, res in results.items()}
    assert per_step["tp2-k4-copy-bs1"] > 2 * per_step["tp4-k4-unrelated-bs4"]


def test_the_reference_is_computed_once_for_the_matrix(validated, fresh_settings: Settings) -> None:  # noqa: ANN001
    results, computed, keys = validated
    assert len(results) >= 4
    assert computed == 1 and len(keys) == 1
    assert {r.reference.key for r in results.values()} == set(keys)
    assert sum(r.reference.from_cache for r in results.values()) == len(results) - 1
    assert [p.stem for p in (fresh_settings.cache_dir / "reference").glob("*.json")] == keys


# ---- Must show 1: a perturbed shard -------------------------------------------------------------


def test_a_perturbed_shard_fails_with_a_report(artifacts: dict[str, Path], fresh_settings: Settings,
                                               small_prompts: Path, tmp_path: Path, validated,  # noqa: ANN001
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    broken = _copy_artifact(artifacts["tp2-k4-copy-bs1"], tmp_path / "broken")
    gen = torch.Generator().manual_seed(0)
    _rewrite_tensor(broken / "weights" / "tp1_sharded_checkpoint.safetensors",
                    "target_model.layers.0.self_attn.q_proj.weight",  # sharded: rank 1 holds its own half
                    lambda w: w + 2 * w.std() * torch.randn(w.shape, generator=gen))
    code = main(["validate", str(broken), "--prompts", str(small_prompts), "--max-new-tokens", str(MAX_NEW),
                 "--no-advice", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    doc = json.loads(out)
    greedy = doc["report"]["greedy"]
    assert doc["passed"] is False and greedy["counts"]["mismatches"] >= 1
    first = greedy["mismatches"][0]
    assert first["id"] in {f"{p['id']}:{v}" for p in SMALL_SET for v in ("raw", "chat")}
    assert first["position"] is not None and first["expected"] != first["got"]
    assert first["expected_text"] and first["got_text"] and first["prompt_text"]
    assert first["gap"] is None or first["gap"] >= greedy["tolerance"]
    assert first["id"] in err and "FAILED" in err
    written = json.loads((broken / VALIDATION_FILE).read_text())
    assert written["passed"] is False and written["acceptance"] is None
    assert not (broken / "advice.png").exists(), "the copied advice.png of the good artifact was removed"
    # The original, sharing the other files, still validates.
    assert json.loads((artifacts["tp2-k4-copy-bs1"] / VALIDATION_FILE).read_text())["passed"] is True


# ---- Must show 2: near-ties ------------------------------------------------------------------------


def _runner_up_logit(target_dir: Path, prompt_ids: list[int], token: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    with torch.inference_mode():
        return float(model(torch.tensor([prompt_ids])).logits[0, -1, token])


def test_near_tie_passes_below_the_tolerance_and_fails_above(artifacts: dict[str, Path], tiny_target: Path,
                                                              validated, small_prompts: Path,  # noqa: ANN001
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.compile.backend import get_backend

    results, _, _ = validated
    reference: Reference = results["tp1-k7-copy-bs4"].reference
    # The smallest-margin position whose runner-up token is not in its own input (so raising that token's
    # output row moves only its logit there): raise the runner-up by 1.5x the margin, flipping the choice.
    # Margins under 1e-5 are left out: there float32 rounding (~1e-6) could decide instead of the bump.
    candidates = sorted(((p.margins[j], p, j) for p in reference.prompts for j in range(len(p.tokens))
                         if p.runner_up[j] not in set(p.prompt_ids) | set(p.tokens[:j])
                         and p.margins[j] > 1e-5),
                        key=lambda c: c[0])
    margin, prompt, j = candidates[0]
    runner_up = prompt.runner_up[j]
    logit = _runner_up_logit(tiny_target, list(prompt.prompt_ids) + list(prompt.tokens[:j]), runner_up)
    factor = 1 + 1.5 * margin / logit  # tied embeddings: the output row of a token is its embedding row

    tied = _copy_artifact(artifacts["tp1-k7-copy-bs4"], tmp_path / "near-tie")  # tp=1: one shard
    def bump(w):  # noqa: ANN001, ANN202, E306
        w[runner_up] *= factor
        return w
    _rewrite_tensor(tied / "weights" / "tp0_sharded_checkpoint.safetensors",
                    "target_model.embed_tokens.weight", bump)

    runner = get_backend("cpu").load(tied)
    generation = runner.generate([list(p.prompt_ids) for p in reference.prompts], reference.max_new_tokens)
    diverged = compare(generation, reference, tolerance=0.0).mismatches
    assert prompt.id in {d.id for d in diverged}
    assert all(d.gap is not None for d in diverged), "every flip goes to a token that was nearly tied"
    assert next(d for d in diverged if d.id == prompt.id).got == runner_up
    largest = max(d.gap for d in diverged)
    smallest = min(d.gap for d in diverged)
    assert largest < 0.05, "a near-tie is small"

    with pytest.warns(NearTieWarning, match=prompt.id):
        report = check_greedy(runner, reference, tolerance=2 * largest)
    assert report.passed and {t.id for t in report.near_ties} == {d.id for d in diverged}
    # past each near-tie the artifact ran again on the reference's tokens and matched the rest of them
    assert report.tokens_compared == report.tokens_generated == sum(len(p.tokens) for p in reference.prompts)
    with pytest.raises(GreedyMismatchError) as info:
        check_greedy(runner, reference, tolerance=smallest / 2)
    assert not info.value.report.passed and info.value.report.near_ties == []

    # The same through the CLI: a warning on stderr, exit 0, and validation.json says passed.
    base = ["validate", str(tied), "--prompts", str(small_prompts), "--max-new-tokens", str(MAX_NEW),
            "--no-advice"]
    assert main([*base, "--tolerance", str(2 * largest), "--json"]) == 0
    out, err = capsys.readouterr()
    counts = json.loads(out)["greedy"]["counts"]
    assert counts["near_ties"] == len(diverged) and counts["tokens_compared"] == counts["tokens_generated"]
    assert "warning: near-tie tolerated" in err and prompt.id in err
    written = json.loads((tied / VALIDATION_FILE).read_text())
    assert written["passed"] is True and written["greedy"]["near_ties"][0]["gap"] < 2 * largest


# ---- Must show 6: bad inputs -------------------------------------------------------------------


def _validate_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["validate", *args])
    return code, capsys.readouterr().err


def test_bad_inputs_exit_2_and_write_nothing(artifacts: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    artifact = _copy_artifact(artifacts["tp1-k7-copy-bs4"], tmp_path / "artifact")
    before = sorted(p.name for p in artifact.iterdir())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("- class: repeat\n  text: ok\n- class: prose\n")
    too_long = tmp_path / "long.jsonl"
    too_long.write_text(json.dumps({"id": "huge", "class": "prose", "text": "word " * 300}))
    cases = [
        ([str(artifact), "--prompts", str(empty)], "holds no prompts"),
        ([str(artifact), "--prompts", str(malformed)], "line 3: field 'text' is missing"),
        ([str(artifact), "--prompts", str(too_long)], "prompt huge:raw has"),
        ([str(artifact), "--max-new-tokens", "125"], "seq_len=128"),
        ([str(artifact), "--tolerance", "-1"],
         "--tolerance -1.0: input should be greater than or equal to 0"),
        ([str(tmp_path / "nothing-here")], "no such artifact directory"),
        ([str(tmp_path)], "no build.json"),
    ]
    for args, words in cases:
        code, err = _validate_cli(capsys, *args)
        assert code == 2 and words in err, (args, err)
    assert sorted(p.name for p in artifact.iterdir()) == before

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (artifact / name).unlink()
    code, err = _validate_cli(capsys, str(artifact))
    assert code == 2 and "no tokenizer files" in err
    assert not (artifact / VALIDATION_FILE).exists()


def test_a_target_that_changed_since_the_build_is_refused(artifacts: dict[str, Path], tiny_target: Path,
                                                          tmp_path: Path) -> None:
    artifact = _copy_artifact(artifacts["tp1-k7-copy-bs4"], tmp_path / "artifact")
    build = json.loads((artifact / "build.json").read_text())
    build["target"]["files"]["model.safetensors"] = "sha256:" + "0" * 64
    (artifact / "build.json").unlink()  # a hard link: replace it, never write through it
    (artifact / "build.json").write_text(json.dumps(build))
    with pytest.raises(ArtifactError, match="changed since this artifact was built"):
        _validate(artifact, load_settings(), max_new_tokens=4, advice=False)
    build["target"]["files"] = json.loads(
        (artifacts["tp1-k7-copy-bs4"] / "build.json").read_text())["target"]["files"]
    (artifact / "build.json").write_text(json.dumps(build))
    with pytest.raises(PromptError, match="max_new_tokens=0"):
        _validate(artifact, load_settings(), max_new_tokens=0)
    assert not (artifact / VALIDATION_FILE).exists()


# ---- what the report is of, and what runs beside the artifact ---------------------------------------


def test_a_file_changed_after_the_loader_read_it_is_refused_never_hashed_anew(
        artifacts: dict[str, Path], fresh_settings: Settings, small_prompts: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import fusedspec.validate.greedy as greedy

    artifact = _copy_artifact(artifacts["tp2-k2-cut-bs1"], tmp_path / "artifact")
    shard = artifact / "weights" / "tp0_sharded_checkpoint.safetensors"
    real = greedy.get_backend

    class SwappedAfterLoad:
        """The artifact's backend; once it has loaded, a shard is replaced by zeros of the same size, so the
        runner holds bytes the directory no longer has (as a later program's load could take that long)."""

        def __init__(self, backend: Any) -> None:
            self.backend = backend

        def load(self, *args: Any) -> Any:
            runner = self.backend.load(*args)
            swap = shard.with_name("swap")
            swap.write_bytes(bytes(shard.stat().st_size))
            swap.replace(shard)
            return runner

    monkeypatch.setattr(greedy, "get_backend", lambda name: SwappedAfterLoad(real(name)))
    with pytest.raises(ArtifactError, match=f"{shard.name}: changed since the loader read it"):
        _validate(artifact, fresh_settings, small_prompts, max_new_tokens=MAX_NEW, cost_ratio=0.1)
    assert not (artifact / VALIDATION_FILE).exists()


def test_transformers_models_are_released_before_the_artifact_loads_and_the_target_loaded_once(
        artifacts: dict[str, Path], small_prompts: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import torch
    import transformers

    import fusedspec.validate.greedy as greedy

    def held() -> list[str]:
        gc.collect()
        return [type(o).__name__ for o in gc.get_objects()
                if isinstance(o, torch.nn.Module) and type(o).__name__.endswith("ForCausalLM")]

    loads: list[Path] = []
    from_pretrained = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: loads.append(Path(path).resolve()) or from_pretrained(path, **kw))
    beside_runner: list[list[str]] = []
    real = greedy.get_backend

    class Watched:
        def __init__(self, backend: Any) -> None:
            self.backend = backend

        def load(self, *args: Any) -> Any:
            beside_runner.append(held())
            return self.backend.load(*args)

    monkeypatch.setattr(greedy, "get_backend", lambda name: Watched(real(name)))
    settings = replace(load_settings(), work_dir=tmp_path / "work")  # no reference cached: it is computed
    artifact = _copy_artifact(artifacts["tp2-k2-cut-bs1"], tmp_path / "artifact")
    result = _validate(artifact, settings, small_prompts, max_new_tokens=MAX_NEW)  # c from host forwards
    assert result.passed and not result.reference.from_cache
    advice = result.document.advice
    assert advice is not None and "transformers forwards" in advice.cost_model.source
    assert beside_runner == [[]]  # the reference, the agreement and the cost forwards all ran before
    assert sorted(loads) == sorted(p.resolve() for p in _models_of(artifact))  # each loaded once
    assert held() == []


def _models_of(artifact: Path) -> tuple[Path, Path]:
    from fusedspec.compile.backend import read_build_description
    from fusedspec.flows.artifact_models import artifact_model_dirs

    return artifact_model_dirs(read_build_description(artifact), load_settings())


# ---- an artifact built from the (local) Hub -------------------------------------------------------


def test_a_hub_built_artifact_is_checked_against_its_recorded_commit(
        hub, tiny_target: Path, tiny_drafts: dict[str, Path],  # noqa: ANN001
        small_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.compile.build import build_artifact
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.registry.download import download_model
    from fusedspec.registry.hub import resolve_model

    settings = Settings(work_dir=tmp_path / "work", hf_endpoint=hub.url)
    commit = hub.add_repo("validate-tests/tiny-target", tiny_target)
    hub.add_repo("validate-tests/tiny-draft", tiny_drafts["copy"])
    target = resolve_model("hf://validate-tests/tiny-target", settings)
    draft = resolve_model("hf://validate-tests/tiny-draft", settings)
    download_model(target, settings)
    download_model(draft, settings)
    artifact = build_artifact(BuildSpec(1, 128, 7, 4, "float32"), target, draft, settings).path
    assert (target.commit == commit
            and json.loads((artifact / "build.json").read_text())["target"]["commit"] == commit)

    # main moves on to other weights: the artifact must still be checked against the commit it was built
    # from (against main's weights it would fail at once).
    assert hub.add_repo("validate-tests/tiny-target", tiny_drafts["unrelated"]) != commit
    result = _validate(artifact, settings, small_prompts, max_new_tokens=MAX_NEW, cost_ratio=0.1)
    assert result.passed and result.document.acceptance is not None and result.document.acceptance.steps_match

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(settings.work_dir))
    code = main(["advise", "--target", f"hf://validate-tests/tiny-target@{commit}", "--draft",
                 "hf://validate-tests/tiny-draft", "--prompts", str(small_prompts), "--max-new-tokens",
                 str(MAX_NEW), "--cost-ratio", "0.1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    # The same target content and prompts: the advice reuses the reference the validation computed.
    assert doc["reference"]["key"] == result.reference.key and doc["reference"]["from_cache"] is True
    assert next(c for c in doc["advice"]["classes"] if c["class"] == "overall")["agreement"] == 1.0
