"""The serving YAML for a Neuron artifact (issue 13, must-show 3) and for a cpu one (issue 14: `fusedspec serve`): it validates against the Kubernetes object
models, requests Neuron devices, tolerates the Neuron taint, names the image the Dockerfile builds, needs no
Hugging Face Hub (every model file the vLLM fork reads is on the mount), and refuses what it cannot serve.

The artifact is a layout fixture (tests/fixtures/fake_artifacts.make_neuron_artifact: the neuron backend's own
translation and build.json, NxDI's files stood in for), published to SeaweedFS."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from fusedspec.core.errors import ArtifactError, ConfigError, StoreError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.k8s import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, ServingOptions, render_k8s
from fusedspec.registry.publish import publish_artifact

MODELS = {"PersistentVolume": "V1PersistentVolume", "PersistentVolumeClaim": "V1PersistentVolumeClaim",
          "Deployment": "V1Deployment"}


def validate_object(document: dict) -> None:
    """Deserialize into the kubernetes client's typed model and back: required fields are enforced by the
    models' constructors, and a misspelled or unknown field would be dropped, so the round trip differs."""
    api = ApiClient()
    typed = api.deserialize(json.dumps(document), MODELS[document["kind"]], "application/json")
    assert api.sanitize_for_serialization(typed) == document


@pytest.fixture
def published(seaweed, s3_bucket: str, s3_settings: Settings, neuron_artifact_factory):  # noqa: ANN001, ANN201
    root = f"s3://{s3_bucket}/serve"
    artifact = neuron_artifact_factory(tp=32, k=7, batch=4, seq_len=1024)
    return root, artifact, publish_artifact(artifact, root, s3_settings)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def read_manifest(client: Any, version_uri: str) -> dict[str, Any]:
    bucket, prefix = version_uri[len("s3://"):].split("/", 1)
    return json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())


def test_neuron_yaml_validates_requests_devices_tolerates_the_taint_and_needs_no_hub(
        published: Any, seaweed, s3_settings: Settings) -> None:  # noqa: ANN001
    root, artifact, result = published
    text = render_k8s(f"{root}/{result.config_path}", s3_settings, ServingOptions(namespace="serving"))  # LATEST
    assert "&id" not in text and "*id" not in text  # no YAML aliases: every object written out
    pv, pvc, deployment = list(yaml.safe_load_all(text))
    for document in (pv, pvc, deployment):
        validate_object(document)

    prefix = f"serve/{result.config_path}/{result.key}/"
    assert pv["spec"]["csi"]["driver"] == "s3.csi.aws.com"
    assert pv["spec"]["csi"]["volumeAttributes"]["bucketName"] == root.split("/")[2]
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"] and pv["spec"]["storageClassName"] == ""
    options = pv["spec"]["mountOptions"]
    assert f"prefix {prefix}" in options and "metadata-ttl indefinite" in options
    assert {"read-only", "allow-other", "region us-east-1"} <= set(options)
    assert pv["spec"]["claimRef"] == {"namespace": "serving", "name": pvc["metadata"]["name"]}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pvc["spec"]["storageClassName"] == ""

    pod = deployment["spec"]["template"]["spec"]
    [vllm] = pod["containers"]
    [init] = pod["initContainers"]
    mount = f"/var/mdl/{result.key}"  # the version directory; its files are in the attempt directory
    files = f"{mount}/{result.attempt}"
    # Neuron devices: TP 32 at LNC 2 on trn2 is 4 logical cores per device, 8 devices; the taint; the node.
    assert vllm["resources"]["requests"] == vllm["resources"]["limits"] == {"aws.amazon.com/neuron": "8"}
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn2.48xlarge"}
    # The image the Dockerfile builds, for both containers: the init check sees vLLM's own toolchain.
    assert vllm["image"] == init["image"] == DEFAULT_IMAGE == "fusedspec:neuron"
    # The SDK 2.26 recipe.
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["VLLM_USE_V1"] == "0" and env["VLLM_NEURON_FRAMEWORK"] == "neuronx-distributed-inference"
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2" and env["NEURON_COMPILED_ARTIFACTS"] == files
    args = vllm["args"]
    assert vllm["command"] == ["vllm"] and args[:2] == ["serve", files]
    # Issue 26, must-show 3: seq_len 1024, k 7 -> 1017: no request makes a fused step write past the KV cache
    # (compile.fused_step; the Neuron SDK 2.26 tutorial's --max-model-len 1024 would let the last steps overrun).
    assert (flag(args, "--tensor-parallel-size"), flag(args, "--max-model-len"), flag(args, "--max-num-seqs")) == \
        ("32", "1017", "4")
    assert json.loads(flag(args, "--override-neuron-config")) == {"save_sharded_checkpoint": True,
                                                                  "enable_fused_speculation": True}
    speculative = json.loads(flag(args, "--speculative-config"))
    assert speculative == {"model": f"{files}/draft", "num_speculative_tokens": 7, "max_model_len": 1017,
                           "method": "eagle"}
    assert flag(args, "--served-model-name") == "Qwen/Qwen3-32B" and flag(args, "--dtype") == "bfloat16"
    # No Hub: offline, and every path the fork reads by model id is on the mount and in the manifest.
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert "--revision" not in args and not any(re.fullmatch(r"Qwen/Qwen3-[0-9.]+B", a) for a in args
                                                if a != flag(args, "--served-model-name"))
    manifest = read_manifest(seaweed.client(), result.version_uri)
    for path, names in ((flag(args, "--tokenizer"), ["tokenizer.json", "tokenizer_config.json"]),
                        (args[1], ["config.json", "generation_config.json"]),
                        (speculative["model"], ["config.json", "generation_config.json"])):
        assert path.startswith(files)
        relative = path[len(files):].strip("/")
        for name in names:
            assert "/".join(p for p in (relative, name) if p) in manifest["files"], (path, name)
    # Probes on vLLM's /health; startup long enough to load the weights through Mountpoint.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": 8000}
    assert vllm["startupProbe"]["periodSeconds"] * vllm["startupProbe"]["failureThreshold"] >= 1800
    # The init container checks the mount it shares with vLLM: manifest, sizes, runtime toolchain.
    assert init["command"] == ["fusedspec", "verify", mount, "--runtime-check", "--json", "--quick"]
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    assert artifact_mount in init["volumeMounts"] and artifact_mount in vllm["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["artifact"]["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"], "readOnly": True}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}


def test_cli_options_replace_scheduling_image_and_verify_mode(published: Any, seaweed, capsys,  # noqa: ANN001
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _root, _artifact, result = published
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert main(["k8s", result.version_uri, "--name", "Qwen3 Spec", "--image", "123.dkr.ecr/fusedspec:neuron",
                 "--node-selector", "pool=trn2-serving", "--node-selector", "zone=a",
                 "--toleration", "dedicated=inference:NoSchedule", "--full-verify", "--mount-root", "/models",
                 "--replicas", "2"]) == 0
    pv, _pvc, deployment = list(yaml.safe_load_all(capsys.readouterr().out))
    for document in (pv, deployment):
        validate_object(document)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["metadata"]["name"] == "qwen3-spec" and deployment["spec"]["replicas"] == 2
    assert {c["image"] for c in [*pod["containers"], *pod["initContainers"]]} == {"123.dkr.ecr/fusedspec:neuron"}
    assert pod["nodeSelector"] == {"pool": "trn2-serving", "zone": "a"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "inference",
                                   "effect": "NoSchedule"}]
    assert "--quick" not in pod["initContainers"][0]["command"]  # --full-verify re-hashes every byte
    assert pod["initContainers"][0]["command"][2] == f"/models/{result.key}"
    assert "region eu-west-1" in pv["spec"]["mountOptions"]
    assert f"endpoint-url {seaweed.endpoint}" in pv["spec"]["mountOptions"]
    assert main(["k8s", result.version_uri, "--no-node-selector", "--no-toleration"]) == 0
    pod = list(yaml.safe_load_all(capsys.readouterr().out))[2]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod


@pytest.mark.parametrize("argv, words", [
    (["--node-selector", "instance-type"], "expected KEY=VALUE"),
    (["--toleration", "aws.amazon.com/neuron:Sometimes"], "expected KEY[=VALUE]:EFFECT"),
    (["--node-selector", "a=b", "--no-node-selector"], "not both"),
    (["--replicas", "0"], "replicas=0 must be a positive integer"),
    (["--port", "70000"], "port=70000 must be between 1 and 65535"),
    (["--mount-root", "relative/dir"], "must be an absolute directory"),
    (["--namespace", "Serving_NS"], "is not a DNS-1123 label"),
    (["--node-selector", "bad key=x"], "is not a label key"),
])
def test_bad_options_are_refused_naming_them(published: Any, seaweed, capsys, monkeypatch, argv: list[str],  # noqa: ANN001
                                             words: str) -> None:
    _root, _artifact, result = published
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    assert main(["k8s", result.version_uri, *argv]) == 2
    assert words in capsys.readouterr().err


def test_versions_that_cannot_be_served_are_refused(seaweed, s3_bucket: str, s3_settings: Settings,  # noqa: ANN001
                                                    neuron_artifact_factory) -> None:
    root = f"s3://{s3_bucket}/refuse"
    seeds = iter(range(1, 100))

    def published_with(change: Any) -> str:
        artifact = neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=next(seeds))  # a key of its own
        change(artifact)
        return publish_artifact(artifact, root, s3_settings).version_uri

    def drop_serving(artifact: Path) -> None:  # as compiled before serving metadata was recorded
        described = json.loads((artifact / "build.json").read_text())
        del described["neuron"]["serving"]
        (artifact / "build.json").write_text(json.dumps(described))

    with pytest.raises(ArtifactError, match="has no neuron.serving .* compile and publish it again"):
        render_k8s(published_with(drop_serving), s3_settings)

    def drop_draft_config(artifact: Path) -> None:  # the draft's config.json would have to come from the Hub
        (artifact / "draft" / "config.json").unlink()
        described = json.loads((artifact / "build.json").read_text())
        described["neuron"]["serving"]["model_files"]["draft"].remove("draft/config.json")
        (artifact / "build.json").write_text(json.dumps(described))

    with pytest.raises(ArtifactError, match="would need the Hugging Face Hub for draft/config.json"):
        render_k8s(published_with(drop_draft_config), s3_settings)

    def garble_serving(artifact: Path) -> None:
        described = json.loads((artifact / "build.json").read_text())
        described["neuron"]["serving"].update(neuron_devices="8; rm -rf /", draft_dir="../elsewhere")
        (artifact / "build.json").write_text(json.dumps(described))

    with pytest.raises(ArtifactError, match="malformed .*neuron_devices is '8; rm -rf /'.*draft_dir '../elsewhere'"):
        render_k8s(published_with(garble_serving), s3_settings)
    with pytest.raises(StoreError, match="mounts S3 only"):
        render_k8s("/some/dir", s3_settings)
    with pytest.raises(StoreError, match="nothing to verify"):
        render_k8s(f"{root}/no/such/version", s3_settings)


def test_the_serving_tail_holds_for_versions_recorded_before_it_and_async_mode_reaches_vllm(
        seaweed, s3_bucket: str, s3_settings: Settings, neuron_artifact_factory) -> None:  # noqa: ANN001
    """Issue 26: --max-model-len comes from the version's spec (seq_len - k), whatever its build.json recorded;
    an async_mode artifact tells vLLM so in --override-neuron-config (the fork reads it there)."""
    artifact = neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=201, options={"async_mode": True})
    described = json.loads((artifact / "build.json").read_text())
    serving = described["neuron"]["serving"]
    serving["max_model_len"] = serving["speculative_config"]["max_model_len"] = 512  # as recorded before the rule
    (artifact / "build.json").write_text(json.dumps(described))
    version = publish_artifact(artifact, f"s3://{s3_bucket}/tail", s3_settings).version_uri
    args = list(yaml.safe_load_all(render_k8s(version, s3_settings)))[2]["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert flag(args, "--max-model-len") == "507"
    assert json.loads(flag(args, "--speculative-config"))["max_model_len"] == 507
    assert json.loads(flag(args, "--override-neuron-config")) == {"save_sharded_checkpoint": True,
                                                                  "enable_fused_speculation": True, "async_mode": True}


def test_cpu_yaml_runs_fusedspec_serve_after_the_same_verify_with_probes_on_its_endpoints(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory, capsys,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cpu version gets `fusedspec serve` from the cpu image, the same volume and init verify, and probes on
    serve's /ready and /health (tests/test_serve_pod.py runs these very commands against a real server)."""
    result = publish_artifact(artifact_factory(k=3, tp=2, weight_mib=1), f"s3://{s3_bucket}/cpu", s3_settings,
                              unvalidated=True)
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    assert main(["k8s", result.version_uri, "--namespace", "serving", "--port", "8080"]) == 0
    text = capsys.readouterr().out
    assert "&id" not in text and "*id" not in text
    pv, pvc, deployment = list(yaml.safe_load_all(text))
    for document in (pv, pvc, deployment):
        validate_object(document)
    assert f"prefix cpu/{result.config_path}/{result.key}/" in pv["spec"]["mountOptions"]
    assert pv["spec"]["claimRef"] == {"namespace": "serving", "name": pvc["metadata"]["name"]}

    pod = deployment["spec"]["template"]["spec"]
    [serve], [init] = pod["containers"], pod["initContainers"]
    mount = f"/var/mdl/{result.key}"
    assert serve["image"] == init["image"] == DEFAULT_CPU_IMAGE == "fusedspec:cpu"  # the Dockerfile's BASE=cpu
    assert serve["command"] == ["fusedspec", "serve", mount, "--host", "0.0.0.0", "--port", "8080", "--quick"]
    assert init["command"] == ["fusedspec", "verify", mount, "--runtime-check", "--json", "--quick"]
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    assert serve["volumeMounts"] == init["volumeMounts"] == [artifact_mount]
    assert pod["volumes"] == [{"name": "artifact", "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"],
                                                                             "readOnly": True}}]
    assert serve["ports"] == [{"name": "http", "containerPort": 8080}]
    for probe, path in (("startupProbe", "/ready"), ("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert serve[probe]["httpGet"] == {"path": path, "port": 8080}
    assert serve["startupProbe"]["periodSeconds"] * serve["startupProbe"]["failureThreshold"] >= 600
    # No Neuron devices, taint or instance type; memory for the weights.
    assert "aws.amazon.com/neuron" not in json.dumps(deployment)
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert serve["resources"]["requests"]["memory"] == serve["resources"]["limits"]["memory"]
    env = {e["name"]: e["value"] for e in serve["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"


def test_a_manifest_missing_fields_is_refused_naming_them(published: Any, seaweed, s3_settings: Settings) -> None:  # noqa: ANN001
    _root, _artifact, result = published
    client = seaweed.client()
    bucket, prefix = result.version_uri[len("s3://"):].split("/", 1)
    manifest = read_manifest(client, result.version_uri)
    del manifest["spec"], manifest["models"]
    client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=json.dumps(manifest).encode())
    with pytest.raises(StoreError, match="manifest.json: spec: required field is missing; models: required field"):
        render_k8s(result.version_uri, s3_settings)
    with pytest.raises(ConfigError, match="replicas=0"):
        render_k8s(result.version_uri, s3_settings, ServingOptions(replicas=0))


def test_validation_catches_a_misspelled_field() -> None:
    # The check above must be able to fail: a typo in a field name does not survive the round trip.
    bad = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"},
           "spec": {"accessMode": ["ReadOnlyMany"]}}
    with pytest.raises(AssertionError):
        validate_object(bad)
