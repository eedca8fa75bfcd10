"""Where a local model's builds live in a store (issue 11, must show 8): two different models in directories
of the same name get different store paths and LATESTs; a symlinked model directory and its target get the
same path, and a re-run through either reuses the version without compiling.

The store path comes from one function (compile.modelref.store_name), recorded once in build.json; the plan
and the publisher both take it from there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fusedspec.compile.backend import describe_build, read_build_description, write_build_description
from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.compile.toolchain import code_version, cpu_toolchain
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import RunPlan, plan_run
from fusedspec.registry.listing import list_versions
from fusedspec.registry.publish import publish_artifact
from tests.fixtures.fake_artifacts import make_artifact, write_vouching_validation
from tests.fixtures.flow_runs import FlowEnv

MATRIX = {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
          "dtype": ["float32"]}


def plan_for(target: Path, draft: Path, settings: Settings, store: Path) -> RunPlan:
    return plan_run(run_config_from_dict({"target": str(target), "draft": str(draft), "backend": "cpu",
                                          "matrix": MATRIX, "compile": {"aot_inductor": False},
                                          "publish": {"uri": str(store)}}), settings)


def artifact_of(plan: RunPlan, out: Path) -> Path:
    """A hand-made artifact (no compile) whose build.json records the plan's models, as a compile would."""
    [planned] = plan.builds
    make_artifact(out, key=planned.key)
    backend = SimpleNamespace(name="cpu", code_version=code_version("cpu"), toolchain=cpu_toolchain)
    write_build_description(out, describe_build(planned.spec, plan.target, plan.draft, keys=planned.all_keys,
                                                backend=backend,  # type: ignore[arg-type]
                                                options={}, programs=[], programs_from=None))
    write_vouching_validation(out, planned.key, planned.spec)  # for this build.json's spec, written last
    return out


def test_two_models_in_directories_of_one_name_get_their_own_paths_and_latests(
        tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    store = tmp_path / "store"
    first, second = tmp_path / "team-a" / "model", tmp_path / "team-b" / "model"  # same name, other weights
    shutil.copytree(tiny_target, first)
    shutil.copytree(tiny_drafts["perturbed"], second)
    plans = [plan_for(model, tiny_drafts["cut"], settings, store) for model in (first, second)]
    paths = [plan.config_path(plan.builds[0]) for plan in plans]
    assert paths[0] != paths[1] and all(p.startswith("model-") for p in paths)

    results = [publish_artifact(artifact_of(plan, tmp_path / f"artifact-{i}"), str(store), settings)
               for i, plan in enumerate(plans)]
    assert [r.config_path for r in results] == paths  # the publisher's path is the plan's (from build.json)
    for i, result in enumerate(results):
        description = read_build_description(tmp_path / f"artifact-{i}")
        assert result.config_path.split("/")[0] == description.target.store_name
    configs = {c.path: c.latest for c in list_versions(str(store), settings)}
    assert configs == {paths[0]: results[0].key, paths[1]: results[1].key}  # a LATEST each, naming its own


# a real flow run (one build, compiled once per session in the shared work dir), then a re-run
@pytest.mark.slow
def test_a_symlinked_model_directory_reuses_its_targets_version(warm_flow_env: FlowEnv, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    env = warm_flow_env
    link = tmp_path / "models" / "current"
    link.parent.mkdir()
    link.symlink_to(env.target, target_is_directory=True)
    direct = plan_for(env.target, env.draft, env.settings, tmp_path / "store")
    linked = plan_for(link, env.draft, env.settings, tmp_path / "store")
    assert linked.config_path(linked.builds[0]) == direct.config_path(direct.builds[0])
    assert linked.builds == direct.builds  # the same content key

    first = env.run_inprocess(env.config(matrix={"speculation_length": [3]}), monkeypatch)
    assert first["counts"]["published"] == 1, first["text"]
    again = env.run_inprocess(env.config(target=str(link), matrix={"speculation_length": [3]}), monkeypatch)
    assert again["counts"] == {**again["counts"], "compiled": 0, "published": 0, "reused": 1}, again["text"]
    assert again["outcomes"][0]["version_uri"] == first["outcomes"][0]["version_uri"]
