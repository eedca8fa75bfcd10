"""The serving YAML: validated against the Kubernetes object models, naming the right prefix, k and TP."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client import ApiClient

from compile.settings import Settings
from flows.cli import main
from registry.k8s import render_k8s
from registry.publish import publish_artifact

MODELS = {"PersistentVolume": "V1PersistentVolume", "PersistentVolumeClaim": "V1PersistentVolumeClaim",
          "Deployment": "V1Deployment"}


def validate_object(document: dict) -> None:
    """Deserialize into the kubernetes client's typed model and back: required fields are enforced by the
    models' constructors, and a misspelled or unknown field would be dropped, so the round trip differs."""
    api = ApiClient()
    typed = api.deserialize(json.dumps(document), MODELS[document["kind"]], "application/json")
    assert api.sanitize_for_serialization(typed) == document


@pytest.fixture
def published(seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory):  # noqa: ANN001, ANN201
    root = f"s3://{s3_bucket}/serve"
    return root, publish_artifact(artifact_factory(k=7, tp=4, weight_mib=0.1), root, s3_settings)


def test_yaml_validates_and_names_prefix_k_and_tp(published, s3_settings: Settings) -> None:  # noqa: ANN001
    root, result = published
    text = render_k8s(f"{root}/{result.config_path}", s3_settings, namespace="serving")  # via LATEST
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
    args = vllm["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--max-model-len") + 1] == "256" and args[args.index("--max-num-seqs") + 1] == "1"
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    assert speculative == {"model": "Qwen/Qwen3-1.7B", "num_speculative_tokens": 7, "revision": "2" * 40}
    assert args[1] == "Qwen/Qwen3-32B" and args[args.index("--revision") + 1] == "1" * 40
    mount = next(m for m in vllm["volumeMounts"] if m["name"] == "artifact")
    artifacts = f"{mount['mountPath']}/{result.attempt}"  # the version dir is mounted; its files are in the attempt
    assert {"name": "NEURON_COMPILED_ARTIFACTS", "value": artifacts} in vllm["env"] and mount["readOnly"]
    assert vllm["resources"]["limits"] == {"aws.amazon.com/neuron": "1"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["artifact"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    [init] = pod["initContainers"]
    assert init["command"] == ["fusedspec", "verify", f"{root}/{result.config_path}/{result.key}", "--json"]


def test_cli_prints_the_same_yaml_with_options(published, seaweed, capsys, monkeypatch) -> None:  # noqa: ANN001
    root, result = published
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert main(["k8s", result.version_uri, "--name", "Qwen3 Spec", "--image", "my/vllm:1", "--cores-per-device", "2"]) == 0
    pv, _pvc, deployment = list(yaml.safe_load_all(capsys.readouterr().out))
    for document in (pv, deployment):
        validate_object(document)
    assert deployment["metadata"]["name"] == "qwen3-spec"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "my/vllm:1"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"aws.amazon.com/neuron": "2"}
    assert "region eu-west-1" in pv["spec"]["mountOptions"]
    assert f"endpoint-url {seaweed.endpoint}" in pv["spec"]["mountOptions"]


def test_validation_catches_a_misspelled_field() -> None:
    # The check above must be able to fail: a typo in a field name does not survive the round trip.
    bad = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"},
           "spec": {"accessMode": ["ReadOnlyMany"]}}
    with pytest.raises(AssertionError):
        validate_object(bad)
