"""build_artifact and `fusedspec compile` with the cpu backend: artifacts are complete and reused by key,
every bad input is a named error with nothing left in the builds dir, an interrupted build leaves nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fusedspec.compile.build import build_artifact
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import CheckpointError, ConfigError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from tests.fixtures.cpu_artifacts import local_model

SHARED = {"tp": 2, "k": 2, "batch": 1, "draft": "cut"}  # also built by test_cpu_equivalence / test_cpu_runner


def _nothing_built(settings: Settings) -> bool:
    return not settings.builds_dir.exists() or not any(settings.builds_dir.iterdir())


def test_an_artifact_has_the_contract_layout(build_tiny: Callable[..., Path]) -> None:
    artifact = build_tiny(**SHARED)
    names = sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*") if p.is_file())
    assert names == ["build.json", "programs/context_encoding.pt2", "programs/fused_step.pt2",
                     "tokenizer.json", "tokenizer_config.json",
                     "weights/tp0_sharded_checkpoint.safetensors",
                     "weights/tp1_sharded_checkpoint.safetensors"]
    description = json.loads((artifact / "build.json").read_text())
    assert description["key"] == artifact.name and description["backend"] == "cpu"
    assert description["cpu"]["models"]["target"]["sharding"]["kv_strategy"] == "split"
    programs = sum((artifact / "programs" / n).stat().st_size
                   for n in ("context_encoding.pt2", "fused_step.pt2"))
    weights = sum(p.stat().st_size for p in (artifact / "weights").iterdir())
    assert programs < weights / 20  # the programs carry no weights: the shards are the only copy


def test_a_finished_build_is_reused_by_key(build_tiny: Callable[..., Path], tiny_target: Path,
                                           tiny_drafts: dict[str, Path], cpu_settings: Settings) -> None:
    artifact = build_tiny(**SHARED)
    stamp = (artifact / "build.json").stat().st_mtime_ns
    again = build_artifact(BuildSpec(2, 128, 2, 1, "float32"), local_model(tiny_target, cpu_settings),
                           local_model(tiny_drafts["cut"], cpu_settings), cpu_settings,
                           options={"aot_inductor": False}).path
    assert again == artifact and (artifact / "build.json").stat().st_mtime_ns == stamp
    # No staging dir of this key is left. The session's builds dir is shared by the xdist workers, so
    # another key's staging dir may be a build in progress on the other worker.
    assert not list(cpu_settings.builds_dir.glob(f".{artifact.name}.*"))


def test_work_dirs_sharing_a_program_cache_compile_a_graph_once(tiny_target: Path,
                                                                tiny_drafts: dict[str, Path],
                                                                tmp_path: Path) -> None:
    from fusedspec.core.settings import load_settings

    shared = tmp_path / "programs"
    hosts = [load_settings({"FUSEDSPEC_WORK_DIR": str(tmp_path / name),
                            "FUSEDSPEC_PROGRAMS_DIR": str(shared)})
             for name in ("ci-job-1", "ci-job-2")]
    built = [build_artifact(BuildSpec(1, 64, 2, 1, "float32"), local_model(tiny_target, s),
                            local_model(tiny_drafts["cut"], s), s, options={"aot_inductor": False})
             for s in hosts]
    assert [b.work for b in built] == ["compile", "programs"]
    assert all(not (s.work_dir / "programs").exists() for s in hosts), \
        "the programs live in the shared cache only"
    assert (shared.stat().st_mode & 0o777) == 0o700, "made for this user alone: it holds code the loader runs"
    entry = shared / built[0].description.graph_key
    for rel in built[1].description.programs:  # linked, not copied: one inode in the cache and both builds
        assert {(b.path / rel).stat().st_ino for b in built} == {(entry / rel).stat().st_ino}


def test_a_shared_program_cache_is_made_for_this_user_alone_and_trusts_no_link_inside(tmp_path: Path) -> None:
    import os

    from fusedspec.compile import program_cache
    from fusedspec.compile.documents.programs import PROGRAM_SET, ProgramSet

    settings = Settings(work_dir=tmp_path / "work", shared_programs_dir=tmp_path / "team" / "ci" / "programs")
    old = os.umask(0o002)  # a shared-group umask would make every level group-writable, and so refused
    try:
        made = program_cache.root(settings, create=True)
    finally:
        os.umask(old)
    assert [(tmp_path / rel).stat().st_mode & 0o777
            for rel in ("team", "team/ci", "team/ci/programs")] == [0o700] * 3
    key = "ab" * 32
    outside = tmp_path / "elsewhere"  # a directory of the entry that is a link leads out of the cache
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "fused_step.pt2").write_bytes(b"program")
    (made / key).mkdir()
    (made / key / "programs").symlink_to(outside / "x")
    ProgramSet(graph_key=key, backend="cpu", files={"programs/fused_step.pt2": 7}, source="compiled").write(
        made / key / PROGRAM_SET)
    assert program_cache.find(settings, key) is None
    (made / key / "programs").unlink()
    (made / key / "programs").mkdir()
    (made / key / "programs" / "fused_step.pt2").write_bytes(b"program")
    assert program_cache.find(settings, key) is not None

    (made / ".locks").write_text("")  # where the graph locks live, made a file: named, not an internal error
    with pytest.raises(ConfigError, match=r"\.locks is not a directory"):
        program_cache.lock_path(settings, key)


def _broken_copy(src: Path, dst: Path, **config_changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes, message", [
    ({"intermediate_size": 256}, r"model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' has shape "
                                 r"\[64, 192\] but .*config.json implies \[64, 256\]"),
    ({"num_hidden_layers": 3}, r"tensor\(s\) model.layers.2.input_layernorm.weight, .* required by "
                               r"config.json \(model_type=qwen3, 3 layers"),
    ({"num_hidden_layers": 1}, r"tensor 'model.layers.1.[a-z_.]+' belongs to layer 1 but config.json says "
                               r"num_hidden_layers=1"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     r"rope type 'yarn' is not supported"),
])
def test_a_checkpoint_that_does_not_match_its_config_is_refused(
        changes: dict[str, object], message: str, tiny_target: Path, tiny_drafts: dict[str, Path],
        tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    target = _broken_copy(tiny_target, tmp_path / "target", **changes)
    with pytest.raises(CheckpointError, match=message):
        build_artifact(BuildSpec(1, 64, 3, 1, "float32"), local_model(target, settings),
                       local_model(tiny_drafts["cut"], settings), settings)
    assert _nothing_built(settings)


def test_a_target_without_tokenizer_files_is_refused(tiny_target: Path, tiny_drafts: dict[str, Path],
                                                     tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    target = tmp_path / "target"
    shutil.copytree(tiny_target, target, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(CheckpointError,
                       match="no tokenizer files .* an artifact must carry the target's tokenizer"):
        build_artifact(BuildSpec(1, 64, 3, 1, "float32"), local_model(target, settings),
                       local_model(tiny_drafts["cut"], settings), settings)
    assert _nothing_built(settings)


@pytest.mark.parametrize("spec, options, message", [
    (BuildSpec(3, 64, 3, 1, "float32"), None, r"tp_degree=3 does not fit the target's 2 KV heads"),
    (BuildSpec(1, 4096, 3, 1, "float32"), None,
     r"seq_len=4096 exceeds the target's max_position_embeddings=2048"),
    (BuildSpec(1, 64, 3, 1, "float32"), {"fast": True}, r"unknown cpu compile option\(s\) \['fast'\]"),
    (BuildSpec(1, 64, 3, 1, "float32"), {"max_context_length": 65},
     r"max_context_length=65 must be an integer in 1..seq_len=64"),
    (BuildSpec(1, 64, 3, 1, "float32"), {"target_alone": "yes"}, r"target_alone='yes' must be true or false"),
])
def test_a_spec_the_models_cannot_take_is_refused(spec: BuildSpec, options: dict[str, object] | None,
                                                  message: str, tiny_target: Path,
                                                  tiny_drafts: dict[str, Path], tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    with pytest.raises(ConfigError, match=message):
        build_artifact(spec, local_model(tiny_target, settings), local_model(tiny_drafts["cut"], settings),
                       settings, options=options)
    assert _nothing_built(settings)


def test_k_not_below_seq_len_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="speculation_length k=8 must be smaller than seq_len=8"):
        BuildSpec(1, 8, 8, 1, "float32")


def test_an_interrupted_build_leaves_nothing(tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import fusedspec.compile.cpu.backend as cpu_backend

    # A Ctrl-C in the middle of writing programs cannot be caused on demand: simulate it at that point.
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cpu_backend, "save_program", interrupted)
    settings = Settings(work_dir=tmp_path / "work")
    with pytest.raises(KeyboardInterrupt):
        build_artifact(BuildSpec(1, 32, 2, 1, "float32"), local_model(tiny_target, settings),
                       local_model(tiny_drafts["cut"], settings), settings)
    assert _nothing_built(settings)


def _write_config(path: Path, target: Path, draft: Path, **matrix: list[object]) -> Path:
    config = {"target": str(target), "draft": str(draft), "backend": "cpu",
              "matrix": {"tp_degree": [2], "seq_len": [128], "speculation_length": [2], "batch_size": [1],
                         "dtype": ["float32"], **matrix},
              "compile": {"aot_inductor": False}}  # exported programs: AOTInductor compiles are slow
    path.write_text(yaml.safe_dump(config))
    return path


def test_compile_command_builds_reuses_and_dry_runs(
        build_tiny: Callable[..., Path], cpu_settings: Settings, tiny_target: Path,
        tiny_drafts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    shared = build_tiny(**SHARED)
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(cpu_settings.work_dir))
    config = _write_config(tmp_path / "run.yaml", tiny_target, tiny_drafts["cut"], speculation_length=[2, 3])

    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["builds"]
    assert [(b["slug"], b["exists"], b["action"]) for b in planned] == [
        ("tp2-seq128-k2-bs1-float32", True, "publish build"), ("tp2-seq128-k3-bs1-float32", False, "compile")]
    assert planned[0]["key"] == shared.name  # the CLI's key is the library's key
    assert planned[1]["sharding"]["target"]["heads_per_rank"] == 2
    assert planned[1]["shapes"]["ctx_batch_size"] == 1  # each request prefilled into its own cache line
    assert planned[1]["weights_bytes"] > 0 and not (cpu_settings.builds_dir / planned[1]["key"]).exists()

    assert main(["compile", str(config), "--key", shared.name[:12], "--json"]) == 0
    built = json.loads(capsys.readouterr().out)["builds"]
    assert built == [{"slug": "tp2-seq128-k2-bs1-float32", "label": "tp2-seq128-k2-bs1-float32",
                      "draft": str(tiny_drafts["cut"]), "key": shared.name,
                      "graph_key": planned[0]["graph_key"], "artifact": str(shared), "work": "built",
                      "reused": True, "seconds": built[0]["seconds"]}]

    assert main(["compile", str(config)]) == 0  # builds the k=3 config, reuses k=2
    lines = capsys.readouterr().out.splitlines()
    assert f"tp2-seq128-k2-bs1-float32  reused: {shared}" in lines
    fresh = cpu_settings.builds_dir / planned[1]["key"]
    assert any(line.startswith("tp2-seq128-k3-bs1-float32  compiled in ") and line.endswith(str(fresh))
               for line in lines)
    description = json.loads((fresh / "build.json").read_text())
    assert description["spec"]["speculation_length"] == 3 and description["options"] == {
        "aot_inductor": False, "target_alone": False}


@pytest.mark.parametrize("matrix, words", [
    ({"tp_degree": [3]}, "tp_degree=3 does not fit the target's 2 KV heads"),
    ({"seq_len": [4], "speculation_length": [4]}, "speculation_length k=4 must be smaller than seq_len=4"),
])
def test_compile_command_refuses_bad_matrices_with_exit_2(
        matrix: dict[str, list[object]], words: str, tiny_target: Path, tiny_drafts: dict[str, Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    config = _write_config(tmp_path / "run.yaml", tiny_target, tiny_drafts["cut"], **matrix)
    assert main(["compile", str(config)]) == 2
    assert words in capsys.readouterr().err
    assert _nothing_built(Settings(work_dir=tmp_path / "work"))


def test_compile_command_refuses_an_unknown_key(build_tiny: Callable[..., Path], cpu_settings: Settings,
                                               tiny_target: Path, tiny_drafts: dict[str, Path],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    config = _write_config(tmp_path / "run.yaml", tiny_target, tiny_drafts["cut"])
    assert main(["compile", str(config), "--key", "ffffffff"]) == 2
    assert "--key ffffffff matches no build of this run config" in capsys.readouterr().err
    assert _nothing_built(Settings(work_dir=tmp_path / "work"))


def test_runtime_mismatches_name_the_tool_that_differs() -> None:
    from fusedspec.compile.backend import get_backend
    from fusedspec.compile.toolchain import cpu_toolchain

    backend = get_backend("cpu")
    here = cpu_toolchain()
    assert backend.runtime_mismatches(here) == []  # type: ignore[attr-defined]
    problems = backend.runtime_mismatches({**here, "torch": "2.0.0"})  # type: ignore[attr-defined]
    assert problems == [f"torch: artifact built with '2.0.0', this host has {here['torch']!r} (exported "
                        "programs are tied to the torch release; rebuild here)"]
