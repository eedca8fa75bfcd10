"""Kubernetes objects that serve one published version, mounted read-only from S3.

    read_served_version(uri, settings)            the version (LATEST resolved), its manifest and build.json
    volume_objects(version, claim, ...)           PV + PVC on the Mountpoint S3 CSI driver (any backend)
    neuron_deployment(version, claim, options)    vLLM on Trainium: the legacy vLLM fork of Neuron SDK 2.26
    cpu_deployment(version, claim, options)       `fusedspec serve` in the cpu image (the reference backend)
    render_k8s(uri, settings, options)            the three documents as YAML; DEPLOYMENTS says which backends

The volume part knows nothing of the server: each backend's Deployment is one function in DEPLOYMENTS,
neuron_deployment (vLLM) and cpu_deployment (`fusedspec serve`).

PV (awslabs/mountpoint-s3-csi-driver, examples/kubernetes/static_provisioning at 57c6bed): driver
`s3.csi.aws.com`, static provisioning (`storageClassName: ""`, `claimRef`), `ReadOnlyMany`, and mount options
`prefix <version dir>/` (the immutable version, never LATEST), `region`, `allow-other` (the pod runs as a
non-root user, as non_root.yaml does), `read-only`, `metadata-ttl indefinite` (a version's objects never
change).

The Neuron Deployment follows the Neuron SDK 2.26 tutorial for Qwen3 fused speculation
(aws-neuron/aws-neuron-sdk libraries/nxd-inference/tutorials/sd-inference-tutorial.rst at db1586c) in the
image the Dockerfile builds (fusedspec:neuron: the SDK 2.26.1 vLLM DLC plus fusedspec), with the values the
neuron backend recorded in build.json (`neuron.serving`):
- env VLLM_USE_V1=0, VLLM_NEURON_FRAMEWORK, NEURON_LOGICAL_NC_CONFIG, and NEURON_COMPILED_ARTIFACTS = the
  mount, so the fork loads exactly this directory;
- `--override-neuron-config` (save_sharded_checkpoint, enable_fused_speculation, and async_mode when on: the
  fork sets these on the loaded config, so they repeat the artifact's own values) and `--speculative-config`
  with model, num_speculative_tokens = k, max_model_len and method;
- `--max-model-len` = seq_len - k (compile.fused_step.max_model_len), so no request makes a fused step write
  past the KV cache;
- the model, `--tokenizer` and the draft are paths on the mount: the fork reads both config.json files and the
  tokenizer before it opens NEURON_COMPILED_ARTIFACTS
  (vllm/model_executor/model_loader/neuronx_distributed.py, upstreaming-to-vllm neuron-2.24-vllm-v0.7.2 at
  490ab20, load_pretrained_config of both paths), and the artifact carries them; HF_HUB_OFFLINE=1, so a pod
  never reaches the Hugging Face Hub;
- `aws.amazon.com/neuron` devices = ceil(TP / logical cores per device at the recorded LNC), a toleration for
  the Neuron taint and a node selector for the recorded instance type (both replaceable);
- startup, readiness and liveness probes on vLLM's /health;
- an init container in the same image runs `fusedspec verify <mount> --runtime-check --quick --json`: the
  toolchain it compares is the one vLLM runs with, and it checks the manifest (its signature when a verify
  key is configured: FUSEDSPEC_VERIFY_KEY is set in the init container), every file's presence and size
  (vLLM recompiles into the read-only mount when a file is missing, which fails) without reading the tens of
  GB of weights; `full_verify` re-hashes every byte instead. The mount directory is named by the key, so
  verify also checks that the pod mounted the version the manifest describes.
The volume is the version directory: its manifest.json beside the attempt directory that holds the files
(registry.publish), so the pod's paths point into `<mount>/<attempt>`.

The cpu Deployment runs `fusedspec serve <mount> --quick` (serve/) in the cpu image the Dockerfile builds
(`--build-arg BASE=cpu`, fusedspec with the cpu extra), after the same init container. serve verifies the
mount again (sizes: the init container did the configured depth) and only then listens, so the startup probe
is on /ready; readiness is /ready, liveness /health (the engine thread runs). Memory is requested for the
weights twice over (the loaded tensors and the page cache of the mount) plus a GiB for the runtime.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import yaml

from fusedspec.compile.documents.build import BUILD_DESCRIPTION, BuildDescription
from fusedspec.compile.documents.manifest import Manifest
from fusedspec.compile.fused_step import max_model_len
from fusedspec.compile.trust import is_native
from fusedspec.core.errors import ArtifactError, ConfigError, StoreError
from fusedspec.core.settings import Settings, checked_endpoint, redact_url
from fusedspec.registry.signing import load_verify_key, signature_problem
from fusedspec.registry.store import NotFound
from fusedspec.registry.stores import open_store
from fusedspec.registry.uri import StoreURI, join_key, parse_store_uri
from fusedspec.registry.verify import resolve_version
from fusedspec.registry.versions import location_problem

# The image ./Dockerfile builds by default (`docker build -t fusedspec:neuron .`): the Neuron SDK 2.26.1 vLLM
# DLC plus fusedspec. prefect.yaml and deploy/trn2-job-template.json compile in the same image.
DEFAULT_IMAGE = "fusedspec:neuron"
# `docker build --build-arg BASE=cpu -t fusedspec:cpu .`: fusedspec with the cpu extra, for `fusedspec serve`.
DEFAULT_CPU_IMAGE = "fusedspec:cpu"
DEFAULT_MOUNT_ROOT = "/var/mdl"
NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURON_TAINT = {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH = "/health"
READY = "/ready"  # `fusedspec serve`'s readiness: loaded and its engine running
# Loading tens of GB of weights through Mountpoint and the NEFFs onto the devices takes minutes: the startup
# probe allows an hour before liveness applies.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 360
# Pods run as the image's own non-root user (the Dockerfile's `useradd --uid 10001`) on a read-only root
# filesystem; what they write goes to an emptyDir at SCRATCH_DIR (HOME, caches, the work dir, temp files).
IMAGE_UID = 10001
SCRATCH_DIR = "/tmp"
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}
SCRATCH_MOUNT = {"name": "scratch", "mountPath": SCRATCH_DIR}
WRITABLE_ENV = [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "TMPDIR", "value": SCRATCH_DIR},
                {"name": "XDG_CACHE_HOME", "value": f"{SCRATCH_DIR}/.cache"},
                {"name": "FUSEDSPEC_WORK_DIR", "value": f"{SCRATCH_DIR}/fusedspec"}]
# Neuron pods, per version: memory = weights + /dev/shm + runtime; CPU per Neuron device (a rule of thumb, not
# measured here: no Trainium host). /dev/shm is bounded: vLLM's workers share small buffers there, and an
# unbounded memory emptyDir can take the node's memory.
NEURON_SHM_MIB = 2048
NEURON_RUNTIME_MIB = 8192
NEURON_CPUS_PER_DEVICE = 4
NEURON_SCRATCH_MIB = 4096
SERVING_FIELDS = ("env", "tensor_parallel_size", "max_model_len", "max_num_seqs", "dtype",
                  "override_neuron_config", "speculative_config", "instance_type", "neuron_devices",
                  "draft_dir", "model_files")


@dataclass(frozen=True)
class ServedVersion:
    """One published version as a pod sees it: the version directory (manifest.json and the attempt
    directory holding the files) is what the volume mounts."""

    bucket: str
    prefix: str  # the version directory's key prefix in the bucket, no trailing slash
    manifest: Manifest
    build: BuildDescription  # the version's build.json

    @property
    def key(self) -> str:
        return self.manifest.key

    @property
    def backend(self) -> str:
        return self.manifest.backend

    @property
    def spec(self) -> dict[str, Any]:
        return self.manifest.spec.to_json()

    def files_in(self, mount: str) -> str:
        """Where the version's files are once its directory is mounted at `mount`."""
        return f"{mount}/{self.manifest.attempt}"


IMAGE_REFERENCE = re.compile(r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"
                             r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
                             r"(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                             r"(?:@sha256:[a-f0-9]{64})?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$")  # us-east-1, eu-central-2, us-gov-west-1


@dataclass(frozen=True)
class ServingOptions:
    name: str | None = None  # base name of the objects; default from TP, k and the key
    namespace: str = "default"
    image: str | None = None  # None: the backend's image (DEFAULT_IMAGE, DEFAULT_CPU_IMAGE)
    region: str | None = None  # bucket region for Mountpoint; default AWS_REGION, else us-east-1
    mount_root: str = DEFAULT_MOUNT_ROOT  # the version is mounted at <mount_root>/<key>
    replicas: int = 1  # 0 is allowed (Kubernetes scales a Deployment to zero)
    port: int = 8000
    service_account: str | None = None
    node_selector: dict[str, str] | None = None  # None: the recorded instance type
    tolerations: list[dict[str, str]] | None = None  # None: the Neuron taint
    full_verify: bool = False  # the init container re-hashes every byte instead of the store's checksums
    verify_key: str | None = None  # Ed25519 public key: the init container refuses versions not signed by it
    # the endpoint as the cluster reaches it; None: AWS, or a non-loopback one in use
    s3_endpoint: str | None = None
    s3_secret: str | None = None  # a Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for the init check
    extra_labels: dict[str, str] = field(default_factory=dict)

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool) or self.replicas < 0:
            found.append(f"replicas={self.replicas!r} must be 0 or a positive integer")
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            found.append(f"port={self.port!r} must be between 1 and 65535")
        root = PurePosixPath(self.mount_root)
        if not root.is_absolute() or ".." in root.parts or str(root) == "/":
            found.append(f"mount root {self.mount_root!r} must be an absolute directory other than /")
        if self.image is not None and (len(self.image) > 255 or not IMAGE_REFERENCE.match(self.image)):
            found.append(f"image {self.image!r} is not an image reference "
                         "(REGISTRY/NAME[:TAG][@sha256:DIGEST], lowercase, e.g. "
                         "123456789012.dkr.ecr.us-east-1.amazonaws.com/fusedspec:cpu)")
        if self.service_account is not None and (len(self.service_account) > 253
                                                 or not DNS_SUBDOMAIN.match(self.service_account)):
            found.append(f"service account {self.service_account!r} is not a DNS-1123 subdomain (lowercase "
                         "letters, digits, '-' and '.')")
        if self.region is not None and not REGION.match(self.region):
            found.append(f"region {self.region!r} is not a region name like us-east-1")
        if self.s3_secret is not None and (len(self.s3_secret) > 253
                                           or not DNS_SUBDOMAIN.match(self.s3_secret)):
            found.append(f"S3 credentials secret {self.s3_secret!r} is not a DNS-1123 subdomain")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace) or len(self.namespace) > 63:
            found.append(f"namespace {self.namespace!r} is not a DNS-1123 label")
        for key, value in (self.node_selector or {}).items():
            if not key or not re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]", key):
                found.append(f"node selector key {key!r} is not a label key")
            if len(value) > 63 or not re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value):
                found.append(f"node selector value {value!r} is not a label value")
        for toleration in self.tolerations or []:
            if toleration.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                found.append(f"toleration {toleration} needs an effect of NoSchedule, PreferNoSchedule or "
                             "NoExecute")
        return found


def dns_name(text: str, limit: int = 63) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:limit].rstrip("-") or "fusedspec"


# ---- reading the version -----------------------------------------------------------------------------------


def s3_uri(uri: str) -> StoreURI:
    """`uri` parsed, or StoreError when it is not on S3, the one store a pod's volume can mount."""
    parsed = parse_store_uri(uri)
    if parsed.scheme != "s3":
        raise StoreError(f"{uri}: the Mountpoint S3 CSI driver mounts S3 only; give the s3:// URI of a "
                         "version")
    return parsed


def read_served_version(uri: str, settings: Settings) -> ServedVersion:
    """The version at an s3:// version or config URI (LATEST resolved to a fixed version), or an InputError
    naming what is missing."""
    parsed = s3_uri(uri)
    store, version, manifest, problems, _ = resolve_version(open_store(parsed, settings))
    if manifest is None:
        raise StoreError(f"{store.describe(version)}: {'; '.join(problems)}")
    misplaced = location_problem(store.describe(version), manifest)
    if misplaced:
        raise StoreError(f"{store.describe(version)}: {misplaced}; publish this config's own build")
    if BUILD_DESCRIPTION not in manifest.files:
        raise ArtifactError(f"{store.describe(version)}: the manifest lists no {BUILD_DESCRIPTION}; publish "
                            "the artifact again")
    build_key = join_key(version, manifest.attempt, BUILD_DESCRIPTION)
    try:
        build = BuildDescription.parse_bytes(store.get(build_key), store.describe(build_key))
    except NotFound:
        raise ArtifactError(f"{store.describe(version)}: {BUILD_DESCRIPTION} is listed but missing; "
                            f"`fusedspec verify {store.describe(version)}` says what else is") from None
    assert store.uri.bucket is not None
    return ServedVersion(bucket=store.uri.bucket, prefix=join_key(store.uri.prefix, version),
                         manifest=manifest, build=build)


# ---- the volume: any backend -------------------------------------------------------------------------------


def volume_objects(version: ServedVersion, base: str, namespace: str, region: str,
                   endpoint_url: str | None, labels: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A static PV on the Mountpoint S3 CSI driver for exactly the version's prefix, and its PVC. A PV is
    cluster-wide and binds one claim, so its name (and the driver's volumeHandle, unique per PV) carries the
    namespace: one version served in two namespaces gets two volumes."""
    pv_name, pvc_name = f"{base}-{namespace}-pv", f"{base}-pvc"
    total = version.manifest.total_bytes()
    storage = f"{max(1, math.ceil(total / 2**30))}Gi"  # required by the API; the driver ignores it
    mount_options = [f"region {region}", f"prefix {version.prefix}/", "allow-other", "read-only",
                     "metadata-ttl indefinite"]
    if endpoint_url:  # a non-AWS endpoint (SeaweedFS, MinIO) needs its URL and path style
        mount_options += [f"endpoint-url {endpoint_url}", "force-path-style"]
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": labels},
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": namespace, "name": pvc_name},
            "mountOptions": mount_options,
            "csi": {"driver": "s3.csi.aws.com", "volumeHandle": pv_name,
                    "volumeAttributes": {"bucketName": version.bucket}},
        },
    }
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name, "namespace": namespace, "labels": labels},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": storage}}, "volumeName": pv_name},
    }
    return pv, pvc


# ---- the Neuron Deployment ---------------------------------------------------------------------------------


def neuron_serving(version: ServedVersion) -> dict[str, Any]:
    """build.json's `neuron.serving`, checked against the manifest, or ArtifactError saying what is
    missing."""
    serving = (version.build.neuron or {}).get("serving")
    if not isinstance(serving, dict):
        raise ArtifactError(f"version {version.key}: its {BUILD_DESCRIPTION} has no neuron.serving (compiled "
                            "by a fusedspec that did not record how to serve it); compile and publish it "
                            "again")
    missing = [name for name in SERVING_FIELDS if name not in serving]
    if missing:
        raise ArtifactError(f"version {version.key}: neuron.serving in {BUILD_DESCRIPTION} lacks "
                            f"{', '.join(missing)}; compile and publish it again")
    malformed = _malformed_serving(serving)
    if malformed:
        raise ArtifactError(f"version {version.key}: neuron.serving in {BUILD_DESCRIPTION} is malformed "
                            f"({'; '.join(malformed)}); compile and publish it again")
    files = version.manifest.files
    needed = [*serving["model_files"].get("target", []), *serving["model_files"].get("draft", [])]
    absent = [name for name in needed if name not in files]
    for name, role in (("config.json", "target"), (f"{serving['draft_dir']}/config.json", "draft")):
        if name not in needed:
            absent.append(f"{name} (the {role}'s config)")
    if absent:
        raise ArtifactError(f"version {version.key}: the pod would need the Hugging Face Hub for "
                            f"{', '.join(absent)}, which the version does not carry; compile and publish it "
                            "again")
    return serving


def _malformed_serving(serving: dict[str, Any]) -> list[str]:
    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    found = [f"{name} is {serving[name]!r}, not a positive integer"
             for name in ("tensor_parallel_size", "max_model_len", "max_num_seqs", "neuron_devices")
             if not positive(serving[name])]
    for name in ("env", "override_neuron_config", "speculative_config", "model_files"):
        if not isinstance(serving[name], dict):
            found.append(f"{name} is not a mapping")
    if isinstance(serving["model_files"], dict) and not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v)
            for v in serving["model_files"].values()):
        found.append("model_files holds something other than lists of paths")
    draft_dir = serving["draft_dir"]
    if (not isinstance(draft_dir, str) or not draft_dir or draft_dir.startswith("/")
            or ".." in draft_dir.split("/")):
        found.append(f"draft_dir {draft_dir!r} is not a relative directory")
    return found


def neuron_deployment(version: ServedVersion, claim: str, base: str, labels: dict[str, str],
                      options: ServingOptions) -> dict[str, Any]:
    serving = neuron_serving(version)
    mount = f"{options.mount_root.rstrip('/')}/{version.key}"
    files = version.files_in(mount)
    target = version.manifest.models.target
    served_name = target.repo_id or PurePosixPath(target.ref).name
    # The longest request keeps k positions of NxDI's seq_len-long KV cache free, so no fused step writes past
    # it (compile.fused_step: NxDI's model_wrapper.py needs L + k <= seq_len for a step at L tokens, and its
    # own loop stops when k or fewer remain). Computed from the version's spec, not build.json, so a version
    # compiled before the rule is served with it too.
    longest = max_model_len(version.manifest.spec.seq_len, version.manifest.spec.k)
    speculative = {"model": f"{files}/{serving['draft_dir']}", **serving["speculative_config"],
                   "max_model_len": longest}
    args = ["serve", files, "--tokenizer", files, "--served-model-name", served_name,
            "--tensor-parallel-size", str(serving["tensor_parallel_size"]),
            "--max-model-len", str(longest),
            "--max-num-seqs", str(serving["max_num_seqs"]),
            "--dtype", str(serving["dtype"]),
            "--override-neuron-config", json.dumps(serving["override_neuron_config"], separators=(",", ":")),
            "--speculative-config", json.dumps(speculative, separators=(",", ":")),
            "--port", str(options.port)]
    env = [{"name": str(k), "value": str(v)} for k, v in serving["env"].items()]
    env += [{"name": "NEURON_COMPILED_ARTIFACTS", "value": files},
            {"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"}]
    env += [*WRITABLE_ENV,
            {"name": "NEURON_COMPILE_CACHE_URL", "value": f"{SCRATCH_DIR}/neuron-compile-cache"}]
    devices = int(serving["neuron_devices"])
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    image = options.image or DEFAULT_IMAGE
    # Host memory: the sharded checkpoint passes through it on its way to the devices, /dev/shm is memory
    # too, plus the runtime. CPU: vLLM's scheduler and tokenizer, NxDI's loading threads, per device.
    memory = f"{math.ceil(version.manifest.total_bytes() / 2**20) + NEURON_SHM_MIB + NEURON_RUNTIME_MIB}Mi"
    resources = {"requests": {NEURON_RESOURCE: str(devices), "cpu": str(NEURON_CPUS_PER_DEVICE * devices),
                              "memory": memory},
                 "limits": {NEURON_RESOURCE: str(devices), "memory": memory}}

    pod: dict[str, Any] = {
        "securityContext": dict(POD_SECURITY),
        "initContainers": [verify_container(image, version, mount, options, artifact_mount)],
        "containers": [{
            "name": "vllm",
            "image": image,
            "command": ["vllm"],
            "args": args,
            "env": env,
            "ports": [{"name": "http", "containerPort": options.port}],
            "resources": resources,
            "securityContext": dict(CONTAINER_SECURITY),
            "volumeMounts": [artifact_mount, {"name": "dshm", "mountPath": "/dev/shm"}, dict(SCRATCH_MOUNT)],
            "startupProbe": http_probe(HEALTH, options.port, STARTUP_PERIOD_S, STARTUP_FAILURES),
            "readinessProbe": http_probe(HEALTH, options.port, 10, 3),
            "livenessProbe": http_probe(HEALTH, options.port, 30, 4),
        }],
        "volumes": [{"name": "artifact", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{NEURON_SHM_MIB}Mi"}},
                    scratch_volume(NEURON_SCRATCH_MIB)],
        "nodeSelector": ({INSTANCE_TYPE_LABEL: str(serving["instance_type"])} if options.node_selector is None
                         else dict(options.node_selector)),
        "tolerations": ([dict(NEURON_TAINT)] if options.tolerations is None
                        else [dict(t) for t in options.tolerations]),
    }
    if not pod["nodeSelector"]:
        del pod["nodeSelector"]
    if not pod["tolerations"]:
        del pod["tolerations"]
    return deployment(pod, base, labels, options)


def cpu_deployment(version: ServedVersion, claim: str, base: str, labels: dict[str, str],
                   options: ServingOptions) -> dict[str, Any]:
    """`fusedspec serve` of the mounted version, from the cpu image, after the init container's verify."""
    mount = f"{options.mount_root.rstrip('/')}/{version.key}"
    image = options.image or DEFAULT_CPU_IMAGE
    artifact_mount = {"name": "artifact", "mountPath": mount, "readOnly": True}
    # the loaded tensors and the mount's page cache, plus a GiB for the runtime
    memory = f"{math.ceil(2 * version.manifest.total_bytes() / 2**20) + 1024}Mi"
    # scratch: the private copies serve loads from (AOTInductor packages and the tokenizer: every file but the
    # weights), each extracted once more by torch, and a margin
    copies = sum(e.size for name, e in version.manifest.files.items() if not name.startswith("weights/"))
    scratch_mib = math.ceil(3 * copies / 2**20) + 512

    pod: dict[str, Any] = {
        "securityContext": dict(POD_SECURITY),
        "initContainers": [verify_container(image, version, mount, options, artifact_mount)],
        "containers": [{
            "name": "serve",
            "image": image,
            "command": ["fusedspec", "serve", mount, "--host", "0.0.0.0", "--port", str(options.port)],
            "env": [*verify_env(options), *WRITABLE_ENV, {"name": "HF_HUB_OFFLINE", "value": "1"},
                    {"name": "TRANSFORMERS_OFFLINE", "value": "1"}],
            "ports": [{"name": "http", "containerPort": options.port}],
            "resources": {"requests": {"cpu": "2", "memory": memory}, "limits": {"memory": memory}},
            "securityContext": dict(CONTAINER_SECURITY),
            "volumeMounts": [artifact_mount, dict(SCRATCH_MOUNT)],
            # serve listens once checked and loaded: until then the startup probe waits (10 minutes)
            "startupProbe": http_probe(READY, options.port, 5, 120),
            "readinessProbe": http_probe(READY, options.port, 5, 3),
            "livenessProbe": http_probe(HEALTH, options.port, 15, 4),
        }],
        "volumes": [{"name": "artifact", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
                    scratch_volume(scratch_mib)],
    }
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod["tolerations"] = [dict(t) for t in options.tolerations]
    return deployment(pod, base, labels, options)


def deployment(pod: dict[str, Any], base: str, labels: dict[str, str],
               options: ServingOptions) -> dict[str, Any]:
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": base, "namespace": options.namespace, "labels": labels},
        "spec": {"replicas": options.replicas,
                 "selector": {"matchLabels": {"app.kubernetes.io/instance": base}},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def verify_container(image: str, version: ServedVersion, mount: str, options: ServingOptions,
                     artifact_mount: dict[str, Any]) -> dict[str, Any]:
    """The init container, in the serving image (its toolchain is the one checked): `fusedspec verify` of the
    version through the S3 API (manifest, signature with a verify key, sizes, etags and the server's
    checksums: no byte read; --full-verify reads every byte) and of the mount (this manifest, these files)."""
    verify = ["fusedspec", "verify", f"s3://{version.bucket}/{version.prefix}", "--mount", mount,
              "--runtime-check", "--json"] + ([] if options.full_verify else ["--quick"])
    container: dict[str, Any] = {
        "name": "verify-artifact", "image": image, "command": verify,
        "env": [*verify_env(options), *store_env(options), *WRITABLE_ENV],
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [artifact_mount, dict(SCRATCH_MOUNT)]}
    if options.s3_secret:
        container["envFrom"] = [{"secretRef": {"name": options.s3_secret}}]
    return container


def verify_env(options: ServingOptions) -> list[dict[str, str]]:
    """The verify key, when versions must be signed (it is public)."""
    return [{"name": "FUSEDSPEC_VERIFY_KEY", "value": options.verify_key}] if options.verify_key else []


def store_env(options: ServingOptions) -> list[dict[str, str]]:
    """Where the init container reaches the store: the endpoint (as the cluster reaches it) and region.
    Credentials come from the pod's service account (IRSA, Pod Identity) or --s3-secret, never the YAML."""
    env = [{"name": "AWS_REGION", "value": str(options.region)}]
    if options.s3_endpoint:
        env.append({"name": "FUSEDSPEC_S3_ENDPOINT_URL", "value": options.s3_endpoint})
    return env


def scratch_volume(size_mib: int) -> dict[str, Any]:
    return {"name": "scratch", "emptyDir": {"sizeLimit": f"{size_mib}Mi"}}


def service(base: str, labels: dict[str, str], options: ServingOptions) -> dict[str, Any]:
    """A ClusterIP Service in front of the Deployment's pods (ready ones only: the readiness probe)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": base, "namespace": options.namespace, "labels": labels},
            "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/instance": base},
                     "ports": [{"name": "http", "port": options.port, "targetPort": "http",
                                "protocol": "TCP"}]}}


# One Deployment kind per backend whose artifacts can be served; each takes (version, claim, base, labels,
# options).
DEPLOYMENTS: dict[str, Callable[[ServedVersion, str, str, dict[str, str], ServingOptions],
                                dict[str, Any]]] = {
    "neuron": neuron_deployment,
    "cpu": cpu_deployment,
}


def render_k8s(uri: str, settings: Settings, options: ServingOptions | None = None) -> str:
    """PV, PVC, Service and Deployment YAML (four documents) for the version at `uri` (or its LATEST)."""
    s3_uri(uri)  # before the endpoint rules below: a directory has no endpoint to judge
    options = options or ServingOptions()
    if options.verify_key is None and settings.verify_key:
        options = replace(options, verify_key=settings.verify_key)
    options = replace(options, region=options.region or settings.aws_region or "us-east-1",
                      s3_endpoint=cluster_endpoint(options.s3_endpoint, settings.s3_endpoint_url))
    problems = options.problems()
    if problems:
        raise ConfigError("; ".join(problems))  # the CLI says which command
    version = read_served_version(uri, settings)
    deployment_for = DEPLOYMENTS.get(version.backend)
    if deployment_for is None:
        raise ArtifactError(f"version {version.key} was built by the {version.backend!r} backend; "
                            f"`fusedspec k8s` renders a Deployment for {', '.join(DEPLOYMENTS)} artifacts")
    spec = version.spec
    base = dns_name(options.name
                    or f"fusedspec-{spec['tp_degree']}tp-k{spec['speculation_length']}-{version.key[:8]}", 50)
    labels = {"app.kubernetes.io/name": "fusedspec", "app.kubernetes.io/instance": base,
              "fusedspec/key": version.key[:63], "fusedspec/backend": version.backend, **options.extra_labels}
    assert options.region is not None
    pv, pvc = volume_objects(version, base, options.namespace, options.region, options.s3_endpoint, labels)
    deployment = deployment_for(version, pvc["metadata"]["name"], base, labels, options)
    refused = native_code_problem(version, options)  # after the version's own problems, which say more
    if refused:
        raise ConfigError(refused)
    return yaml.dump_all([pv, pvc, service(base, labels, options), deployment], Dumper=_PlainDumper,
                         sort_keys=False)


def cluster_endpoint(given: str | None, in_use: str | None) -> str | None:
    """The S3 endpoint pods use: `--s3-endpoint`, else the one this host used unless it is this host's own
    loopback (a pod reaching 127.0.0.1 reaches itself), else None (AWS S3)."""
    if given:
        return checked_endpoint("--s3-endpoint", given)
    if not in_use:
        return None
    host = urlsplit(in_use).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback or host in ("0.0.0.0", "::")
    except ValueError:
        loopback = host.endswith(".localhost")
    if loopback:
        raise ConfigError(f"the version was read through {redact_url(in_use)}, this host's own loopback, "
                          "which no pod can reach: give --s3-endpoint URL, the endpoint as the cluster "
                          "reaches it (e.g. http://seaweedfs-s3.storage.svc:8333), or "
                          "https://s3.REGION.amazonaws.com for AWS")
    return in_use


def native_code_problem(version: ServedVersion, options: ServingOptions) -> str | None:
    """Why pods would refuse to run this version's native code, or None. AOTInductor packages (cpu) and
    NxDI's model.pt (neuron) run when loaded, so a pod loads them only from a version whose signature
    verifies with its verify key (compile.trust): without one, every pod would refuse it."""
    native = sorted(name for name in version.manifest.files if is_native(name))
    if not native:
        return None
    what = f"version {version.key[:12]} holds native code ({native[0]}{', ...' if len(native) > 1 else ''})"
    if not options.verify_key:
        return (f"{what}, which pods load only from a version whose signature verifies with their verify "
                "key, and no verify key is configured: every pod would refuse it. Set "
                "FUSEDSPEC_VERIFY_KEY[_FILE] to the publisher's public key (`fusedspec keygen`; publish with "
                "FUSEDSPEC_SIGNING_KEY), or publish a build with compile option aot_inductor: false (cpu)")
    problem = signature_problem(version.manifest, load_verify_key(options.verify_key))
    if problem:
        return f"{what}, and its pods would refuse it: {problem}"
    return None


class _PlainDumper(yaml.SafeDumper):
    """Writes a repeated object (the labels, the volume mount) out in full instead of as a YAML alias, so
    the output reads and diffs like hand-written manifests."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def http_probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    """A startup, readiness or liveness probe: GET `path` every `period` seconds, failed after `failures`."""
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}
