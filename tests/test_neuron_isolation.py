"""Each Neuron compile, load and reference build runs in a process of its own (issue 13, must-show 2).

Two parts:
  - compile.neuron.isolation with real child processes: a class attribute changed in one call is not seen by
    the next, each call has its own environment, errors come back with their type, message and exit code,
    and a child killed by SIGKILL is a clear CompileError, never a hang.
  - the neuron backend through that isolation, driven by `fusedspec compile` in one local run.

FAKE NxDI, TEST-ONLY: the Neuron SDK cannot be installed on this machine (no Trainium, and the PyPI
packages of those names are placeholders). The backend tests therefore write a small stand-in package named
`neuronx_distributed_inference` into a temporary directory and put it on the path of this test only. It has
the classes and calls compile/neuron/device.py uses, and it reproduces the one NxDI 0.6 behaviour under test:
`NeuronBaseForCausalLM.__init__` sets `self.__class__._model_cls = NeuronFusedSpecModel` for fused
speculation (models/model_base.py, tag v0.6.10598), changing the class for the rest of the process. Its
compile() writes NxDI's file names with placeholder bytes the way NxDI's does (config.save, model.pt, then
shard_weights, whose shards are made from the checkpoints' bytes) and records each call in its scratch
directory. It proves the process isolation and which NxDI calls a build makes; it says nothing about NxDI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.neuron.isolation import IsolatedSession, run_isolated
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import CompileError, ConfigError, InputError, MatrixError
from fusedspec.core.settings import load_settings

# ---- the isolation itself, with real processes ------------------------------------------------------------

class Stateful:
    """Stands for an NxDI class whose attribute a build changes (NxDI 0.6's `_model_cls`)."""

    model_cls = "pristine"


def mutate_class_and_report() -> str:
    seen = Stateful.model_cls
    Stateful.model_cls = "mutated"
    return seen


def mutate_twice_in_one_process() -> list[str]:
    return [mutate_class_and_report(), mutate_class_and_report()]


def read_env(name: str) -> tuple[str | None, int]:
    return os.environ.get(name), os.getpid()


def raise_config_error() -> None:
    raise ConfigError("tp_degree=3 does not fit")


def raise_matrix_error() -> None:
    raise MatrixError(["first problem", "second problem"])


def raise_value_error() -> None:
    raise ValueError("NxDI refused the config")


def kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_without_answer() -> None:
    os._exit(3)


def unpicklable_result() -> Any:
    return lambda: None


def counter_setup(start: int) -> tuple[dict[str, int], dict[str, int]]:
    return {"count": start}, {"pid": os.getpid()}


def counter_increment(state: dict[str, int]) -> int:
    state["count"] += 1
    return state["count"]


def write_pid_and_sleep(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(300)


def failing_setup() -> tuple[None, None]:
    raise InputError("the model cannot be loaded here")


def test_a_class_attribute_mutated_in_one_isolated_call_is_not_seen_by_the_next() -> None:
    first = run_isolated(mutate_class_and_report, env={}, what="first build")
    second = run_isolated(mutate_class_and_report, env={}, what="second build")
    assert first == second == "pristine"
    # The same two steps in one process: the second sees the first's change. That is what isolation prevents.
    assert run_isolated(mutate_twice_in_one_process, env={}, what="both in one") == ["pristine", "mutated"]
    assert Stateful.model_cls == "pristine"  # and this process was never touched


def test_each_call_has_its_own_environment_even_from_threads() -> None:
    results: dict[str, tuple[str | None, int]] = {}

    def build(name: str) -> None:
        results[name] = run_isolated(read_env, "BASE_COMPILE_WORK_DIR",
                                     env={"BASE_COMPILE_WORK_DIR": f"/scratch/{name}"}, what=name)

    threads = [threading.Thread(target=build, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["a"][0] == "/scratch/a" and results["b"][0] == "/scratch/b"
    assert len({results["a"][1], results["b"][1], os.getpid()}) == 3  # three different processes
    assert "BASE_COMPILE_WORK_DIR" not in os.environ


def test_fusedspec_errors_come_back_with_type_message_and_exit_code() -> None:
    with pytest.raises(ConfigError, match="tp_degree=3 does not fit") as info:
        run_isolated(raise_config_error, env={}, what="a build")
    assert info.value.exit_code == 2
    with pytest.raises(MatrixError) as matrix:
        run_isolated(raise_matrix_error, env={}, what="a build")
    assert matrix.value.problems == ["first problem", "second problem"]


def test_other_errors_become_compile_errors_with_the_child_traceback() -> None:
    with pytest.raises(CompileError) as info:
        run_isolated(raise_value_error, env={}, what="the NxDI compile of x")
    message = str(info.value)
    assert message.startswith("the NxDI compile of x failed: ValueError: NxDI refused the config")
    assert "traceback in that process" in message and "raise_value_error" in message
    assert info.value.exit_code == 1
    with pytest.raises(CompileError, match="failed: .*pickle"):
        run_isolated(unpicklable_result, env={}, what="a build")


def test_a_child_killed_or_exiting_without_answer_is_a_clear_error() -> None:
    with pytest.raises(CompileError, match="its process was killed by SIGKILL .*out-of-memory killer"):
        run_isolated(kill_myself, env={}, what="the NxDI compile of x")
    with pytest.raises(CompileError, match="exited with code 3 without a result"):
        run_isolated(exit_without_answer, env={}, what="a build")


def test_a_session_keeps_its_state_and_ends_its_process() -> None:
    session = IsolatedSession(counter_setup, 10, env={}, what="a model")
    assert session.info["pid"] == session.pid != os.getpid()
    assert [session.call(counter_increment), session.call(counter_increment)] == [11, 12]
    session.close()
    assert session._child.process.poll() is not None
    with pytest.raises(CompileError, match="its process was closed"):
        session.call(counter_increment)
    with pytest.raises(InputError, match="cannot be loaded here"):
        IsolatedSession(failing_setup, env={}, what="a model")
    killed = IsolatedSession(counter_setup, 0, env={}, what="a model")
    os.kill(killed.pid, signal.SIGKILL)
    with pytest.raises(CompileError, match="killed by SIGKILL"):
        killed.call(counter_increment)
    killed.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie has ended; only its parent's reaper is missing


def test_a_step_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A compile whose parent was killed would otherwise run for hours for no one."""
    pid_file = tmp_path / "child.pid"
    code = ("from compile.neuron.isolation import run_isolated; "
            "from tests.test_neuron_isolation import write_pid_and_sleep; "
            f"run_isolated(write_pid_and_sleep, {str(pid_file)!r}, env={{}}, what='orphan')")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the step never started"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20  # the watchdog looks every 5 s
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "the step outlived its killed parent"
    finally:
        parent.kill()


# ---- the neuron backend through the isolation, with the FAKE NxDI above --------------------------------

FAKE_NXDI_VERSION = "0.6.10598+fake"
FAKE_NXDI: dict[str, str] = {
    "__init__.py": '"""FAKE NxDI for fusedspec tests only; see tests/test_neuron_isolation.py."""\n',
    "models/__init__.py": "",
    "models/config.py": '''
        import json


        class NeuronConfig:
            def __init__(self, **kwargs):
                self.__dict__.update(kwargs)


        class InferenceConfig:
            def __init__(self, neuron_config, load_config=None, **overrides):
                self.neuron_config = neuron_config
                if load_config is not None:
                    load_config(self)
                self.__dict__.update(overrides)

            @classmethod
            def get_neuron_config_cls(cls):
                return NeuronConfig

            def save(self, path):
                # NxDI writes the whole config, the checkpoints' paths included
                fused = getattr(self, "fused_spec_config", None)
                with open(f"{path}/neuron_config.json", "w") as out:
                    json.dump({"neuron_config": dict(self.neuron_config.__dict__),
                               "eos_token_id": getattr(self, "eos_token_id", None),
                               "_name_or_path": getattr(self, "_name_or_path", None),
                               "draft_model_path": fused.draft_model_path if fused else None}, out)


        class FusedSpecNeuronConfig:
            def __init__(self, worker_cls, draft_config=None, draft_model_path=None):
                self.worker_cls, self.draft_config, self.draft_model_path = worker_cls, draft_config, '''
                '''draft_model_path
    ''',
    "models/model_base.py": '''
        import hashlib
        import json
        import os
        import signal
        from pathlib import Path


        class NeuronFusedSpecModel:
            pass


        class NeuronBaseForCausalLM:
            _model_cls = None

            def __init__(self, model_path, config=None):
                if config is None:
                    config = self.get_config_cls().load(model_path)
                self.model_path, self.config = model_path, config
                self.model_cls_at_init = type(self)._model_cls.__name__
                if getattr(config.neuron_config, "enable_fused_speculation", False):
                    self.__class__._model_cls = NeuronFusedSpecModel  # what NxDI 0.6 does: the class changes

            def compile(self, path):
                out = Path(path)
                nc = self.config.neuron_config
                _record("compile")
                self.config.save(path)
                (out / "model.pt").write_bytes(b"FAKE NxDI model.pt")
                if os.environ.get("FAKE_NXDI_SIGKILL_DURING_COMPILE") == "1":
                    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would, halfway through
                self.shard_weights(path)
                scratch = Path(os.environ["BASE_COMPILE_WORK_DIR"])
                (scratch / "observed.json").write_text(json.dumps({
                    "pid": os.getpid(), "model_cls_at_init": self.model_cls_at_init,
                    "base_compile_work_dir": os.environ["BASE_COMPILE_WORK_DIR"],
                    "logical_nc_config": os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
                    "speculation_length": nc.speculation_length,
                    "is_continuous_batching": nc.is_continuous_batching,
                }))

            def shard_weights(self, path):
                _record("shard_weights")
                nc = self.config.neuron_config
                sources = [self.config._name_or_path]
                fused = getattr(self.config, "fused_spec_config", None)
                if fused is not None:
                    sources.append(fused.draft_model_path)
                read = hashlib.sha256(b"".join(Path(s, "model.safetensors").read_bytes() for s in sources))
                (Path(path) / "weights").mkdir(exist_ok=True)
                for rank in range(nc.tp_degree):
                    shard = f"FAKE shard {rank} of {read.hexdigest()}".encode()
                    (Path(path) / "weights" / f"tp{rank}_sharded_checkpoint.safetensors").write_bytes(shard)

            def load(self, path):
                self.loaded_from = path


        def _record(call):
            scratch = Path(os.environ["BASE_COMPILE_WORK_DIR"])
            scratch.mkdir(parents=True, exist_ok=True)
            with open(scratch / "calls.jsonl", "a") as log:
                log.write(json.dumps({"call": call, "pid": os.getpid(),
                                      "cache_url": os.environ.get("NEURON_COMPILE_CACHE_URL")}) + "\\n")
    ''',
    "models/qwen3/__init__.py": "",
    "models/qwen3/modeling_qwen3.py": '''
        import json
        from pathlib import Path

        from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
        from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM


        class Qwen3NeuronConfig(NeuronConfig):
            pass


        class Qwen3InferenceConfig(InferenceConfig):
            @classmethod
            def get_neuron_config_cls(cls):
                return Qwen3NeuronConfig

            @classmethod
            def load(cls, path):
                saved = json.loads((Path(path) / "neuron_config.json").read_text())
                config = cls(Qwen3NeuronConfig(**saved["neuron_config"]))
                config.eos_token_id = saved["eos_token_id"]
                return config


        class NeuronQwen3Model:
            pass


        class NeuronQwen3ForCausalLM(NeuronBaseForCausalLM):
            _model_cls = NeuronQwen3Model

            @classmethod
            def get_config_cls(cls):
                return Qwen3InferenceConfig
    ''',
    "utils/__init__.py": "",
    "utils/hf_adapter.py": '''
        import json
        from pathlib import Path


        def load_pretrained_config(model_path):
            def load(config):
                config.__dict__.update(json.loads((Path(model_path) / "config.json").read_text()))
                config._name_or_path = str(model_path)  # as transformers' PretrainedConfig.to_dict() has it
            return load
    ''',
}


@pytest.fixture()
def fake_nxdi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The FAKE NxDI package (see the module docstring) on this process's and the builds' path."""
    root = tmp_path / "fake-nxdi"
    for name, source in FAKE_NXDI.items():
        path = root / "neuronx_distributed_inference" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    dist_info = root / f"neuronx_distributed_inference-{FAKE_NXDI_VERSION}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: neuronx-distributed-inference\nVersion: {FAKE_NXDI_VERSION}\n")
    # Distribution metadata for this process (the backend reads versions, never imports NxDI here) and the
    # package for the build processes, which inherit PYTHONPATH.
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH",
                       os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    # A work dir of this test's own: builds are keyed by content, and an earlier run's would be reused.
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    return root


def _run_config(tmp_path: Path, target: Path, draft: Path, ks: list[int],
                neuron: dict[str, Any] | None = None, name: str = "run.yaml") -> Path:
    config = tmp_path / name
    config.write_text(yaml.safe_dump({
        "target": str(target), "draft": str(draft), "backend": "neuron", "neuron": neuron or {},
        "matrix": {"tp_degree": [2], "seq_len": [256], "speculation_length": ks, "batch_size": [2],
                   "dtype": ["float32"]},
    }))
    return config


def test_two_fused_builds_in_one_local_run_each_see_a_pristine_class_and_their_own_env(
        fake_nxdi: Path, tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.flows.cli import main

    config = _run_config(tmp_path, tiny_target, tiny_drafts["perturbed"], ks=[3, 5])
    assert main(["compile", str(config), "--json"]) == 0
    builds = json.loads(capsys.readouterr().out)["builds"]
    assert len(builds) == 2 and not any(b["reused"] for b in builds)
    settings = load_settings()
    observed = []
    for build in builds:
        artifact = Path(build["artifact"])
        described = json.loads((artifact / "build.json").read_text())
        assert described["backend"] == "neuron"
        assert {"neuron_config.json", "model.pt", "config.json", "tokenizer.json", "draft/config.json"} <= {
            p.relative_to(artifact).as_posix() for p in artifact.rglob("*") if p.is_file()}
        scratch = settings.work_dir / "neuron-compile" / build["graph_key"]
        seen = json.loads((scratch / "observed.json").read_text())
        observed.append(seen)
        # Each build found NxDI's class as shipped, although the build before it changed that class ...
        assert seen["model_cls_at_init"] == "NeuronQwen3Model"
        # ... and its own scratch directory (one per graph key) and settings in its environment.
        assert seen["base_compile_work_dir"] == str(scratch)
        assert seen["logical_nc_config"] == "2" and seen["is_continuous_batching"] is True
    assert sorted(s["speculation_length"] for s in observed) == [3, 5]
    assert len({s["pid"] for s in observed} | {os.getpid()}) == 3
    assert "neuronx_distributed_inference" not in sys.modules  # this process never imported NxDI


def test_without_isolation_the_fake_reproduces_the_nxdi_0_6_failure(fake_nxdi: Path, tmp_path: Path,
                                                                    tiny_target: Path,
                                                                    tiny_drafts: dict[str, Path]) -> None:
    """The control: both compiles in one process, as before isolation. The second one fails the way the issue
    describes, so the test above passes because of the isolation, not because the fake is harmless."""
    from fusedspec.compile.modelref import parse_model_ref
    from fusedspec.registry.hub import resolve_model

    target = resolve_model(parse_model_ref(str(tiny_target)), load_settings())
    draft = resolve_model(parse_model_ref(str(tiny_drafts["perturbed"])), load_settings())
    with pytest.raises(ConfigError, match="_model_cls is NeuronFusedSpecModel, not the NeuronQwen3Model"):
        run_isolated(_two_compiles_in_one_process, target, draft, tmp_path, env={}, what="the control")


def _two_compiles_in_one_process(target: Any, draft: Any, root: Path) -> None:
    from fusedspec.compile.modelconfig import read_arch
    from fusedspec.compile.neuron.device import compile_plan
    from fusedspec.compile.neuron.translate import translate
    from fusedspec.compile.spec import BuildSpec

    for k in (3, 5):
        spec = BuildSpec(tp_degree=2, seq_len=256, speculation_length=k, batch_size=2, dtype="float32",
                         backend="neuron")
        out = root / f"k{k}"
        out.mkdir()
        os.environ["BASE_COMPILE_WORK_DIR"] = str(root / f"scratch-k{k}")
        compile_plan(translate(spec, read_arch(target.local_dir), read_arch(draft.local_dir),
                               target_path=target.local_dir, draft_path=draft.local_dir,
                               compiled_model_path=out, compile_work_dir=root / f"scratch-k{k}"))


def test_a_build_killed_mid_compile_is_reported_and_leaves_nothing(
        fake_nxdi: Path, tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.flows.cli import main

    monkeypatch.setenv("FAKE_NXDI_SIGKILL_DURING_COMPILE", "1")  # the fake kills itself after model.pt
    config = _run_config(tmp_path, tiny_target, tiny_drafts["perturbed"], ks=[4])
    builds_dir = load_settings().builds_dir
    before = set(builds_dir.iterdir()) if builds_dir.is_dir() else set()
    assert main(["compile", str(config), "--json"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert "the NxDI compile of tp2-seq256-k4-bs2-float32" in error and "killed by SIGKILL" in error
    assert (set(builds_dir.iterdir()) if builds_dir.is_dir() else set()) == before  # no partial artifact


def test_a_compiled_artifact_loads_in_its_own_process(fake_nxdi: Path, tmp_path: Path, tiny_target: Path,
                                                      tiny_drafts: dict[str, Path]) -> None:
    from fusedspec.compile.backend import get_backend
    from fusedspec.compile.modelref import parse_model_ref
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.registry.hub import resolve_model

    settings = load_settings()
    target = resolve_model(parse_model_ref(str(tiny_target)), settings)
    draft = resolve_model(parse_model_ref(str(tiny_drafts["perturbed"])), settings)
    spec = BuildSpec(tp_degree=2, seq_len=256, speculation_length=4, batch_size=2, dtype="float32",
                     backend="neuron")
    backend = get_backend("neuron")
    keys = BuildKeys("f" * 64, "f" * 64, "f" * 64)
    out = backend.compile(spec, target, draft, tmp_path / "artifact", keys=keys)
    runner = backend.load(out, LoadTrust(where=str(out), built_here=True))  # compiled by this test
    assert runner.eos_token_ids == (151645,)  # read by the loading process from the artifact
    assert runner.session.pid != os.getpid()
    runner.close()
    assert runner.session._child.process.poll() is not None
    # The target-only reference after the fused build (the pair NxDI 0.6 broke in one process).
    reference = backend.compile_reference(  # type: ignore[attr-defined]
        spec, target, draft, tmp_path / "reference", keys=keys)
    scratch = settings.work_dir / "neuron-compile" / ("f" * 64 + ".target-only")  # the reference's own
    seen = json.loads((scratch / "observed.json").read_text())
    assert seen["model_cls_at_init"] == "NeuronQwen3Model" and seen["speculation_length"] == 0
    assert json.loads((reference / "build.json").read_text())["reference"] == "target-only"
    assert "neuronx_distributed_inference" not in sys.modules


def test_a_new_revision_shards_its_weights_beside_the_programs_its_graph_key_compiled_once(
        fake_nxdi: Path, tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        tiny_revisions_b: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21, Neuron: `fusedspec compile` of revision A compiles; revision B of the target (same config,
    new weights) makes only the shard step's NxDI calls, in a process of its own, on A's model.pt."""
    from fusedspec.flows.cli import main

    target_b = tiny_revisions_b["target"]
    cache = tmp_path / "neuron-compile-cache"
    built = {}
    for name, target in (("A", tiny_target), ("B", target_b)):
        config = _run_config(tmp_path, target, tiny_drafts["perturbed"], ks=[4], name=f"{name}.yaml",
                             neuron={"compile_cache_url": str(cache)})
        assert main(["compile", str(config), "--json"]) == 0
        [built[name]] = json.loads(capsys.readouterr().out)["builds"]
    a, b = built["A"], built["B"]
    assert (a["work"], b["work"]) == ("compile", "programs")
    assert b["graph_key"] == a["graph_key"] and b["key"] != a["key"]

    settings = load_settings()
    scratch = settings.work_dir / "neuron-compile" / a["graph_key"]  # one scratch for both revisions
    calls = [json.loads(line) for line in (scratch / "calls.jsonl").read_text().splitlines()]
    assert [c["call"] for c in calls] == ["compile", "shard_weights", "shard_weights"]  # B traced nothing
    assert calls[2]["pid"] not in (calls[0]["pid"], os.getpid())  # in a process of its own
    assert {c["cache_url"] for c in calls} == {str(cache)}  # the run config's cache, in each process's env

    first, second = Path(a["artifact"]), Path(b["artifact"])
    entry = settings.programs_dir / a["graph_key"] / "model.pt"  # kept by A's compile
    assert (second / "model.pt").read_bytes() == (first / "model.pt").read_bytes() == entry.read_bytes()
    assert (second / "model.pt").stat().st_ino == entry.stat().st_ino  # linked, not copied
    shard = "weights/tp1_sharded_checkpoint.safetensors"
    assert (second / shard).read_bytes() != (first / shard).read_bytes()  # B's own weights
    saved = [json.loads((path / "neuron_config.json").read_text()) for path in (first, second)]
    assert [config["_name_or_path"] for config in saved] == [str(tiny_target), str(target_b)]
    described = json.loads((second / "build.json").read_text())
    assert described["programs"] == ["model.pt"]
    assert described["programs_from"] == f"graph key {a['graph_key']} (compiled)"
    assert set(described["timings"]) == {"shard_s"}
    # Where the cache lives is the host's business: not recorded, not loaded with.
    assert str(cache) not in (second / "build.json").read_text()
    assert "NEURON_COMPILE_CACHE_URL" not in described["neuron"]["env"]


def test_nxds_layout_switch_is_refused_before_anything_is_traced(
        fake_nxdi: Path, tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With NXD_LAYOUT_TRANSFORMATION_OPTIONS, NxD bakes the weights' layout into the shards and out of
    model.pt, which no key records: a later revision's shard step would not fit that model.pt."""
    from fusedspec.flows.cli import main

    monkeypatch.setenv("NXD_LAYOUT_TRANSFORMATION_OPTIONS", "1")
    config = _run_config(tmp_path, tiny_target, tiny_drafts["perturbed"], ks=[4])
    assert main(["compile", str(config), "--json"]) == 2
    assert "NXD_LAYOUT_TRANSFORMATION_OPTIONS is set" in json.loads(capsys.readouterr().out)["error"]
    assert not (load_settings().work_dir / "neuron-compile").exists()  # nothing traced
