"""A Neuron-shaped artifact goes through publish, verify and `fusedspec k8s` unchanged (issue 7, must-show 4).

LAYOUT FIXTURE, NOT A COMPILE: no Neuron SDK here, so the directory is made from the translation's
expected file list: neuron_config.json shaped like NxDI's InferenceConfig.save() (the translated configs),
model.pt with placeholder bytes, real safetensors shards per rank with NxDI's `draft_model.` /
`target_model.` prefixes, the real Qwen3 tokenizer files, and build.json as the neuron backend writes it
(with a toolchain as a Neuron host would record it). What is tested is the path through the registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from compile.backend import describe_build, write_build_description
from compile.modelref import ResolvedModel, parse_model_ref
from compile.neuron.backend import BACKEND, _stored_plan
from compile.neuron.translate import translate
from compile.settings import Settings, load_settings
from compile.spec import BuildSpec
from tests.fixtures.fake_artifacts import passing_validation
from tests.test_neuron_translate import arch

SPEC = BuildSpec(tp_degree=32, seq_len=1024, speculation_length=7, batch_size=4, dtype="bfloat16", backend="neuron")
KEY = "a1" * 32
# What a trn2 compile node with the SDK 2.26 DLC would record (illustrative versions, not this host's).
NEURON_HOST_TOOLCHAIN = {"neuronx-cc": "2.21.18209.0", "neuronx-distributed-inference": "0.6.10598",
                         "neuronx-distributed": "0.15.22404", "torch-neuronx": "2.8.0.2.10.13553",
                         "libneuronxla": "2.2.12677.0", "torch": "2.8.0", "neuron-runtime": "2.28.23.0-4ad8da3f5",
                         "neuron_cc_flags": ""}


class _RecordedBackend:
    """The neuron backend as seen on the compile node: same name and code version, its toolchain."""

    name = BACKEND.name
    code_version = BACKEND.code_version

    def toolchain(self) -> dict[str, str]:
        return dict(NEURON_HOST_TOOLCHAIN)


def _model(directory: Path, repo_id: str) -> ResolvedModel:
    directory.mkdir(parents=True, exist_ok=True)
    ref = parse_model_ref(f"hf://{repo_id}@main")
    return ResolvedModel(ref=ref, commit="c" * 40, local_dir=directory,
                         file_hashes={"model.safetensors": "sha256:" + "d" * 64})


@pytest.fixture()
def neuron_layout(tmp_path: Path, qwen3_tokenizer: Path) -> Path:
    target = _model(tmp_path / "models" / "target", "Qwen/Qwen3-32B")
    draft = _model(tmp_path / "models" / "draft", "Qwen/Qwen3-1.7B")
    out = tmp_path / "builds" / KEY
    plan = translate(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), target_path=target.local_dir,
                     draft_path=draft.local_dir, compiled_model_path=out, compile_work_dir=tmp_path / "scratch")
    (out / "weights").mkdir(parents=True)
    saved: dict[str, Any] = {
        "neuron_config": plan["target"]["neuron_config"],
        "fused_spec_config": {"worker_cls": plan["fused_spec_config"]["worker_cls"], "draft_model_cls": None,
                              "draft_model_path": plan["fused_spec_config"]["draft_model_path"],
                              "draft_config": {"neuron_config": plan["draft"]["neuron_config"]}},
        "model_type": "qwen3", "hidden_size": 5120, "num_attention_heads": 64, "num_key_value_heads": 8,
        "eos_token_id": 151645, "rope_theta": 1e6,
    }
    (out / "neuron_config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
    (out / "model.pt").write_bytes(b"LAYOUT FIXTURE: stands in for NxDI's TorchScript model.pt\n")
    rng = np.random.default_rng(0)
    for rank in range(SPEC.tp_degree):
        save_file({"target_model.layers.0.self_attn.q_proj.weight": rng.standard_normal((4, 8), np.float32),
                   "draft_model.layers.0.self_attn.q_proj.weight": rng.standard_normal((2, 8), np.float32)},
                  str(out / f"weights/tp{rank}_sharded_checkpoint.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((qwen3_tokenizer / name).read_bytes())
    missing = [f for f in plan["expected_files"] if not (out / f).is_file()]
    assert not missing
    passing_validation(KEY, SPEC).write(out / "validation.json")  # a gate's verdict, written by hand
    write_build_description(out, describe_build(SPEC, target, draft, key=KEY, backend=_RecordedBackend(),  # type: ignore[arg-type]
                                                options=None, neuron=_stored_plan(plan)))
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_neuron_layout_through_publish_and_verify(neuron_layout: Path, tmp_path: Path) -> None:
    from registry.publish import publish_artifact
    from registry.verify import verify_version

    settings = load_settings()
    before = _tree(neuron_layout)
    store_root = tmp_path / "store"
    result = publish_artifact(neuron_layout, str(store_root), settings)
    assert result.created and result.key == KEY
    assert result.config_path == f"Qwen--Qwen3-32B/Qwen--Qwen3-1.7B/{SPEC.slug}"
    version_dir = store_root / result.config_path / KEY
    manifest = json.loads((version_dir / "manifest.json").read_text())
    published = _tree(version_dir / manifest["attempt"])
    assert published == before  # every file, byte for byte, no more, no less
    assert manifest["backend"] == "neuron" and manifest["toolchain"] == NEURON_HOST_TOOLCHAIN
    assert set(manifest["files"]) == set(before)

    report = verify_version(str(version_dir), settings)
    assert report.ok, report.problems
    assert report.files_checked == len(before) == 2 + 32 + 2 + 1 + 1
    # This host has no Neuron SDK: the runtime check refuses the version and says why.
    checked = verify_version(str(store_root / result.config_path), settings, runtime_check=True)
    assert not checked.ok and checked.via_latest
    assert any(p.startswith("runtime: neuronx-cc: the artifact was built with 2.21.18209.0, this host has absent")
               for p in checked.problems)
    assert _tree(neuron_layout) == before  # publishing did not touch the artifact


def test_neuron_layout_through_s3_verify_and_k8s(neuron_layout: Path, s3_bucket: str, s3_settings: Settings) -> None:
    from registry.k8s import render_k8s
    from registry.publish import publish_artifact
    from registry.verify import verify_version

    settings, uri = s3_settings, f"s3://{s3_bucket}/fusedspec"
    result = publish_artifact(neuron_layout, uri, settings)
    version_uri = f"{uri}/{result.config_path}/{KEY}"
    report = verify_version(version_uri, settings)
    assert report.ok, report.problems
    assert report.files_checked == len(_tree(neuron_layout))
    documents = list(yaml.safe_load_all(render_k8s(f"{uri}/{result.config_path}", settings)))
    assert [d["kind"] for d in documents] == ["PersistentVolume", "PersistentVolumeClaim", "Deployment"]
    pv, deployment = documents[0], documents[2]
    assert f"prefix fusedspec/{result.config_path}/{KEY}/" in pv["spec"]["mountOptions"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "NEURON_COMPILED_ARTIFACTS", "value": f"/var/mdl/{result.attempt}"} in container["env"]
    speculative = json.loads(container["args"][container["args"].index("--speculative-config") + 1])
    assert speculative["num_speculative_tokens"] == SPEC.speculation_length
