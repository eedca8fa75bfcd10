"""`fusedspec plan` against models served by the local Hub endpoint (real huggingface_hub client).

Weights never move during a plan: the server counts bytes per file, and the models dir is searched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fusedspec.flows.cli import main

REPO_ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def served(hub, tiny_target: Path,  # noqa: ANN001
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Target, draft and a model of an unsupported type on the local Hub: name -> commit of main."""
    root = tmp_path_factory.mktemp("plan-repos")
    draft = root / "draft"
    shutil.copytree(tiny_target, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    other = root / "other"
    shutil.copytree(draft, other)
    (other / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    v2 = root / "target-v2"
    shutil.copytree(tiny_target, v2)
    (v2 / "generation_config.json").write_text('{"temperature": 0.7}')
    commits = {name: hub.add_repo(f"plan/{name}", path)
               for name, path in (("target", tiny_target), ("draft", draft), ("other", other))}
    commits["target@v2"] = hub.add_repo("plan/target", v2, branch="v2")
    return commits


def write_config(path: Path, **changes: object) -> Path:
    config: dict[str, object] = {
        "target": "hf://plan/target", "draft": "hf://plan/draft", "backend": "cpu",
        "compile": {"aot_inductor": False},  # exported programs unless a test asks for AOTInductor
        "matrix": {"tp_degree": [1, 2], "seq_len": [256], "speculation_length": [3, 5], "batch_size": [1],
                   "dtype": ["float32"]},
    }
    matrix = changes.pop("matrix", None)
    config.update(changes)
    if matrix:
        config["matrix"] = {**config["matrix"], **matrix}  # type: ignore[dict-item]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def cli_env(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: ANN001
    work = tmp_path / "work"
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return work


def plan_json(capsys: pytest.CaptureFixture[str], config: Path) -> dict:
    code = main(["plan", str(config), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def weight_files(work: Path) -> list[Path]:
    return list((work / "models").rglob("*.safetensors")) if (work / "models").exists() else []


def test_a_good_config_prints_every_build_with_its_key(hub, served, cli_env: Path,  # noqa: ANN001
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "run.yaml")
    hub.reset_counters()
    code = main(["plan", str(config)])
    out, _ = capsys.readouterr()
    assert code == 0
    doc = plan_json(capsys, config)
    assert [b["slug"] for b in doc["builds"]] == [
        "tp1-seq256-k3-bs1-float32", "tp1-seq256-k5-bs1-float32",
        "tp2-seq256-k3-bs1-float32", "tp2-seq256-k5-bs1-float32"]
    keys = [b["key"] for b in doc["builds"]]
    assert len(set(keys)) == 4 and all(key in out for key in keys)
    assert f"commit {served['target']}" in out and f"commit {served['draft']}" in out
    assert doc["target"]["commit"] == served["target"] and doc["drafts"][0]["commit"] == served["draft"]
    assert "model.safetensors" in doc["target"]["files"]  # its sha256 from the Hub, not from a download
    assert doc["toolchain"]["torch"] and doc["code_version"]
    # No weight moved: counted at the server, and nothing of the kind on disk.
    assert not any(path.endswith(".safetensors") for repo in ("plan/target", "plan/draft")
                   for path in hub.files_served(repo))
    assert weight_files(cli_env) == []


def test_keys_are_equal_across_processes_and_change_with_any_input(
        hub, served, cli_env: Path,  # noqa: ANN001
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "run.yaml")
    keys = {b["slug"]: b["key"] for b in plan_json(capsys, config)["builds"]}

    # Another process, another work dir, the installed console script: the same keys.
    env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "other-work"), "HF_ENDPOINT": hub.url}
    done = subprocess.run([str(Path(sys.executable).parent / "fusedspec"), "plan", str(config), "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {b["slug"]: b["key"] for b in json.loads(done.stdout)["builds"]} == keys

    # The same commit written as a sha instead of a branch: same content, same keys.
    pinned = write_config(tmp_path / "pinned.yaml", target=f"hf://plan/target@{served['target']}")
    assert {b["slug"]: b["key"] for b in plan_json(capsys, pinned)["builds"]} == keys

    # Another target commit (a changed generation_config.json): every key changes.
    v2 = write_config(tmp_path / "v2.yaml", target="hf://plan/target@v2")
    v2_doc = plan_json(capsys, v2)
    assert v2_doc["target"]["commit"] == served["target@v2"]
    assert set(b["key"] for b in v2_doc["builds"]).isdisjoint(keys.values())

    # Another compile option changes every key; a spec change only its own build's key.
    aoti = write_config(tmp_path / "aoti.yaml", compile={"aot_inductor": True})
    aoti_keys = {b["slug"]: b["key"] for b in plan_json(capsys, aoti)["builds"]}
    assert set(aoti_keys.values()).isdisjoint(keys.values())
    # AOTInductor is the cpu default: a config that does not say plans the same builds
    default = write_config(tmp_path / "default.yaml", compile={})
    assert {b["slug"]: b["key"] for b in plan_json(capsys, default)["builds"]} == aoti_keys
    k4 = write_config(tmp_path / "k4.yaml", matrix={"speculation_length": [3, 4]})
    k4_keys = {b["slug"]: b["key"] for b in plan_json(capsys, k4)["builds"]}
    assert k4_keys["tp1-seq256-k3-bs1-float32"] == keys["tp1-seq256-k3-bs1-float32"]
    assert k4_keys["tp1-seq256-k4-bs1-float32"] not in keys.values()

    # Publishing somewhere else or validating differently does not change what gets compiled.
    other = write_config(tmp_path / "other.yaml", publish={"uri": str(tmp_path / "elsewhere")},
                         validation={"max_new_tokens": 7})
    assert {b["slug"]: b["key"] for b in plan_json(capsys, other)["builds"]} == keys


def test_a_config_with_many_mistakes_reports_all_at_once(hub, served, cli_env: Path,  # noqa: ANN001
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "bad.yaml", draft="hf://plan/other",
                          matrix={"tp_degree": [3], "seq_len": [8, 4096], "speculation_length": [1, 9],
                                  "batch_size": [0]})
    hub.reset_counters()
    code = main(["plan", str(config)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    for words in ("the draft's model_type 'mistral' is not supported by the cpu backend",
                  "matrix.speculation_length[0]: 1 is less than the minimum of 2 (k=1",
                  "matrix.batch_size[0]: 0 is less than the minimum of 1",
                  "tp_degree=3 does not fit the target's 2 KV heads",  # the models' problems at once too
                  "seq_len=4096 exceeds the target's max_position_embeddings=2048"):
        assert words in err, err
    assert f"problem(s) in {config}" in err.splitlines()[0]

    # With the values in bounds, the problems that need both models come out, again all at once.
    config = write_config(tmp_path / "bad.yaml", draft="hf://plan/other",
                          matrix={"tp_degree": [3], "seq_len": [8, 4096], "speculation_length": [9]})
    assert main(["plan", str(config)]) == 2
    err = capsys.readouterr().err
    for words in ("the draft's model_type 'mistral' is not supported by the cpu backend",
                  "tp_degree=3 does not fit the target's 2 KV heads",
                  "tp_degree=3 does not fit the draft's 2 KV heads",
                  "seq_len=4096 exceeds the target's max_position_embeddings=2048",
                  "speculation_length k=9 must be smaller than seq_len=8"):
        assert words in err, err
    assert hub.bytes_served() > 0  # configs were read ...
    assert not any(p.endswith(".safetensors")
                   for p in hub.files_served("plan/target") | hub.files_served("plan/other"))
    assert weight_files(cli_env) == []  # ... and no weight file was downloaded


def test_bad_references_are_reported_with_the_matrix_problems(hub, served, cli_env: Path,  # noqa: ANN001
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "bad.yaml", target="hf://plan/missing", draft="hf://plan/draft@nope",
                          matrix={"batch_size": [0]})
    code = main(["plan", str(config), "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    assert json.loads(out)["ok"] is False  # --json: one document, even for an error
    for words in ("target: hf://plan/missing: no repository plan/missing",
                  "draft: hf://plan/draft@nope: revision 'nope' does not exist",
                 "matrix.batch_size[0]: 0 is less"):
        assert words in err
    assert not (cli_env / "models").exists() or list((cli_env / "models").rglob("*")) == []


def test_a_malformed_config_is_one_line(cli_env: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "typo.yaml", colour="red")
    code = main(["plan", str(config)])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "colour" in err
    assert not cli_env.exists() or weight_files(cli_env) == []
