"""The serving YAML for a Neuron artifact (issue 13, must-show 3) and for a cpu one (issue 14: `fusedspec
serve`): it validates against the Kubernetes object models and, offline, against the API's own schemas
(kubernetes-validate, strict), requests Neuron devices, CPU and memory sized from the version, tolerates the
Neuron taint, names the image the Dockerfile builds, needs no Hugging Face Hub (every model file the vLLM fork
reads is on the mount), runs non-root on a read-only root filesystem, puts a Service in front, checks the
version through the S3 API in its init container (which stops a pod on a weight object overwritten in the
bucket, reading no byte: issue 25), and refuses what it cannot serve (issue 24, 25, 27 #1, #11): native code
without a verify key, this host's loopback as the pods' endpoint, invalid names.

The artifact is a layout fixture (tests/fixtures/fake_artifacts.make_neuron_artifact: the neuron backend's own
translation and build.json, NxDI's files stood in for), published to SeaweedFS."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient

from fusedspec.core.errors import ArtifactError, ConfigError, StoreError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.k8s import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, WRITABLE_ENV, ServingOptions, render_k8s
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.signing import generate_keys, key_id, load_verify_key
from fusedspec.registry.verify import full_object_checksum
from tests.fixtures.fake_artifacts import make_neuron_artifact

MODELS = {"PersistentVolume": "V1PersistentVolume", "PersistentVolumeClaim": "V1PersistentVolumeClaim",
          "Deployment": "V1Deployment", "Service": "V1Service"}
ENDPOINT = "http://seaweedfs-s3.storage.svc:8333"  # as a cluster would reach the store
# Two 128-byte blocks with one MD5 (Wang, Feng, Lai and Yu, 2004): files that start with either and go on
# alike have one MD5, so one ETag as one-part S3 objects. Only the store's SHA-256 checksum tells them apart.
MD5_TWINS = (bytes.fromhex("d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f8955ad340609f4b302"
                           "83e488832571415a085125e8f7cdc99fd91dbdf280373c5bd8823e3156348f5bae6dacd436c919c6"
                           "dd53e2b487da03fd02396306d248cda0e99f33420f577ee8ce54b67080a80d1ec69821bcb6a88393"
                           "96f9652b6ff72a70"),
             bytes.fromhex("d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f8955ad340609f4b302"
                           "83e4888325f1415a085125e8f7cdc99fd91dbd7280373c5bd8823e3156348f5bae6dacd436c919c6"
                           "dd53e23487da03fd02396306d248cda0e99f33420f577ee8ce54b67080280d1ec69821bcb6a88393"
                           "96f965ab6ff72a70"))


def validate_object(document: dict) -> None:
    """Deserialize into the kubernetes client's typed model and back: required fields are enforced by the
    models' constructors, and a misspelled or unknown field would be dropped, so the round trip differs.
    Then the API's OpenAPI schema, offline and strict (kubernetes-validate): types, enums, unknown fields."""
    api = ApiClient()
    typed = api.deserialize(json.dumps(document), MODELS[document["kind"]], "application/json")
    assert api.sanitize_for_serialization(typed) == document
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return generate_keys()  # (signing PEM, verify PEM)


def publish_signed(seaweed, bucket: str, out: Path, tokenizer: Path,  # noqa: ANN001, ANN201
                   keys: tuple[str, str]):
    """A signed Neuron version (its model.pt is native code: pods need the verify key)."""
    root = f"s3://{bucket}/serve"
    artifact = make_neuron_artifact(out, tokenizer, tp=32, k=7, batch=4, seq_len=1024)
    return root, artifact, publish_artifact(artifact, root, replace(seaweed.settings(), signing_key=keys[0]))


@pytest.fixture(scope="module")
def publication(seaweed, qwen3_tokenizer: Path, keys: tuple[str, str],  # noqa: ANN001, ANN201
                tmp_path_factory: pytest.TempPathFactory):
    """One version for the tests that only read it (a TP 32 publish is seconds, and 16 tests read it)."""
    bucket = seaweed.new_bucket()
    try:  # dropped also when the publish fails: a kept bucket holds SeaweedFS volume slots (drop_bucket)
        yield publish_signed(seaweed, bucket, tmp_path_factory.mktemp("k8s") / "neuron-artifact",
                             qwen3_tokenizer, keys)
    finally:
        seaweed.drop_bucket(bucket)


@pytest.fixture
def published(publication, keys: tuple[str, str], monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("FUSEDSPEC_VERIFY_KEY", keys[1])
    return publication


def vouch_again(artifact: Path) -> None:
    """A validation.json for the artifact's files as they are now (a test edited its build.json)."""
    from fusedspec.compile.backend import read_build_description
    from tests.fixtures.fake_artifacts import write_vouching_validation

    description = read_build_description(artifact)
    write_vouching_validation(artifact, description.key, description.spec)


def documents(text: str) -> dict[str, dict[str, Any]]:
    found = {d["kind"]: d for d in yaml.safe_load_all(text)}
    assert list(found) == ["PersistentVolume", "PersistentVolumeClaim", "Service", "Deployment"]
    return found


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def read_manifest(client: Any, version_uri: str) -> dict[str, Any]:
    bucket, prefix = version_uri[len("s3://"):].split("/", 1)
    return json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())


def test_neuron_yaml_validates_requests_devices_tolerates_the_taint_and_needs_no_hub(
        published: Any, seaweed, s3_settings: Settings, keys: tuple[str, str]) -> None:  # noqa: ANN001
    root, artifact, result = published
    text = render_k8s(f"{root}/{result.config_path}", s3_settings,
                      ServingOptions(namespace="serving", s3_endpoint=ENDPOINT, verify_key=keys[1]))  # LATEST
    assert "&id" not in text and "*id" not in text  # no YAML aliases: every object written out
    found = documents(text)
    pv, pvc, service, deployment = found.values()
    for document in found.values():
        validate_object(document)

    prefix = f"serve/{result.config_path}/{result.key}/"
    assert pv["spec"]["csi"]["driver"] == "s3.csi.aws.com"
    assert pv["spec"]["csi"]["volumeAttributes"]["bucketName"] == root.split("/")[2]
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"] and pv["spec"]["storageClassName"] == ""
    options = pv["spec"]["mountOptions"]
    assert f"prefix {prefix}" in options and "metadata-ttl indefinite" in options
    assert {"read-only", "allow-other", "region us-east-1", f"endpoint-url {ENDPOINT}",
            "force-path-style"} <= set(options)
    assert pv["spec"]["claimRef"] == {"namespace": "serving", "name": pvc["metadata"]["name"]}
    assert "serving" in pv["metadata"]["name"] and pv["spec"]["csi"]["volumeHandle"] == pv["metadata"]["name"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pvc["spec"]["storageClassName"] == ""

    pod = deployment["spec"]["template"]["spec"]
    [vllm] = pod["containers"]
    [init] = pod["initContainers"]
    mount = f"/var/mdl/{result.key}"  # the version directory; its files are in the attempt directory
    files = f"{mount}/{result.attempt}"
    # Neuron devices: TP 32 at LNC 2 on trn2 is 4 logical cores per device, 8 devices; the taint; the node.
    # CPU per device; memory for the weights (they pass through the host), /dev/shm and the runtime.
    requests, limits = vllm["resources"]["requests"], vllm["resources"]["limits"]
    weights_mib = sum(e["size"]
                      for e in read_manifest(seaweed.client(), result.version_uri)["files"].values()) / 2**20
    assert requests["aws.amazon.com/neuron"] == limits["aws.amazon.com/neuron"] == "8" and \
        requests["cpu"] == "32"
    assert requests["memory"] == limits["memory"] and int(requests["memory"][:-2]) >= weights_mib + 2048
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists",
                                   "effect": "NoSchedule"}]
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
    # (compile.fused_step; the Neuron SDK 2.26 tutorial's --max-model-len 1024 would let the last steps
    # overrun).
    assert (flag(args, "--tensor-parallel-size"), flag(args, "--max-model-len"),
            flag(args, "--max-num-seqs")) == ("32", "1017", "4")
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
    # The init container checks the version through the S3 API (signature, the store's own checksums, no byte
    # read) and the mount it shares with vLLM (that manifest, those files), with the verify key and endpoint.
    assert init["command"] == ["fusedspec", "verify", result.version_uri, "--mount", mount, "--runtime-check",
                               "--json", "--quick"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    assert init_env["FUSEDSPEC_VERIFY_KEY"] == keys[1] and init_env["FUSEDSPEC_S3_ENDPOINT_URL"] == ENDPOINT
    assert init_env["AWS_REGION"] == "us-east-1" and "AWS_SECRET_ACCESS_KEY" not in json.dumps(deployment)
    # Non-root, read-only root filesystem; what is written goes to the scratch emptyDir; /dev/shm bounded.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    for container in (vllm, init):
        assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
        assert {"name": "scratch", "mountPath": "/tmp"} in container["volumeMounts"]
    # A Service in front of the pods, on the container's named port.
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http",
                                         "protocol": "TCP"}]
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    assert artifact_mount in init["volumeMounts"] and artifact_mount in vllm["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["artifact"]["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"],
                                                            "readOnly": True}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2048Mi"}


def test_cli_options_replace_scheduling_image_and_verify_mode(published: Any, seaweed, capsys,  # noqa: ANN001
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _root, _artifact, result = published
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert main(["k8s", result.version_uri, "--name", "Qwen3 Spec", "--image", "123.dkr.ecr/fusedspec:neuron",
                 "--node-selector", "pool=trn2-serving", "--node-selector", "zone=a",
                 "--toleration", "dedicated=inference:NoSchedule", "--full-verify", "--mount-root", "/models",
                 "--replicas", "0", "--s3-endpoint", ENDPOINT, "--s3-secret", "store-keys",
                 "--service-account", "serving.sa"]) == 0
    found = documents(capsys.readouterr().out)
    pv, deployment = found["PersistentVolume"], found["Deployment"]
    for document in found.values():
        validate_object(document)
    pod = deployment["spec"]["template"]["spec"]
    # scaled to zero
    assert deployment["metadata"]["name"] == "qwen3-spec" and deployment["spec"]["replicas"] == 0
    assert {c["image"] for c in [*pod["containers"], *pod["initContainers"]]} == \
        {"123.dkr.ecr/fusedspec:neuron"}
    assert pod["nodeSelector"] == {"pool": "trn2-serving", "zone": "a"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "inference",
                                   "effect": "NoSchedule"}]
    [init] = pod["initContainers"]
    assert "--quick" not in init["command"]  # --full-verify re-hashes every byte
    assert init["command"][init["command"].index("--mount") + 1] == f"/models/{result.key}"
    assert init["envFrom"] == [{"secretRef": {"name": "store-keys"}}] and \
        pod["serviceAccountName"] == "serving.sa"
    assert "region eu-west-1" in pv["spec"]["mountOptions"]
    assert f"endpoint-url {ENDPOINT}" in pv["spec"]["mountOptions"]
    assert main(["k8s", result.version_uri, "--no-node-selector", "--no-toleration", "--s3-endpoint",
                 ENDPOINT]) == 0
    pod = documents(capsys.readouterr().out)["Deployment"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    # The same version in another namespace gets a volume of its own (a PV binds one claim).
    assert main(["k8s", result.version_uri, "--s3-endpoint", ENDPOINT, "--namespace", "other"]) == 0
    other = documents(capsys.readouterr().out)["PersistentVolume"]
    assert other["metadata"]["name"] != pv["metadata"]["name"] and "other" in other["metadata"]["name"]
    assert other["spec"]["csi"]["volumeHandle"] != pv["spec"]["csi"]["volumeHandle"]


@pytest.mark.parametrize("argv, words", [
    (["--node-selector", "instance-type"], "expected KEY=VALUE"),
    (["--toleration", "aws.amazon.com/neuron:Sometimes"], "expected KEY[=VALUE]:EFFECT"),
    (["--node-selector", "a=b", "--no-node-selector"], "not both"),
    (["--replicas", "-1"], "replicas=-1 must be 0 or a positive integer"),
    (["--image", "Fusedspec:CPU latest"], "is not an image reference"),
    (["--service-account", "Serving_SA"], "service account 'Serving_SA' is not a DNS-1123 subdomain"),
    (["--region", "us east 1"], "region 'us east 1' is not a region name"),
    (["--s3-endpoint", "ftp://store"], "--s3-endpoint"),
    (["--s3-endpoint", "http://key:secret@store:8333"], "carries a user name or password"),
    (["--port", "70000"], "port=70000 must be between 1 and 65535"),
    (["--mount-root", "relative/dir"], "must be an absolute directory"),
    (["--namespace", "Serving_NS"], "is not a DNS-1123 label"),
    (["--node-selector", "bad key=x"], "is not a label key"),
])
def test_bad_options_are_refused_naming_them(published: Any, seaweed, capsys, monkeypatch,  # noqa: ANN001
                                             argv: list[str], words: str) -> None:
    _root, _artifact, result = published
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    endpoint = [] if "--s3-endpoint" in argv else ["--s3-endpoint", ENDPOINT]
    assert main(["k8s", result.version_uri, *endpoint, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "secret@" not in err, err


def test_this_hosts_loopback_is_never_the_pods_endpoint(
        published: Any, seaweed, capsys, monkeypatch) -> None:  # noqa: ANN001
    _root, _artifact, result = published
    # this host reads the store on 127.0.0.1
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    assert main(["k8s", result.version_uri]) == 2
    assert "this host's own loopback, which no pod can reach: give --s3-endpoint URL" in \
        capsys.readouterr().err


def test_a_same_size_tampered_weight_object_stops_the_vllm_pods_init_container_reading_no_byte(
        seaweed, s3_bucket: str, s3_settings: Settings, neuron_artifact_factory,  # noqa: ANN001
        keys: tuple[str, str], s3_mount, api_calls: list[tuple[str, str]], opened_files,  # noqa: ANN001
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25, must-show 1, for the vLLM pod, where no fusedspec code reads the weights: a weight object
    overwritten in the bucket with other bytes of the same size and ETag stops the init container's command
    as `fusedspec k8s` prints it, naming the file, from the store's own checksums (HEAD): not a byte of a
    version file but its manifest is read, through the S3 API or the mount (the cpu pod:
    tests/test_serve_trust.py)."""
    weight = "weights/tp1_sharded_checkpoint.safetensors"
    artifact = neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=301)
    rest = (artifact / weight).read_bytes()[128:]
    (artifact / weight).write_bytes(MD5_TWINS[0] + rest)  # published with one twin, tampered with the other
    vouch_again(artifact)
    signed = replace(s3_settings, signing_key=keys[0])
    result = publish_artifact(artifact, f"s3://{s3_bucket}/tampered", signed)
    version = result.version_uri[len(f"s3://{s3_bucket}/"):]
    client, key = seaweed.client(), f"{version}/{result.attempt}/{weight}"
    published = client.head_object(Bucket=s3_bucket, Key=key)
    client.put_object(Bucket=s3_bucket, Key=key, Body=MD5_TWINS[1] + rest, ChecksumAlgorithm="SHA256")
    tampered = client.head_object(Bucket=s3_bucket, Key=key)
    assert (tampered["ETag"], tampered["ContentLength"]) == (published["ETag"], published["ContentLength"])

    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)  # this host reads the store
    monkeypatch.setenv("FUSEDSPEC_VERIFY_KEY", keys[1])  # `fusedspec k8s` needs it for model.pt (native code)
    assert main(["k8s", result.version_uri, "--s3-endpoint", seaweed.endpoint, "--mount-root",
                 str(tmp_path / "mdl")]) == 0
    found = documents(capsys.readouterr().out)
    pod = found["Deployment"]["spec"]["template"]["spec"]
    [init], [vllm] = pod["initContainers"], pod["containers"]
    assert vllm["command"] == ["vllm"] and init["command"][:2] == ["fusedspec", "verify"]
    mount = Path(next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "artifact"))
    prefix = next(o for o in found["PersistentVolume"]["spec"]["mountOptions"] if o.startswith("prefix "))
    s3_mount(s3_bucket, prefix[len("prefix "):], mount)
    for variable in init["env"]:  # its verify key, endpoint and region; its scratch dirs are the pod's /tmp
        if variable not in WRITABLE_ENV:
            monkeypatch.setenv(variable["name"], variable["value"])

    api_calls.clear()
    opened = opened_files(mount)
    assert main(init["command"][1:]) == 1
    report = json.loads(capsys.readouterr().out)
    problems = [p for p in report["problems"] if not p.startswith("runtime: ")]  # no Neuron SDK on this host
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{weight}: the store's checksum of the object is ")
    assert "overwritten after it was published" in problems[0] and report["bytes_checked"] == 0
    assert report["signer"] == key_id(load_verify_key(keys[1]))  # the YAML's key verified it first
    assert [k for op, k in api_calls if op == "GetObject" and not k.endswith("/manifest.json")] == []
    assert ("HeadObject", key) in api_calls and [Path(p).name for p in opened] == ["manifest.json"]

    # Whoever can overwrite the object can rewrite the manifest to match it: its signature no longer verifies.
    manifest = read_manifest(client, result.version_uri)
    digest = hashlib.sha256(MD5_TWINS[1] + rest).hexdigest()
    manifest["files"][weight].update(sha256=digest, checksum=full_object_checksum(digest))
    client.put_object(Bucket=s3_bucket, Key=f"{version}/manifest.json", Body=json.dumps(manifest).encode())
    api_calls.clear()
    assert main(init["command"][1:]) == 1
    assert json.loads(capsys.readouterr().out)["problems"] == [
        f"the manifest's signature by key {report['signer']} does not match its content: it was altered"]
    assert not any(k.startswith(f"{version}/{result.attempt}") for _, k in api_calls)  # not even a listing


def test_native_code_needs_a_verify_key_its_signature_verifies_with(
        seaweed, s3_bucket: str, s3_settings: Settings, neuron_artifact_factory,  # noqa: ANN001
        keys: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """NxDI's model.pt (and a cpu version's AOTInductor packages) run when loaded: pods load them only from a
    version whose signature verifies with their verify key, so the YAML is refused without one."""
    options = ServingOptions(s3_endpoint=ENDPOINT)
    monkeypatch.delenv("FUSEDSPEC_VERIFY_KEY", raising=False)
    unsigned = publish_artifact(neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=7),
                                f"s3://{s3_bucket}/native", s3_settings).version_uri
    with pytest.raises(ConfigError, match=r"holds native code \(model.pt\).*no verify key is configured: "
                                          "every pod would refuse it.*FUSEDSPEC_VERIFY_KEY"):
        render_k8s(unsigned, s3_settings, options)
    with pytest.raises(ConfigError, match="its pods would refuse it: the manifest is unsigned"):
        render_k8s(unsigned, s3_settings, replace(options, verify_key=keys[1]))
    other_key = generate_keys()[1]
    signed = publish_artifact(neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=8),
                              f"s3://{s3_bucket}/native",
                             replace(s3_settings, signing_key=keys[0])).version_uri
    with pytest.raises(ConfigError, match="signed by key .* not by the configured verify key"):
        render_k8s(signed, s3_settings, replace(options, verify_key=other_key))
    assert "kind: Deployment" in render_k8s(signed, s3_settings, replace(options, verify_key=keys[1]))


def test_versions_that_cannot_be_served_are_refused(seaweed, s3_bucket: str,  # noqa: ANN001
                                                    s3_settings: Settings, neuron_artifact_factory) -> None:
    root = f"s3://{s3_bucket}/refuse"
    options = ServingOptions(s3_endpoint=ENDPOINT)
    seeds = iter(range(1, 100))

    def published_with(change: Any) -> str:
        # a key of its own
        artifact = neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=next(seeds))
        change(artifact)
        return publish_artifact(artifact, root, s3_settings).version_uri

    def drop_serving(artifact: Path) -> None:  # as compiled before serving metadata was recorded
        described = json.loads((artifact / "build.json").read_text())
        del described["neuron"]["serving"]
        (artifact / "build.json").write_text(json.dumps(described))
        vouch_again(artifact)  # the gate vouches for the edited files

    with pytest.raises(ArtifactError, match="has no neuron.serving .* compile and publish it again"):
        render_k8s(published_with(drop_serving), s3_settings, options)

    def drop_draft_config(artifact: Path) -> None:  # the draft's config.json would have to come from the Hub
        (artifact / "draft" / "config.json").unlink()
        described = json.loads((artifact / "build.json").read_text())
        described["neuron"]["serving"]["model_files"]["draft"].remove("draft/config.json")
        (artifact / "build.json").write_text(json.dumps(described))
        vouch_again(artifact)  # the gate vouches for the edited files

    with pytest.raises(ArtifactError, match="would need the Hugging Face Hub for draft/config.json"):
        render_k8s(published_with(drop_draft_config), s3_settings, options)

    def garble_serving(artifact: Path) -> None:
        described = json.loads((artifact / "build.json").read_text())
        described["neuron"]["serving"].update(neuron_devices="8; rm -rf /", draft_dir="../elsewhere")
        (artifact / "build.json").write_text(json.dumps(described))
        vouch_again(artifact)  # the gate vouches for the edited files

    with pytest.raises(ArtifactError,
                       match="malformed .*neuron_devices is '8; rm -rf /'.*draft_dir '../elsewhere'"):
        render_k8s(published_with(garble_serving), s3_settings, options)
    with pytest.raises(StoreError, match="mounts S3 only"):
        render_k8s("/some/dir", s3_settings, options)
    with pytest.raises(StoreError, match="nothing to verify"):
        render_k8s(f"{root}/no/such/version", s3_settings, options)


def test_the_serving_tail_holds_for_versions_recorded_before_it_and_async_mode_reaches_vllm(
        seaweed, s3_bucket: str, s3_settings: Settings, neuron_artifact_factory,  # noqa: ANN001
        keys: tuple[str, str]) -> None:
    """Issue 26: --max-model-len comes from the version's spec (seq_len - k), whatever its build.json
    recorded; an async_mode artifact tells vLLM so in --override-neuron-config (the fork reads it there)."""
    artifact = neuron_artifact_factory(tp=4, k=5, batch=2, seq_len=512, seed=201,
                                       options={"async_mode": True})
    described = json.loads((artifact / "build.json").read_text())
    serving = described["neuron"]["serving"]
    # as recorded before the rule
    serving["max_model_len"] = serving["speculative_config"]["max_model_len"] = 512
    (artifact / "build.json").write_text(json.dumps(described))
    vouch_again(artifact)  # the gate vouches for the edited files
    version = publish_artifact(artifact, f"s3://{s3_bucket}/tail",
                               replace(s3_settings, signing_key=keys[0])).version_uri
    text = render_k8s(version, s3_settings, ServingOptions(s3_endpoint=ENDPOINT, verify_key=keys[1]))
    args = documents(text)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag(args, "--max-model-len") == "507"
    assert json.loads(flag(args, "--speculative-config"))["max_model_len"] == 507
    assert json.loads(flag(args, "--override-neuron-config")) == {"save_sharded_checkpoint": True,
                                                                  "enable_fused_speculation": True,
                                                                 "async_mode": True}


def test_cpu_yaml_runs_fusedspec_serve_after_the_same_verify_with_probes_on_its_endpoints(
        seaweed, s3_bucket: str, s3_settings: Settings, artifact_factory, capsys,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cpu version gets `fusedspec serve` from the cpu image, the same volume and init verify, and probes on
    serve's /ready and /health (tests/test_serve_pod.py runs these very commands against a real server)."""
    result = publish_artifact(artifact_factory(k=3, tp=2, weight_mib=1), f"s3://{s3_bucket}/cpu", s3_settings,
                              unvalidated=True)
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    # exported programs: no native code, no key needed
    monkeypatch.delenv("FUSEDSPEC_VERIFY_KEY", raising=False)
    assert main(["k8s", result.version_uri, "--namespace", "serving", "--port", "8080", "--s3-endpoint",
                 ENDPOINT]) == 0
    text = capsys.readouterr().out
    assert "&id" not in text and "*id" not in text
    found = documents(text)
    pv, pvc, deployment = found["PersistentVolume"], found["PersistentVolumeClaim"], found["Deployment"]
    for document in found.values():
        validate_object(document)
    assert f"prefix cpu/{result.config_path}/{result.key}/" in pv["spec"]["mountOptions"]
    assert pv["spec"]["claimRef"] == {"namespace": "serving", "name": pvc["metadata"]["name"]}

    pod = deployment["spec"]["template"]["spec"]
    [serve], [init] = pod["containers"], pod["initContainers"]
    mount = f"/var/mdl/{result.key}"
    # the Dockerfile's BASE=cpu
    assert serve["image"] == init["image"] == DEFAULT_CPU_IMAGE == "fusedspec:cpu"
    # serve hashes every file as it loads it: no second verify of its own
    assert serve["command"] == ["fusedspec", "serve", mount, "--host", "0.0.0.0", "--port", "8080"]
    assert init["command"] == ["fusedspec", "verify", result.version_uri, "--mount", mount, "--runtime-check",
                               "--json", "--quick"]
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    scratch = {"name": "scratch", "mountPath": "/tmp"}
    assert serve["volumeMounts"] == init["volumeMounts"] == [artifact_mount, scratch]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["artifact"] == {"name": "artifact",
                                   "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"],
                                                             "readOnly": True}}
    assert volumes["scratch"]["emptyDir"]["sizeLimit"].endswith("Mi")
    assert serve["securityContext"]["readOnlyRootFilesystem"] is True and \
        pod["securityContext"]["runAsNonRoot"]
    assert serve["ports"] == [{"name": "http", "containerPort": 8080}]
    for probe, path in (("startupProbe", "/ready"), ("readinessProbe", "/ready"),
                        ("livenessProbe", "/health")):
        assert serve[probe]["httpGet"] == {"path": path, "port": 8080}
    assert serve["startupProbe"]["periodSeconds"] * serve["startupProbe"]["failureThreshold"] >= 600
    # No Neuron devices, taint or instance type; memory for the weights.
    assert "aws.amazon.com/neuron" not in json.dumps(deployment)
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert serve["resources"]["requests"]["memory"] == serve["resources"]["limits"]["memory"]
    env = {e["name"]: e["value"] for e in serve["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"


def test_a_manifest_missing_fields_is_refused_naming_them(seaweed, s3_bucket: str,  # noqa: ANN001
                                                          s3_settings: Settings, qwen3_tokenizer: Path,
                                                          keys: tuple[str, str], tmp_path: Path) -> None:
    _root, _artifact, result = publish_signed(seaweed, s3_bucket, tmp_path / "neuron-artifact",
                                              qwen3_tokenizer, keys)
    client = seaweed.client()
    bucket, prefix = result.version_uri[len("s3://"):].split("/", 1)
    manifest = read_manifest(client, result.version_uri)
    del manifest["spec"], manifest["models"]
    client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=json.dumps(manifest).encode())
    options = ServingOptions(s3_endpoint=ENDPOINT)
    with pytest.raises(StoreError,
                       match="manifest.json: spec: required field is missing; models: required field"):
        render_k8s(result.version_uri, s3_settings, options)
    with pytest.raises(ConfigError, match="replicas=-1"):
        render_k8s(result.version_uri, s3_settings, replace(options, replicas=-1))


def test_validation_catches_a_misspelled_field() -> None:
    # The check above must be able to fail: a typo in a field name does not survive the round trip.
    bad = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"},
           "spec": {"accessMode": ["ReadOnlyMany"]}}
    with pytest.raises(AssertionError):
        validate_object(bad)
