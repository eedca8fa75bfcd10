"""The compile-fused flow in this process against a real Prefect server and a real SeaweedFS:
fan-out modes publish the same keys, a failing gate publishes nothing for its config, a tokenizer
mismatch stops the run before any compile, bad parameters are rejected before any work, two runs
started together compile each config once, and a build is retried when the Hub did not answer (only then)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.flow_runs import FlowEnv

pytestmark = pytest.mark.slow


def _by_status(summary: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for outcome in summary["outcomes"]:
        found.setdefault(outcome["status"], []).append(outcome["slug"])
    return found


def test_inprocess_run_publishes_verifiable_versions_and_reruns_do_nothing(
        flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusedspec.flows.cli import main

    config = flow_env.config(fan_out={"max_workers": 2})  # two builds export at once in one process
    first = flow_env.run_inprocess(config, monkeypatch)
    assert first["counts"]["compiled"] == 2 and first["counts"]["published"] == 2, first["text"]
    assert first["advice"] and first["advice"]["classes"], "the k advice travels with the run summary"
    for outcome in first["outcomes"]:
        assert main(["verify", outcome["version_uri"]]) == 0
        assert outcome["tokens_per_step"] == outcome["predicted_tokens_per_step"]

    second = flow_env.run_inprocess(config, monkeypatch)
    assert second["counts"] == {**second["counts"], "compiled": 0, "published": 0, "reused": 2,
                                "bytes_uploaded": 0}, second["text"]

    # Adding one k compiles and uploads that config only.
    grown = flow_env.config(matrix={"speculation_length": [3, 4, 5]}, fan_out={"max_workers": 2})
    third = flow_env.run_inprocess(grown, monkeypatch)
    assert third["counts"]["compiled"] == 1 and third["counts"]["reused"] == 2, third["text"]


def test_dask_fan_out_publishes_the_same_keys(warm_flow_env: FlowEnv,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    flow_env = warm_flow_env
    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.planning import plan_run

    flow_env.use_env(monkeypatch)
    config = flow_env.config(fan_out={"mode": "dask", "max_workers": 2})
    expected = {b.key for b in plan_run(run_config_from_dict(config), load_settings()).builds}
    summary = flow_env.run_inprocess(config, monkeypatch)
    assert summary["counts"]["published"] == 2, summary["text"]
    assert flow_env.published_keys() == expected


def test_failing_greedy_gate_is_not_published_and_fails_the_run(
        warm_flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    flow_env = warm_flow_env
    flow_env.use_faults(monkeypatch, "greedy:tp1-seq64-k4-bs1-float32")
    summary = flow_env.run_inprocess(flow_env.config(backend="cpu-faults"), monkeypatch)
    assert "1 failed" in summary["failed"] and \
        "failed: tp1-seq64-k4-bs1-float32 (validate)" in summary["failed"]
    assert _by_status(summary) == {"published": ["tp1-seq64-k3-bs1-float32"],
                                   "failed": ["tp1-seq64-k4-bs1-float32"]}
    failed = next(o for o in summary["outcomes"] if o["status"] == "failed")
    assert "greedy" in failed["reason"] and failed["key"] not in flow_env.published_keys()
    assert len(flow_env.published_keys()) == 1


@pytest.mark.parametrize("beside_a_sound_draft", [False, True])
def test_tokenizer_mismatch_stops_the_run_before_any_compile(
        flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        beside_a_sound_draft: bool) -> None:
    """Also when the draft is one of several: the run stops naming it, and the sound draft is not built
    either (a comparison that quietly left a draft out would rank what the user did not ask for)."""
    from fusedspec.core.errors import TokenizerMismatchError

    draft = tmp_path / "draft-other-tokenizer"
    shutil.copytree(flow_env.draft, draft)
    settings = json.loads((draft / "tokenizer_config.json").read_text())
    settings["eos_token"] = "<|endoftext|>"  # the draft would stop where the target goes on
    (draft / "tokenizer_config.json").write_text(json.dumps(settings))
    drafts = [str(flow_env.draft), str(draft)] if beside_a_sound_draft else str(draft)
    named = f"draft {draft} differ" if beside_a_sound_draft else "draft differ"
    with pytest.raises(TokenizerMismatchError, match=f"(?s){named}.*eos"):
        flow_env.run_inprocess(flow_env.config(draft=drafts), monkeypatch)
    assert not (flow_env.work_dir / "builds").exists() or not any((flow_env.work_dir / "builds").iterdir())
    assert flow_env.published_keys() == set()


def test_a_run_of_two_drafts_builds_both_and_ranks_every_draft_and_k(
        warm_flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch, tiny_drafts: dict[str, Path]) -> None:
    """Issue 23 must-show 1: the perturbed copy (the target's size) and a draft cut to one layer, one run.
    Both are gated, both get every build of the matrix under their own keys and store paths, the summary
    ranks every built (draft, k) per class and says why the winner wins, and the Prefect table and plot show
    both drafts. Each draft has its own given cost ratio, and it decides: the cut draft agrees a little and
    is served at its c, where at the perturbed draft's c no (draft, k) would pay off."""
    import base64
    import urllib.request

    from fusedspec.compile.documents.validation import AdviceRecord
    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.artifacts import artifact_key
    from fusedspec.flows.planning import plan_drafts
    from fusedspec.validate.advice import CostModel, rescore

    flow_env = warm_flow_env
    drafts = [str(flow_env.draft), str(tiny_drafts["cut"])]
    own_c = {drafts[0]: 0.1, drafts[1]: 0.01}
    config = flow_env.config(draft=drafts, fan_out={"max_workers": 2},
                             validation={"cost_ratio": list(own_c.values())})
    flow_env.use_env(monkeypatch)
    plans = plan_drafts(run_config_from_dict(config), load_settings())
    summary = flow_env.run_inprocess(config, monkeypatch)

    assert summary["drafts"] == drafts and summary["counts"]["failed"] == 0, summary["text"]
    built = {(o["draft"], o["spec"]["speculation_length"]): o for o in summary["outcomes"]}
    assert set(built) == {(d, k) for d in drafts for k in (3, 4)}
    assert flow_env.published_keys() == {planned.key for _, planned in plans.builds} == \
        {o["key"] for o in built.values()}
    paths = {plan.config.draft: plan.config_path(plan.builds[0]).rsplit("/", 1)[0] for plan in plans.plans}
    assert len(set(paths.values())) == 2  # {target}/{draft}: each draft's versions apart
    assert all(paths[d] in o["version_uri"] for (d, _), o in built.items())

    for r in summary["recommendations"]:  # the best built (draft, k) of the class, by each build's own advice
        predicted = {pair: next(row["speedup"] for c in o["advice"]["classes"] if c["class"] == r["cls"]
                                for row in c["by_k"] if row["k"] == pair[1]) for pair, o in built.items()}
        slower = {(d, k) for d, by_k in r["measured_slower"].items() for k in by_k}
        best = max((sp, -k, -drafts.index(d)) for (d, k), sp in predicted.items() if (d, k) not in slower)
        assert r["predicted_speedup"] == best[0], (r, predicted)
        if r["k"] is not None:
            assert (drafts.index(r["draft"]), r["k"]) == (-best[2], -best[1])
            other = drafts[1 - drafts.index(r["draft"])].rsplit("/", 1)[-1]
            assert len(r["why"]) == 1 and r["why"][0].startswith(f"{drafts[1 - drafts.index(r['draft'])]}: ")
            assert f"    {r['why'][0]}" in summary["text"] and other in r["why"][0]
    assert "draft and k advice among the built (draft, k)" in summary["text"], summary["text"]

    # each build predicted under its own draft's c, and that c decides: one c for both picks otherwise
    assert {d: {o["advice"]["cost_model"]["cost_ratio"] for (dd, _), o in built.items() if dd == d}
            for d in drafts} == {d: {c} for d, c in own_c.items()}

    def picks(c_of: dict[str, float]) -> dict[str, tuple[str, int] | None]:
        found: dict[str, tuple[str, int] | None] = {}
        for cls in [r["cls"] for r in summary["recommendations"]]:
            scored = [(next(row.speedup for c in rescore(AdviceRecord.model_validate(o["advice"]),
                                                         CostModel(c_of[d], source="given")).classes
                            if c.cls == cls for row in c.by_k if row.k == k), -k, -drafts.index(d), d, k)
                      for (d, k), o in built.items()]
            best = max(scored)
            found[cls] = (best[3], best[4]) if best[0] > 1.0 else None
        return found

    ran = {r["cls"]: (r["draft"], r["k"]) if r["k"] is not None else None for r in summary["recommendations"]}
    assert picks(own_c) == ran and any(pick is not None for pick in ran.values()), summary["text"]
    assert picks({d: own_c[drafts[0]] for d in drafts}) != ran  # at one c for both, the picks differ

    def latest(what: str) -> object:
        with urllib.request.urlopen(f"{flow_env.api_url}/artifacts/{artifact_key(plans, what)}/latest",
                                    timeout=30) as response:
            data = json.loads(response.read())["data"]
        return json.loads(data) if isinstance(data, str) and data.startswith("[") else data

    short = [d.rsplit("/", 1)[-1] for d in drafts]
    rows = latest("builds")
    assert sorted((row["draft"], row["config"]) for row in rows) == sorted(  # type: ignore[union-attr]
        (d.rsplit("/", 1)[-1], o["slug"]) for (d, _), o in built.items())
    markdown = latest("summary")
    assert isinstance(markdown, str) and f"+ {short[0]}, {short[1]}" in markdown and \
        "## Draft and k advice" in markdown
    png = base64.b64decode(markdown.split("data:image/png;base64,", 1)[1].split(")", 1)[0])
    assert png.startswith(b"\x89PNG")


def test_a_run_limited_to_the_advices_top_per_class_compiles_only_those_and_says_what_it_left_out(
        warm_flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch, tiny_drafts: dict[str, Path],
        tmp_path: Path) -> None:
    """matrix.top_per_class 1 over 2 drafts x k 3, 4: the k advice runs on the models after the tokenizer
    gate, before any compile; only the first (draft, k) of each class is built (one build, since every class
    keeps the same), and the summary and the Prefect table name the three left out and why. `fusedspec plan`
    says that the advice runs first, and after the run (the advice cached) which builds it leaves out."""
    import urllib.request

    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.artifacts import artifact_key
    from fusedspec.flows.commands.plan import plan as plan_command
    from fusedspec.flows.planning import plan_drafts

    flow_env = warm_flow_env
    drafts = [str(flow_env.draft), str(tiny_drafts["cut"])]
    config = flow_env.config(draft=drafts, validation={"cost_ratio": [0.1, 0.01]},
                             matrix={"speculation_length": [3, 4], "top_per_class": 1})
    path = tmp_path / "limited.yaml"
    path.write_text(json.dumps(config))
    flow_env.use_env(monkeypatch)
    before = plan_command(path, load_settings())  # the advice has not run in this work dir yet
    assert before["top_per_class"] is None and "left out" not in {b["action"] for b in before["builds"]}
    assert any("first downloads the weights of all 3 models" in note for note in before["notes"]), \
        before["notes"]
    plans = plan_drafts(run_config_from_dict(config), load_settings())

    summary = flow_env.run_inprocess(config, monkeypatch)
    limit = summary["limit"]
    assert summary["counts"]["failed"] == 0 and limit["top_per_class"] == 1, summary["text"]
    firsts = {(p["draft"], p["k"]) for p in limit["picks"] if p["place"] == 1}
    built = {(o["draft"], o["spec"]["speculation_length"]) for o in summary["outcomes"]}
    assert built == firsts and len(built) == 1 == summary["counts"]["configs"]  # one pair, built once
    assert flow_env.published_keys() == {b.key for plan, b in plans.builds
                                         if (plan.config.drafts[0], b.spec.k) in firsts}
    left = {(o["draft"], o["slug"]) for o in limit["left_out"]}
    assert len(left) == 3 and all(o["reason"].startswith("not among the first 1 of any class: at best ")
                                  for o in limit["left_out"])
    for o in limit["left_out"]:
        assert f"{o['draft'].rsplit('/', 1)[-1]} {o['slug']}" in summary["text"] and \
            o["reason"] in summary["text"]
    assert "3 left out before compiling by the k advice (matrix.top_per_class 1)" in summary["text"]
    assert "ranked among the built only" in summary["text"], summary["text"]

    with urllib.request.urlopen(f"{flow_env.api_url}/artifacts/{artifact_key(plans, 'builds')}/latest",
                                timeout=30) as response:
        rows = json.loads(json.loads(response.read())["data"])
    assert sorted(row["config"] for row in rows if row["status"] == "left out") == sorted(s for _, s in left)

    after = plan_command(path, load_settings())  # the advice is cached now: the plan says what it leaves out
    assert {(b["draft"], b["slug"]) for b in after["builds"] if b["action"] == "left out"} == left


@pytest.mark.parametrize("mistake, field", [
    ({"colour": "red"}, "colour"),
    ({"matrix": {"tp_degree": []}}, "matrix.tp_degree"),
    ({"matrix": {"seq_len": ["long"]}}, "matrix.seq_len"),
])
def test_bad_parameters_are_rejected_before_any_work(flow_env: FlowEnv, monkeypatch: pytest.MonkeyPatch,
                                                     mistake: dict, field: str) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from fusedspec.flows.compile_fused import compile_fused

    config = flow_env.config(**mistake)
    with temporary_settings(updates={PREFECT_API_URL: flow_env.api_url}):
        state = compile_fused(config=config, return_state=True)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert field.split(".")[-1] in message, message
    assert not (flow_env.work_dir / "models").exists() and not (flow_env.work_dir / "builds").exists()


def test_two_runs_started_together_compile_each_config_once(flow_env: FlowEnv, tmp_path: Path) -> None:
    import yaml

    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(flow_env.config()))
    procs = []
    for name in ("a", "b"):  # two "machines": separate work dirs, one store, one Prefect server
        work = tmp_path / f"machine-{name}"
        env = {**flow_env.env, "FUSEDSPEC_WORK_DIR": str(work)}
        procs.append(subprocess.Popen([str(Path(sys.executable).with_name("fusedspec")), "run",
                                       str(config_file), "--json"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(0.2)
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    compiled = sum(r["counts"]["compiled"] for r in results)
    published = sum(r["counts"]["published"] for r in results)
    assert compiled == 2 and published == 2, [r["counts"] for r in results]
    assert {o["key"] for r in results for o in r["outcomes"]} == flow_env.published_keys()


def test_a_build_is_retried_when_the_hub_did_not_answer_and_not_for_anything_else(
        flow_env: FlowEnv, hub, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001 - LocalHub
    """A real 503 from the Hub (the local endpoint answers the next GET of the target's weights so): the
    build task fails with HubUnavailable, Prefect's retry condition says try again, and the second try
    publishes. A 403 is the user's to fix: the build fails at once, without a second try."""
    for name, source in (("retry/target", flow_env.target), ("retry/draft", flow_env.draft),
                         ("retry/denied", flow_env.target)):
        hub.add_repo(name, source)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    flow_env.env["HF_ENDPOINT"] = hub.url
    hub.fail_with("retry/target", "model.safetensors", status=503)
    config = flow_env.config(target="hf://retry/target", draft="hf://retry/draft",
                             matrix={"speculation_length": [3]})
    summary = flow_env.run_inprocess(config, monkeypatch)
    assert summary["counts"]["published"] == 1, summary["text"]
    builds = _build_task_runs(flow_env, summary)
    assert [r["run_count"] for r in builds] == [2], builds  # one failed try, then the one that published

    hub.fail_with("retry/denied", "model.safetensors", status=403, times=5)
    refused = flow_env.run_inprocess(flow_env.config(target="hf://retry/denied", draft="hf://retry/draft",
                                                     matrix={"speculation_length": [3]}), monkeypatch)
    [outcome] = refused["outcomes"]
    assert (outcome["status"], outcome["failed_stage"]) == ("failed", "download"), refused["text"]
    assert "HTTP 403" in outcome["reason"] and "HF_TOKEN" in outcome["reason"]
    assert [r["run_count"] for r in _build_task_runs(flow_env, refused)] == [1]  # not tried again


def _build_task_runs(flow_env: FlowEnv, summary: dict) -> list[dict]:
    """The build task runs of the flow runs that built `summary`'s outcomes (found by their names)."""
    slugs = {f"build {o['slug']}" for o in summary["outcomes"]}
    runs = flow_env.server.post("/task_runs/filter", {"task_runs": {"name": {"any_": sorted(slugs)}},
                                                       "sort": "EXPECTED_START_TIME_DESC",
                                                      "limit": len(slugs)})
    return runs  # type: ignore[no-any-return]
