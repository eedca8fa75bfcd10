"""The neuron BACKEND on a host without the Neuron SDK: dry run of the Qwen3-32B + 1.7B build from
config files alone (issue 7, must-show 1; issue 13, must-show 1 through `fusedspec compile --dry-run`), and
compile/load refusing clearly, writing nothing (issue 7, must-show 2)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusedspec.compile.backend import get_backend, read_build_description, write_build_description
from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.modelref import ResolvedModel, parse_model_ref
from fusedspec.compile.neuron.fields import accepted_fields, field_table
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, ConfigError, InputError, VerificationError
from fusedspec.validate.step_costs import BYTES_MODEL_SOURCE
from tests.fixtures.fake_artifacts import make_artifact
from tests.test_neuron_translate import qwen3_config, write_config

KEY = "0" * 64
KEYS = BuildKeys(graph="1" * 64, weights="2" * 64, version=KEY)
SPEC = BuildSpec(tp_degree=32, seq_len=1024, speculation_length=7, batch_size=4, dtype="bfloat16",
                 backend="neuron")


def resolved(directory: Path) -> ResolvedModel:
    return ResolvedModel(ref=parse_model_ref(str(directory)), commit=None, local_dir=directory,
                         file_hashes={"config.json": "sha256:" + "1" * 64})


@pytest.fixture()
def qwen3_pair(tmp_path: Path, qwen3_tokenizer: Path) -> tuple[ResolvedModel, ResolvedModel]:
    """Config-only checkpoint dirs of Qwen3-32B (with the real Qwen3 tokenizer) and Qwen3-1.7B."""
    target = write_config(tmp_path / "Qwen3-32B", qwen3_config("Qwen3-32B"))
    draft = write_config(tmp_path / "Qwen3-1.7B", qwen3_config("Qwen3-1.7B", spelling="5.x"))
    for model in (target, draft):  # both: plan's tokenizer gate reads them before anything else
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(qwen3_tokenizer / name, model / name)
    return resolved(target), resolved(draft)


def test_dry_run_of_the_qwen3_build(qwen3_pair: tuple[ResolvedModel, ResolvedModel], tmp_path: Path) -> None:
    target, draft = qwen3_pair
    out = tmp_path / "builds" / KEY
    backend = get_backend("neuron")
    result = backend.dry_run(SPEC, target, draft, out, keys=KEYS, options={"platform": "trn2"})
    plan = result["plan"]
    assert result["backend"] == "neuron" and result["key"] == KEY and result["sdk_present"] is False
    nc = plan["target"]["neuron_config"]
    assert nc["enable_fused_speculation"] and nc["speculation_length"] == 7
    assert nc["on_device_sampling_config"]["do_sample"] is False and nc["save_sharded_checkpoint"] is True
    assert plan["draft"]["neuron_config"]["enable_fused_speculation"] is False
    assert plan["draft"]["neuron_config"]["speculation_length"] == 0
    assert set(nc) | set(plan["draft"]["neuron_config"]) <= accepted_fields("NeuronConfig")
    assert plan["target"]["model_path"] == str(target.local_dir)
    assert plan["fused_spec_config"]["draft_model_path"] == str(draft.local_dir)
    assert plan["compile"]["compiled_model_path"] == str(out)
    work = Path(plan["env"]["BASE_COMPILE_WORK_DIR"])
    assert work.name == KEYS.graph and work.is_relative_to(backend_work_dir())  # one scratch per graph key
    assert [step["step"] for step in result["steps"]] == ["compile", "copy model files", "write build.json"]
    # NxDI's files, then what the vLLM fork reads by model id: the target's config and tokenizer, the draft's
    # config; build.json last.
    assert result["artifact_files"][-5:] == ["config.json", "tokenizer.json", "tokenizer_config.json",
                                             "draft/config.json", "build.json"]
    assert result["served_files"] == {"target": ["config.json", "tokenizer.json", "tokenizer_config.json"],
                                      "draft": ["draft/config.json"]}
    assert result["toolchain"]["neuronx-distributed-inference"] == "absent"
    assert not out.exists() and not work.exists()  # a dry run writes nothing


def test_dry_run_cli_for_qwen3_32b_tp32_bs4_k7_is_continuous_batching_bucketed_and_nxdi_0_6_to_0_9(
        qwen3_pair: tuple[ResolvedModel, ResolvedModel], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13, must-show 1, through the command a user runs."""
    from fusedspec.flows.cli import main

    config = run_config(qwen3_pair, tmp_path / "run.yaml")
    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    [build] = json.loads(capsys.readouterr().out)["builds"]
    plan = build["plan"]
    nc = plan["target"]["neuron_config"]
    assert nc["is_continuous_batching"] is True and nc["ctx_batch_size"] == 1 and nc["tkg_batch_size"] == 4
    assert nc["enable_bucketing"] is True
    assert nc["context_encoding_buckets"] == nc["token_generation_buckets"] == [128, 256, 512, 1024]
    assert (nc["tp_degree"], nc["batch_size"], nc["speculation_length"]) == (32, 4, 7)
    # Every emitted name is accepted by each supported NxDI, checked here against each version's own list.
    assert plan["nxdi_versions"] == {"0.6.0": "2.26", "0.7.0": "2.27", "0.8.0": "2.28", "0.9.0": "2.29"}
    for version, info in field_table()["versions"].items():
        for role in ("target", "draft"):
            assert set(plan[role]["neuron_config"]) <= set(info["NeuronConfig"]), (version, role)
        assert set(nc["on_device_sampling_config"]) <= set(info["OnDeviceSamplingConfig"]), version
    assert all(not names for per_class in plan["unknown_fields_per_nxdi_version"].values()
               for names in per_class.values())
    # The dry run says what static greedy sampling means for requests.
    assert any("temperature, top_k and top_p are ignored" in note for note in build["notes"])
    assert plan["serving"]["neuron_devices"] == 8
    # Issue 17: the k advice's cost model it would use, and its source: no device here, so a stated model
    # (bytes read per step), never a CPU timing. The 1.7B draft reads ~10% of what the 32B target reads per
    # rank (weights / 32, and a KV cache of 28 layers against 64 at batch 4).
    cost = build["cost_model"]
    assert cost["source"] == BYTES_MODEL_SOURCE and cost["verify_slope"] == 0
    assert 0.05 < cost["cost_ratio"] < 0.15
    # The plain-text dry run prints one line per build, then the cost model and the steps.
    assert main(["compile", str(config), "--dry-run"]) == 0
    line, cost_line, steps_line = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("tp32-seq1024-k7-bs4-bfloat16") and " compile (graph key " in line and \
        "MiB of weights" in line
    assert cost_line.strip() == (f"k advice cost model: c = {cost['cost_ratio']:.3f}, b = 0: "
                                 f"{BYTES_MODEL_SOURCE}")
    assert steps_line.strip() == "steps: compile, copy model files, write build.json"


def run_config(pair: tuple[ResolvedModel, ResolvedModel], path: Path, neuron: dict[str, Any] | None = None,
               tp: int = 32) -> Path:
    """A run config of the Qwen3-32B + 1.7B build (TP 32, seq_len 1024, k 7, batch 4, bf16) on the config-only
    model dirs, with `neuron` as its neuron section."""
    for model in pair:  # a local model needs a weights file to be pinned; the dry run never reads it
        # (a valid safetensors file holding no tensor: a pin checks each weight file's header)
        (model.local_dir / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    config: dict[str, Any] = {
        "target": str(pair[0].local_dir), "draft": str(pair[1].local_dir), "backend": "neuron",
        "matrix": {"tp_degree": [tp], "seq_len": [1024], "speculation_length": [7], "batch_size": [4],
                   "dtype": ["bfloat16"]}}
    if neuron is not None:
        config["neuron"] = neuron
    path.write_text(yaml.safe_dump(config))
    return path


# Issue 26, must-show 1: each option of the neuron section, through the dry run a user runs.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "trn1, LNC 1": {"platform": "trn1", "logical_nc_config": 1},
    "explicit buckets": {"context_encoding_buckets": [256, 1024], "token_generation_buckets": [512, 1024]},
    "bucketing off": {"enable_bucketing": False},
    "async_mode on": {"async_mode": True},
}
EMITTED = {  # what each variant must put in the target's (and so the draft's) NeuronConfig
    "defaults": {"target": "trn2", "logical_nc_config": 2, "enable_bucketing": True, "async_mode": False,
                 "context_encoding_buckets": [128, 256, 512, 1024],
                 "token_generation_buckets": [128, 256, 512, 1024]},
    "trn1, LNC 1": {"target": "trn1", "logical_nc_config": 1},
    "explicit buckets": {"context_encoding_buckets": [256, 1024], "token_generation_buckets": [512, 1024]},
    "bucketing off": {"enable_bucketing": False},
    "async_mode on": {"async_mode": True},
}


def test_dry_runs_of_each_neuron_option_emit_it_accepted_by_nxdi_0_6_to_0_9_under_keys_of_their_own(
        qwen3_pair: tuple[ResolvedModel, ResolvedModel], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.flows.cli import main

    keys = {}
    for name, neuron in VARIANTS.items():
        config = run_config(qwen3_pair, tmp_path / f"run-{len(keys)}.yaml", neuron)
        assert main(["compile", str(config), "--dry-run", "--json"]) == 0, name
        [build] = json.loads(capsys.readouterr().out)["builds"]
        plan = build["plan"]
        for role in ("target", "draft"):
            nc = plan[role]["neuron_config"]
            for field, value in EMITTED[name].items():
                assert nc[field] == value, (name, role, field)
            if neuron.get("enable_bucketing") is False:
                assert "context_encoding_buckets" not in nc and "token_generation_buckets" not in nc
            for version, info in field_table()["versions"].items():
                assert set(nc) <= set(info["NeuronConfig"]), (name, version)
        assert plan["env"]["NEURON_PLATFORM_TARGET_OVERRIDE"] == plan["target"]["neuron_config"]["target"]
        assert plan["env"]["NEURON_LOGICAL_NC_CONFIG"] == \
            str(plan["target"]["neuron_config"]["logical_nc_config"])
        assert build["options"]["platform"] == plan["platform"]  # the key options, shown as they are keyed
        keys[name] = build["key"]
    assert len(set(keys.values())) == len(VARIANTS), keys
    # trn1 at LNC 1 serves TP 32 on its 16 devices of 2 cores; `null` LNC is the platform's default, one key.
    assert main(["compile", str(run_config(qwen3_pair, tmp_path / "lnc2.yaml", {"logical_nc_config": 2})),
                 "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["builds"][0]["key"] == keys["defaults"]


def test_a_dry_run_on_a_host_with_a_newer_nxdi_warns_instead_of_refusing(
        qwen3_pair: tuple[ResolvedModel, ResolvedModel], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26, must-show 2: NxDI 0.10 installed (as pip lays it out, on sys.path), config.py unreadable."""
    from fusedspec.flows.cli import main
    from tests.test_neuron_fields import NEWER, install_nxdi

    monkeypatch.syspath_prepend(str(install_nxdi(tmp_path / "site", NEWER, "not python (\n")))
    config = run_config(qwen3_pair, tmp_path / "run.yaml")
    assert main(["compile", str(config), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert " compile (graph key " in out
    assert (f"warning: a compile on this host would be refused: neuronx-distributed-inference {NEWER} "
            "is newer") in err
    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    [build] = json.loads(capsys.readouterr().out)["builds"]
    assert build["sdk_present"] is True and build["toolchain"]["neuronx-distributed-inference"] == NEWER
    assert len(build["warnings"]) == 1


def test_a_target_without_tokenizer_is_refused_before_compiling(
        qwen3_pair: tuple[ResolvedModel, ResolvedModel], tmp_path: Path) -> None:
    target, draft = qwen3_pair
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (target.local_dir / name).unlink()
    with pytest.raises(ArtifactError, match="has no tokenizer files .* never asks the Hugging Face Hub"):
        get_backend("neuron").dry_run(SPEC, target, draft, tmp_path / "out", keys=KEYS)
    with pytest.raises(ArtifactError, match="has no tokenizer files .* never asks the Hugging Face Hub"):
        get_backend("neuron").compile(SPEC, target, draft, tmp_path / "out", keys=BuildKeys(KEY, KEY, KEY))
    assert not (tmp_path / "out").exists()


def backend_work_dir() -> Path:
    from fusedspec.core.settings import load_settings

    return load_settings().work_dir


def test_compile_without_sdk_says_so_and_writes_nothing(qwen3_pair: tuple[ResolvedModel, ResolvedModel],
                                                        tmp_path: Path) -> None:
    target, draft = qwen3_pair
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        get_backend("neuron").compile(SPEC, target, draft, out, keys=BuildKeys(KEY, KEY, KEY))
    message = str(info.value)
    assert "needs the AWS Neuron SDK" in message and "--dry-run" in message
    assert not out.exists()
    assert not (backend_work_dir() / "neuron-compile" / KEY).exists()


def test_invalid_build_is_rejected_before_the_sdk_question(qwen3_pair: tuple[ResolvedModel, ResolvedModel],
                                                           tmp_path: Path) -> None:
    target, draft = qwen3_pair
    spec = BuildSpec(tp_degree=32, seq_len=65536, speculation_length=7, batch_size=4, backend="neuron")
    with pytest.raises(ConfigError, match="seq_len=65536 exceeds the target's max_position_embeddings"):
        get_backend("neuron").compile(spec, target, draft, tmp_path / "out", keys=BuildKeys(KEY, KEY, KEY),
                                      options={"platform": "trn1"})
    with pytest.raises(ConfigError, match="seq_len=65536 exceeds the target's max_position_embeddings"):
        get_backend("neuron").dry_run(spec, target, draft, tmp_path / "out", keys=KEYS,
                                      options={"platform": "trn1"})
    assert not (tmp_path / "out").exists()
    problems = get_backend("neuron").check(spec, read(target), read(draft))
    assert len(problems) == 2 and all("seq_len=65536" in p for p in problems)
    # The options' own rules are the run config's and the translation's, not check's (it has no options).
    assert get_backend("neuron").check(SPEC, read(target), read(draft)) == []


def read(model: ResolvedModel):  # noqa: ANN201 - a ModelArch
    from fusedspec.compile.modelconfig import read_arch

    return read_arch(model.local_dir)


def test_load_refuses_without_sdk_or_with_a_foreign_artifact(tmp_path: Path) -> None:
    backend = get_backend("neuron")
    with pytest.raises(VerificationError, match="model.pt is native code .* not a build of this work dir"):
        backend.load(tmp_path)  # outside the work dir's builds, with no signed manifest: refused first
    trusted = LoadTrust(where=str(tmp_path), built_here=True)
    with pytest.raises(ArtifactError, match="not a fusedspec artifact"):
        backend.load(tmp_path, trusted)
    (tmp_path / "build.json").write_text('{"key": "k", "spec": {}, "backend": "neuron"}')
    with pytest.raises(ArtifactError, match="not a complete fusedspec artifact"):
        backend.load(tmp_path, trusted)
    cpu_built = make_artifact(tmp_path / "cpu")
    with pytest.raises(ArtifactError, match="built by the 'cpu' backend"):
        backend.load(cpu_built, LoadTrust(where=str(cpu_built), built_here=True))
    description = read_build_description(cpu_built).model_copy(
        update={"backend": "neuron", "spec": SPEC, "neuron": {}})
    write_build_description(tmp_path, description)
    with pytest.raises(InputError, match="needs the AWS Neuron SDK"):
        backend.load(tmp_path, trusted)


def test_runtime_mismatches_refuse_a_neuron_artifact_on_this_host() -> None:
    recorded = {"neuronx-cc": "2.21.18209.0", "neuronx-distributed-inference": "0.6.10598",
                "torch": "2.8.0", "neuron-runtime": "2.27.23.0", "neuron_cc_flags": ""}
    problems = get_backend("neuron").runtime_mismatches(recorded)
    assert any(p.startswith("neuronx-cc: the artifact was built with 2.21.18209.0, this host has absent")
               for p in problems)
    assert any(p.startswith("neuron-runtime:") for p in problems)


def test_nothing_imports_neuron_packages() -> None:
    # In a fresh interpreter: the backend, a translation and a dry run import no Neuron module.
    code = (
        "import sys, compile.neuron.backend, compile.neuron.translate, compile.neuron.device;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('neuronx_distributed_inference',"
        "'neuronx_distributed','torch_neuronx','libneuronxla','neuronxcc')];print(bad);"
        "sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout + done.stderr


# ---- issue 21, must-show 5: a new revision on Neuron shards its weights, it compiles nothing -------------

CACHE_URL = "s3://neuron-cache/fusedspec"


def _dry_run(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    from fusedspec.flows.cli import main

    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    [build] = json.loads(capsys.readouterr().out)["builds"]
    return build  # type: ignore[no-any-return]


def _new_revision(model: ResolvedModel, revision: str) -> None:
    """New weights for the same config: another safetensors file (no tensor; what a pin hashes differs)."""
    header = json.dumps({"__metadata__": {"revision": revision}}).encode()
    (model.local_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


def test_a_revision_whose_graph_key_has_programs_shards_its_weights_and_compiles_nothing(
        qwen3_pair: tuple[ResolvedModel, ResolvedModel], qwen3_tokenizer: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fusedspec.compile import program_cache
    from fusedspec.core.settings import load_settings
    from fusedspec.flows.cli import main
    from tests.fixtures.fake_artifacts import make_neuron_artifact

    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))  # its own program cache
    monkeypatch.delenv("NEURON_COMPILE_CACHE_URL", raising=False)
    config = run_config(qwen3_pair, tmp_path / "run.yaml", {"compile_cache_url": CACHE_URL})
    first = _dry_run(config, capsys)
    assert first["action"] == "compile"
    assert [step["step"] for step in first["steps"]] == ["compile", "copy model files", "write build.json"]
    scratch = first["plan"]["env"]["BASE_COMPILE_WORK_DIR"]

    # The first revision's compile as build_artifact ends one: its program files (the neuron artifact lists
    # model.pt; hand-made bytes stand in for the NEFFs) go into the work dir's cache under its graph key.
    settings = load_settings()
    compiled = make_neuron_artifact(tmp_path / "first", qwen3_tokenizer)
    programs = read_build_description(compiled).programs
    assert programs == ["model.pt"]
    program_cache.keep(settings, first["graph_key"], "neuron", compiled, programs)

    _new_revision(qwen3_pair[0], "fine-tune 2")  # the target's next revision: new weights, same config
    second = _dry_run(config, capsys)
    assert second["graph_key"] == first["graph_key"] and second["key"] != first["key"]
    assert second["action"] == "reuse programs"
    graph = first["graph_key"][:12]
    assert second["action_detail"] == f"of graph key {graph} in this work dir: shard weights only"
    steps = {step["step"]: step for step in second["steps"]}
    # no compile step
    assert list(steps) == ["link programs", "shard weights", "copy model files", "write build.json"]
    assert steps["link programs"]["files"] == ["model.pt"]
    shard = steps["shard weights"]
    assert shard["calls"][-1].startswith("model.shard_weights(")
    assert not any("model.compile(" in call for call in shard["calls"])
    assert shard["writes"] == ["neuron_config.json", *(f"weights/tp{r}_sharded_checkpoint.safetensors"
                                                       for r in range(32))]
    env = second["plan"]["env"]
    assert env["BASE_COMPILE_WORK_DIR"] == scratch
    assert scratch == str(settings.work_dir / "neuron-compile" / first["graph_key"])
    assert env["NEURON_COMPILE_CACHE_URL"] == CACHE_URL == first["plan"]["env"]["NEURON_COMPILE_CACHE_URL"]
    assert second["plan"]["compile_cache"] == {"url": CACHE_URL,
                                               "from": "the run config's neuron.compile_cache_url"}
    # The plain-text dry run says the same.
    assert main(["compile", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"reuse programs (of graph key {graph} in this work dir: shard weights only)" in out
    assert "steps: link programs, shard weights, copy model files, write build.json" in out

    # Unset in the run config, the process inherits the host's cache, if any; the URL is no part of any key.
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "neuron": {}}))
    uncached = _dry_run(plain, capsys)
    assert (uncached["key"], uncached["graph_key"]) == (second["key"], second["graph_key"])
    assert "NEURON_COMPILE_CACHE_URL" not in uncached["plan"]["env"]
    assert uncached["plan"]["compile_cache"]["from"].startswith("Neuron's own default")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "/fsx/neuron-cache")
    hosted = _dry_run(plain, capsys)
    assert hosted["plan"]["compile_cache"] == {"url": "/fsx/neuron-cache",
                                               "from": "NEURON_COMPILE_CACHE_URL of this host (inherited)"}


def test_a_k_sweep_is_told_it_shares_no_fused_neff(qwen3_pair: tuple[ResolvedModel, ResolvedModel],
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.flows.cli import main

    config = run_config(qwen3_pair, tmp_path / "run.yaml")
    data = yaml.safe_load(config.read_text())
    data["matrix"]["speculation_length"] = [5, 7]
    config.write_text(yaml.safe_dump(data))
    assert main(["compile", str(config), "--dry-run", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    [note] = result["notes"]
    assert note.startswith("builds of different k share no fused NEFF") and "_cte_postprocessor" in note
    assert len({b["graph_key"] for b in result["builds"]}) == 2
    for command in (["compile", str(config), "--dry-run"], ["plan", str(config)]):
        assert main(command) == 0
        assert f"note: {note}" in capsys.readouterr().out
    assert main(["plan", str(run_config(qwen3_pair, tmp_path / "one-k.yaml")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []  # one k: nothing to say
