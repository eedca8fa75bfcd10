"""`fusedspec k8s URI [options]`: print PV, PVC and vLLM Deployment YAML that serve one published version.

URI is an s3:// version or config path (its LATEST is resolved to a fixed version: pods mount an
immutable directory, never a moving pointer).
"""

from __future__ import annotations

import argparse

from compile.settings import Settings
from registry.k8s import DEFAULT_MOUNT, DEFAULT_VERIFY_IMAGE, DEFAULT_VLLM_IMAGE, render_k8s

HELP = "print PV, PVC and vLLM Deployment YAML for a version"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI", help="s3://BUCKET/.../SPEC/KEY or s3://BUCKET/.../SPEC (LATEST)")
    parser.add_argument("--name", help="base name of the objects (default: from TP, k and the key)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--image", default=DEFAULT_VLLM_IMAGE, help="vLLM Neuron image")
    parser.add_argument("--verify-image", default=DEFAULT_VERIFY_IMAGE, help="image with fusedspec, for the init container")
    parser.add_argument("--region", help="bucket region for Mountpoint (default: AWS_REGION, else us-east-1)")
    parser.add_argument("--mount-path", default=DEFAULT_MOUNT)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--cores-per-device", type=int, default=4,
                        help="logical NeuronCores per device: 4 on trn2 (LNC=2), 2 on trn1")
    parser.add_argument("--service-account", help="service account with read access to the bucket")


def run(args: argparse.Namespace, settings: Settings) -> int:
    print(render_k8s(args.uri, settings, name=args.name, namespace=args.namespace, image=args.image,
                     verify_image=args.verify_image, region=args.region, mount_path=args.mount_path,
                     replicas=args.replicas, cores_per_device=args.cores_per_device,
                     service_account=args.service_account), end="")
    return 0
