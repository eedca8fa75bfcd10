"""On a Trainium host with the Neuron SDK: what must hold for a compiled fused artifact (issue 7, must-show
3).

These tests are marked `neuron` and skipped elsewhere, with the reason. On a device they compile the tiny
Qwen3 target with a derived draft (TP 2, seq_len 256, k 4, batch 2, float32 so that a CPU reference is
exact) through the real NxDI, then check:
  - the artifact holds what NxDI compile() writes (neuron_config.json with the fused-spec config, model.pt,
    weights/tp{r}_sharded_checkpoint.safetensors) and build.json;
  - greedy equivalence: fused tokens == NxDI target-only build tokens == Hugging Face transformers on CPU;
  - measured steps == predicted steps: the per-step counts equal what teacher-forced agreement predicts
    (validate.acceptance.accepted_per_step) for every prompt;
  - a new revision of the target on the fused build's model.pt (the shard step only) generates what that
    revision generates on CPU.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from fusedspec.compile.backend import get_backend
from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.modelref import ResolvedModel, parse_model_ref
from fusedspec.compile.spec import BuildSpec


def _sdk_and_device() -> str | None:
    if importlib.util.find_spec("neuronx_distributed_inference") is None:
        return "the Neuron SDK (neuronx-distributed-inference) is not installed on this host"
    try:
        import neuronx_distributed_inference  # noqa: F401
    except ImportError as exc:
        return f"neuronx-distributed-inference is installed but cannot be imported ({exc}); a placeholder?"
    if not Path("/dev/neuron0").exists():
        return "no Neuron device (/dev/neuron0) on this host"
    return None


SKIP_REASON = _sdk_and_device()
pytestmark = [
    pytest.mark.neuron,
    pytest.mark.skipif(SKIP_REASON is not None,
                       reason=f"needs a Trainium host with the Neuron SDK: {SKIP_REASON}"),
]

SPEC = BuildSpec(tp_degree=2, seq_len=256, speculation_length=4, batch_size=2, dtype="float32",
                 backend="neuron")
MAX_NEW = 48


def _resolved(directory: Path) -> ResolvedModel:
    return ResolvedModel(ref=parse_model_ref(str(directory)), commit=None, local_dir=directory)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path,
          tiny_drafts: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("neuron")
    backend = get_backend("neuron")
    target, draft = _resolved(tiny_target), _resolved(tiny_drafts["perturbed"])
    keys = BuildKeys("d" * 64, "d" * 64, "d" * 64)  # what a plan would give; no store sees this build
    fused = backend.compile(SPEC, target, draft, root / "fused", keys=keys)
    reference = backend.compile_reference(SPEC, target, draft, root / "reference", keys=keys)
    return {"fused": fused, "reference": reference, "target": tiny_target, "draft": tiny_drafts["perturbed"]}


@pytest.fixture(scope="module")
def prompts(qwen3_tokenizer: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(qwen3_tokenizer / "tokenizer.json"))
    texts = ["one two three one two three one two three", "def add(a, b):\n    return",
             "The history of the city begins"]
    return [tok.encode(t).ids for t in texts]


def test_artifact_holds_what_nxdi_compile_writes(built: dict[str, Path]) -> None:
    fused = built["fused"]
    for name in ["neuron_config.json", "model.pt", "build.json", "tokenizer.json",
                 *(f"weights/tp{r}_sharded_checkpoint.safetensors" for r in range(SPEC.tp_degree))]:
        assert (fused / name).is_file(), name
    saved = json.loads((fused / "neuron_config.json").read_text())
    assert saved["neuron_config"]["enable_fused_speculation"] is True
    assert saved["neuron_config"]["speculation_length"] == SPEC.speculation_length
    assert saved["fused_spec_config"]["draft_config"]["neuron_config"]["speculation_length"] == 0
    assert saved["fused_spec_config"]["worker_cls"]["__name__"] == "NeuronQwen3Model"


def test_greedy_equivalence_with_target_only_build_and_hf_cpu(built: dict[str, Path],
                                                              prompts: list[list[int]]) -> None:
    from fusedspec.validate.reference import compute_reference

    backend = get_backend("neuron")
    fused = backend.load(built["fused"]).generate(prompts, MAX_NEW)
    nxdi_reference = backend.load_reference(built["reference"]).generate(prompts, MAX_NEW)
    assert fused.tokens == nxdi_reference.tokens
    hf = compute_reference(built["target"], _rendered(prompts), max_new_tokens=MAX_NEW, dtype="float32",
                           eos_token_ids=[151645])
    assert fused.tokens == [list(p.tokens) for p in hf.prompts]


def test_measured_steps_equal_predicted_steps(built: dict[str, Path], prompts: list[list[int]]) -> None:
    from fusedspec.validate.acceptance import accepted_per_step, teacher_forced_agreement
    from fusedspec.validate.reference import compute_reference

    generation = get_backend("neuron").load(built["fused"]).generate(prompts, MAX_NEW)
    reference = compute_reference(built["target"], _rendered(prompts), max_new_tokens=MAX_NEW,
                                  dtype="float32", eos_token_ids=[151645])
    agreement = teacher_forced_agreement(built["target"], built["draft"], reference)
    predicted = [accepted_per_step(a, SPEC.speculation_length) for a in agreement]
    assert generation.accepted == predicted


def _rendered(prompts: list[list[int]]) -> list[Any]:
    """Token-id prompts in the shape validate.reference expects."""
    from fusedspec.validate.prompts import RenderedPrompt

    return [RenderedPrompt(id=f"p{i}:raw", prompt_id=f"p{i}", cls="device-test", variant="raw", text="",
                           ids=tuple(ids)) for i, ids in enumerate(prompts)]


def test_advice_cost_model_from_the_artifacts_device_step_times(built: dict[str, Path],
                                                                 prompts: list[list[int]]) -> None:
    """Issue 17: on the device, c comes from this artifact's fused steps against its target-only build's
    steps (timed by the NxDI adapter hooks), never from a CPU forward."""
    from fusedspec.validate.step_costs import cost_model_from_times, device_step_times

    backend = get_backend("neuron")
    times = device_step_times(backend.load(built["fused"]), backend.load_reference(built["reference"]),
                              prompts, MAX_NEW)
    assert times.k == SPEC.speculation_length and len(times.fused_step_s) == len(times.target_step_s) == 3
    model = cost_model_from_times(times)
    assert model.source.startswith("measured on this artifact and its target-only build on the Neuron device")
    assert model.verify_slope == 0  # one fused graph: b is stated, and said to be


def test_a_new_revision_on_the_programs_of_its_graph_key_is_greedy_equal_to_its_own_weights(
        built: dict[str, Path], fixtures_dir: Path, prompts: list[list[int]]) -> None:
    """Issue 21: revision B of the target (same config, new weights) gets A's model.pt and only the shard step
    (NxDI's config.save and shard_weights); it must generate what B itself generates on CPU."""
    from fusedspec.compile.backend import ProgramSource
    from fusedspec.demo.models import derive_draft
    from fusedspec.validate.reference import compute_reference

    target_b = derive_draft(built["target"], fixtures_dir / "tiny-target-revision-b", noise=0.01, seed=21)
    backend = get_backend("neuron")
    programs = ProgramSource(directory=built["fused"], files=("model.pt",), origin="revision A's compile")
    keys = BuildKeys(graph="d" * 64, weights="e" * 64, version="e" * 64)  # A's graph key, B's weights
    out = built["fused"].parent / "revision-b"
    revision = backend.compile(SPEC, _resolved(target_b), _resolved(built["draft"]), out, keys=keys,
                               programs=programs)
    assert (revision / "model.pt").read_bytes() == (built["fused"] / "model.pt").read_bytes()
    assert json.loads((revision / "build.json").read_text())["programs_from"] == "revision A's compile"
    tokens = backend.load(revision).generate(prompts, MAX_NEW).tokens
    hf = compute_reference(target_b, _rendered(prompts), max_new_tokens=MAX_NEW, dtype="float32",
                           eos_token_ids=[151645])
    assert tokens == [list(p.tokens) for p in hf.prompts]
