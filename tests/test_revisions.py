"""A new revision of a model compiles nothing: its builds reuse the programs of their graph key.

The tiny pair's revision A (the session's tiny target and perturbed draft), then revision B of the target
(same config, new weights) and a new revision of the draft, each through the pipeline a run uses (plan,
process_build: download, build, greedy gate, publish) on 2 builds, tp 1 and 2 at k 3 (tp is what shards
weights apart from programs; another k is another graph key and adds nothing here). Then a second work dir
with the same store, as a second machine: programs come from the store when its manifests are signed by the
verify key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.compile.documents.manifest import Manifest
from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.core.settings import Settings
from fusedspec.flows.pipeline import ConfigOutcome, plan_work, process_build
from fusedspec.flows.planning import RunPlan, plan_run
from fusedspec.registry.signing import generate_keys
from fusedspec.registry.stores import open_store
from fusedspec.registry.verify import verify_version

pytestmark = pytest.mark.slow  # 2 compiles, then every build reuses their programs: 142 s for the file

MATRIX = {"tp_degree": [1, 2], "seq_len": [128], "speculation_length": [3], "batch_size": [1],
          "dtype": ["float32"]}
PROGRAMS = ("programs/context_encoding.pt2", "programs/fused_step.pt2")


@pytest.fixture(scope="module")
def revisions(tiny_target: Path, tiny_drafts: dict[str, Path],
              tiny_revisions_b: dict[str, Path]) -> dict[str, Path]:
    """Revision A of both models, and a new revision of each: the same config.json, other weights."""
    return {"target A": tiny_target, "draft A": tiny_drafts["perturbed"],
            "target B": tiny_revisions_b["target"], "draft B": tiny_revisions_b["draft"]}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text('{"id": "code", "class": "structured", "text": "def fibonacci(n):"}\n'
                    '{"id": "story", "class": "prose", "text": "Once upon a time, there lived a robot '
                   'who"}\n')
    return path


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return generate_keys()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, keys: tuple[str, str]) -> Settings:
    """The first machine: it signs what it publishes."""
    return Settings(work_dir=tmp_path_factory.mktemp("machine-1"), signing_key=keys[0])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


def plan_for(target: Path, draft: Path, prompts: Path, store: Path, settings: Settings) -> RunPlan:
    config = {"target": str(target), "draft": str(draft), "backend": "cpu", "matrix": MATRIX,
              "validation": {"prompts": str(prompts), "max_new_tokens": 8, "cost_ratio": 0.1},
              "compile": {"aot_inductor": False}, "publish": {"uri": str(store)}}
    return plan_run(run_config_from_dict(config), settings)


def run_all(plan: RunPlan, settings: Settings) -> list[ConfigOutcome]:
    outcomes = [process_build(plan, planned, settings) for planned in plan.builds]
    assert [(o.status, o.failed_stage, o.reason) for o in outcomes] == \
        [("published", None, None)] * len(outcomes)
    return outcomes


@pytest.fixture(scope="module")
def revision_a(revisions: dict[str, Path], prompts: Path, store: Path,
               machine: Settings) -> list[ConfigOutcome]:
    plan = plan_for(revisions["target A"], revisions["draft A"], prompts, store, machine)
    assert [w.action for w in plan_work(plan, machine)] == ["compile"] * 2
    outcomes = run_all(plan, machine)
    assert [o.compiled for o in outcomes] == [True] * 2
    return outcomes


def program_bytes(version_uri: str) -> dict[str, bytes]:
    manifest = Manifest.read(Path(version_uri) / "manifest.json")
    assert sorted(manifest.programs) == list(PROGRAMS)
    return {rel: (Path(version_uri) / manifest.attempt / rel).read_bytes() for rel in manifest.programs}


@pytest.mark.parametrize("changed", ["target", "draft"])
def test_a_new_revision_compiles_nothing_and_uploads_only_its_weights(
        changed: str, revisions: dict[str, Path], prompts: Path, store: Path, machine: Settings,
        revision_a: list[ConfigOutcome]) -> None:
    target = revisions["target B" if changed == "target" else "target A"]
    draft = revisions["draft B" if changed == "draft" else "draft A"]
    plan = plan_for(target, draft, prompts, store, machine)
    first = {o.slug: o for o in revision_a}
    assert [b.graph_key for b in plan.builds] == [first[b.slug].graph_key for b in plan.builds]
    assert not {b.key for b in plan.builds} & {o.key for o in revision_a}  # new versions
    work = plan_work(plan, machine)
    assert [w.action for w in work] == ["reuse programs"] * 2
    assert all("shard weights only" in w.detail for w in work)

    outcomes = run_all(plan, machine)
    weights: dict[str, int] = {}  # sha256 -> size of each new weight file
    documents = 0
    for outcome in outcomes:
        assert not outcome.compiled and outcome.work == "reuse programs"
        assert outcome.validation is not None and outcome.validation.passed  # the gate ran on the new weights
        assert outcome.advice is not None  # and the k advice was measured again
        report = verify_version(outcome.version_uri or "", machine)
        assert report.ok, report.problems
        old = first[outcome.slug]
        assert program_bytes(outcome.version_uri or "") == program_bytes(old.version_uri or "")
        assert outcome.files_copied >= len(PROGRAMS)  # the programs, copied inside the store
        manifest = Manifest.read(Path(outcome.version_uri or "") / "manifest.json")
        weights |= {e.sha256: e.size for rel, e in manifest.files.items() if rel.startswith("weights/")}
        documents += sum(e.size for rel, e in manifest.files.items()
                         if rel in ("build.json", "validation.json", "advice.png"))
    sent = sum(o.bytes_sent for o in outcomes)
    # uploaded: each new weight file once, the builds' own documents, manifests and pointers; nothing else
    assert sum(weights.values()) <= sent <= sum(weights.values()) + documents + 64 * 1024 * len(outcomes)


def test_new_weights_that_break_the_artifact_fail_the_gate_though_programs_were_reused(
        revisions: dict[str, Path], prompts: Path, store: Path, machine: Settings,
        revision_a: list[ConfigOutcome], tmp_path: Path) -> None:
    """The gate is never skipped for reused programs. What breaks here is one target tensor of the new
    revision's artifact, scaled after sharding (as a shard that does not fit its programs would compute): a
    checkpoint's own tensor, however odd, is also what the Hugging Face reference computes, so only the
    artifact can be wrong."""
    from fusedspec.compile.build import build_artifact
    from tests.support.fault_backend import perturb_artifact

    settings = Settings(work_dir=machine.work_dir)  # same work dir, same program cache
    broken = revisions["target B"]
    plan = plan_for(broken, revisions["draft B"], prompts, store, settings)
    planned = plan.builds[0]
    built = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options,
                           keys=planned.all_keys)
    assert built.work == "programs"
    perturb_artifact(built.path)
    outcome = process_build(plan, planned, settings)
    assert outcome.status == "failed" and outcome.failed_stage == "validate", outcome.reason
    assert outcome.validation is not None and not outcome.validation.passed
    assert not (store / plan.config_path(planned) / planned.key).exists()  # nothing published for it


def test_another_machine_takes_the_programs_from_the_store_only_under_its_verify_key(
        revisions: dict[str, Path], prompts: Path, store: Path, keys: tuple[str, str],
        revision_a: list[ConfigOutcome], tmp_path: Path) -> None:
    from fusedspec.demo.models import derive_draft
    from fusedspec.registry.graphs import fetch_programs, programs_in_store

    third = derive_draft(revisions["target A"], tmp_path / "target-c", noise=0.02, seed=23)
    unkeyed = Settings(work_dir=tmp_path / "machine-2")
    plan = plan_for(third, revisions["draft A"], prompts, store, unkeyed)
    work = plan_work(plan, unkeyed)
    assert [w.action for w in work] == ["compile"] * 2
    assert all("no verify key is set" in w.detail and "FUSEDSPEC_VERIFY_KEY" in w.detail for w in work), work

    other = Settings(work_dir=tmp_path / "machine-2", verify_key=keys[1])
    assert [w.action for w in plan_work(plan, other)] == ["reuse programs"] * 2
    outcomes = run_all(plan, other)
    first = {o.slug: o for o in revision_a}
    for outcome in outcomes:
        assert not outcome.compiled and outcome.programs_from is not None and \
            str(store) in outcome.programs_from
        assert program_bytes(outcome.version_uri or "") == \
            program_bytes(first[outcome.slug].version_uri or "")

    # machine 2 signs nothing: its versions point nowhere, and the signed pointer of machine 1 still stands
    strangers = Settings(work_dir=tmp_path / "machine-3", verify_key=generate_keys()[1])
    found = programs_in_store(open_store(str(store), strangers), plan.builds[0].graph_key, strangers)
    assert found.version is None and "not by the configured verify key" in (found.refusal or ""), found
    assert fetch_programs(open_store(str(store), strangers), plan.builds[0].graph_key, "cpu",
                          strangers) is None
    assert not strangers.programs_dir.exists() or not any(strangers.programs_dir.iterdir())

