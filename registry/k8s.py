"""Kubernetes objects that serve one published version: a static PV + PVC on the Mountpoint S3 CSI driver
and a vLLM Deployment for Neuron that loads the compiled artifact from that mount.

- PV: driver `s3.csi.aws.com`, static provisioning (`storageClassName: ""`), `ReadOnlyMany`, and
  mount options `prefix <version dir>/` (the immutable version, never LATEST), `region`, `allow-other`,
  `read-only`, `metadata-ttl indefinite` (objects of a version never change, so cache them forever).
- Deployment: `NEURON_COMPILED_ARTIFACTS` = the mount, so vLLM loads exactly this directory; and
  `--speculative-config` with `num_speculative_tokens` = k (NxDI's speculation_length), TP, max model
  length and max sequences from the manifest's build spec. An init container runs
  `fusedspec verify <version> --json` first: vLLM recompiles when an artifact is incomplete, and that
  fails on a read-only mount, so a bad version must stop the pod before the server starts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from compile.errors import StoreError
from compile.settings import Settings
from registry.stores import open_store
from registry.uri import join_key, parse_store_uri
from registry.verify import resolve_version

# The legacy vLLM fork serves draft-model fused speculation (see shared/reference/nxdi.md).
DEFAULT_VLLM_IMAGE = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04"
DEFAULT_VERIFY_IMAGE = "fusedspec-worker:latest"  # the project's Dockerfile (CPU base is enough to verify)
DEFAULT_MOUNT = "/var/mdl"
NEURON_RESOURCE = "aws.amazon.com/neuron"


def dns_name(text: str, limit: int = 63) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:limit].rstrip("-") or "fusedspec"


def _model_name(model: dict[str, Any]) -> str:
    return str(model.get("repo_id") or model.get("ref"))


def render_k8s(
    uri: str,
    settings: Settings,
    *,
    name: str | None = None,
    namespace: str = "default",
    image: str = DEFAULT_VLLM_IMAGE,
    verify_image: str = DEFAULT_VERIFY_IMAGE,
    region: str | None = None,
    mount_path: str = DEFAULT_MOUNT,
    replicas: int = 1,
    cores_per_device: int = 4,
    port: int = 8000,
    service_account: str | None = None,
) -> str:
    """PV, PVC and Deployment YAML (three documents) for the version at `uri` (or the one its LATEST names).

    `cores_per_device`: logical NeuronCores per Neuron device (4 on trn2 with LNC=2, 2 on trn1); the pod
    asks for ceil(TP / cores_per_device) devices.
    """
    parsed = parse_store_uri(uri)
    if parsed.scheme != "s3":
        raise StoreError(f"{uri}: the Mountpoint S3 CSI driver mounts S3 only; give the s3:// URI of a version")
    store = open_store(parsed, settings)
    store, version, found, problems, _ = resolve_version(store)
    if found is None:
        raise StoreError(f"{store.describe(version)}: {'; '.join(problems)}")
    manifest = found.model_dump(mode="json")
    spec, key = manifest["spec"], str(manifest["key"])
    version_prefix = join_key(parsed.prefix, version)
    version_uri = f"s3://{parsed.bucket}/{version_prefix}"
    region = region or settings.aws_region or "us-east-1"
    base = dns_name(name or f"fusedspec-{spec['tp_degree']}tp-k{spec['speculation_length']}-{key[:8]}", 50)
    pv_name, pvc_name = f"{base}-pv", f"{base}-pvc"
    total = sum(int(f["size"]) for f in manifest["files"].values())
    storage = f"{max(1, math.ceil(total / 2**30))}Gi"  # required by the API; the driver ignores it
    labels = {"app.kubernetes.io/name": "fusedspec", "app.kubernetes.io/instance": base,
              "fusedspec/key": key[:63]}

    mount_options = [f"region {region}", f"prefix {version_prefix}/", "allow-other", "read-only",
                     "metadata-ttl indefinite"]
    if settings.s3_endpoint_url:  # a non-AWS endpoint (SeaweedFS, MinIO) needs its URL and path style
        mount_options += [f"endpoint-url {settings.s3_endpoint_url}", "force-path-style"]
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
            "csi": {"driver": "s3.csi.aws.com", "volumeHandle": dns_name(f"{parsed.bucket}-{key}", 128),
                    "volumeAttributes": {"bucketName": str(parsed.bucket)}},
        },
    }
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name, "namespace": namespace, "labels": labels},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": storage}}, "volumeName": pv_name},
    }
    deployment = _deployment(manifest, base, namespace, labels, pvc_name, version_uri, image=image,
                             verify_image=verify_image, region=region, mount_path=mount_path, replicas=replicas,
                             cores_per_device=cores_per_device, port=port, service_account=service_account,
                             endpoint_url=settings.s3_endpoint_url)
    return yaml.safe_dump_all([pv, pvc, deployment], sort_keys=False)


def _deployment(manifest: dict[str, Any], base: str, namespace: str, labels: dict[str, str], pvc_name: str,
                version_uri: str, *, image: str, verify_image: str, region: str, mount_path: str, replicas: int,
                cores_per_device: int, port: int, service_account: str | None,
                endpoint_url: str | None) -> dict[str, Any]:
    spec = manifest["spec"]
    target, draft = manifest["models"]["target"], manifest["models"]["draft"]
    speculative = {"model": _model_name(draft), "num_speculative_tokens": spec["speculation_length"]}
    if draft.get("commit"):
        speculative["revision"] = draft["commit"]
    args = ["serve", _model_name(target),
            "--tensor-parallel-size", str(spec["tp_degree"]),
            "--max-model-len", str(spec["seq_len"]),
            "--max-num-seqs", str(spec["batch_size"]),
            "--speculative-config", json.dumps(speculative, separators=(",", ":")),
            "--port", str(port)]
    if target.get("commit"):
        args[2:2] = ["--revision", str(target["commit"])]
    devices = max(1, math.ceil(spec["tp_degree"] / cores_per_device))
    verify_env = [{"name": "AWS_REGION", "value": region}]
    if endpoint_url:
        verify_env.append({"name": "FUSEDSPEC_S3_ENDPOINT_URL", "value": endpoint_url})
    pod: dict[str, Any] = {
        "initContainers": [{
            "name": "verify-artifact",
            "image": verify_image,
            "command": ["fusedspec", "verify", version_uri, "--json"],
            "env": verify_env,
        }],
        "containers": [{
            "name": "vllm",
            "image": image,
            "command": ["vllm"],
            "args": args,
            "env": [{"name": "NEURON_COMPILED_ARTIFACTS", "value": f"{mount_path}/{manifest['attempt']}"}],
            "ports": [{"name": "http", "containerPort": port}],
            "resources": {"requests": {NEURON_RESOURCE: str(devices)}, "limits": {NEURON_RESOURCE: str(devices)}},
            "volumeMounts": [{"name": "artifact", "mountPath": mount_path, "readOnly": True},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10},
        }],
        "volumes": [{"name": "artifact", "persistentVolumeClaim": {"claimName": pvc_name, "readOnly": True}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if service_account:
        pod["serviceAccountName"] = service_account
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": base, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app.kubernetes.io/instance": base}},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
