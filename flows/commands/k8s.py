"""`fusedspec k8s URI [options]`: print PV, PVC, Service and Deployment YAML that serve one published version.

URI is an s3:// version or config path (its LATEST is resolved to a fixed version: pods mount an
immutable directory, never a moving pointer). A neuron version is served by vLLM, a cpu version by
`fusedspec serve` (registry.k8s.DEPLOYMENTS). A version holding native code (AOTInductor, NxDI) needs a
verify key (FUSEDSPEC_VERIFY_KEY[_FILE]) under which its manifest's signature verifies: its pods refuse
it otherwise, so the YAML is refused here first.
"""

from __future__ import annotations

import argparse

from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import Settings
from fusedspec.registry.k8s import (
    DEFAULT_CPU_IMAGE,
    DEFAULT_IMAGE,
    DEFAULT_MOUNT_ROOT,
    NEURON_TAINT,
    ServingOptions,
    render_k8s,
)

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI",
                        help="s3://BUCKET/.../SPEC/KEY or s3://BUCKET/.../SPEC (LATEST)")
    parser.add_argument("--name", help="base name of the objects (default: from TP, k and the key)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--image",
                        help="image built by ./Dockerfile; runs the server and the init check (default: "
                             f"{DEFAULT_IMAGE} for a neuron version, {DEFAULT_CPU_IMAGE} for a cpu one)")
    parser.add_argument("--region", help="bucket region for Mountpoint (default: AWS_REGION, else us-east-1)")
    parser.add_argument("--mount-root", default=DEFAULT_MOUNT_ROOT,
                        help="the version is mounted at MOUNT_ROOT/KEY (default %(default)s)")
    parser.add_argument("--replicas", type=int, default=1, help="pods (0 is allowed: scaled to zero)")
    parser.add_argument("--s3-endpoint", metavar="URL",
                        help="the S3 endpoint as the cluster reaches it, for the volume and the init check "
                             "(default: AWS S3, or the endpoint this host "
                             "uses unless it is this host's loopback)")
    parser.add_argument("--s3-secret", metavar="NAME",
                        help="a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for the init check's "
                             "S3 requests (default: the pod's service account credentials, e.g. IRSA)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--service-account", help="service account of the pods")
    parser.add_argument("--node-selector", action="append", metavar="KEY=VALUE",
                        help="replaces the default node selector (the instance type the artifact was built "
                             "for); repeat for more labels")
    parser.add_argument("--no-node-selector", action="store_true", help="no node selector at all")
    parser.add_argument("--toleration", action="append", metavar="KEY[=VALUE]:EFFECT",
                        help=f"replaces the default toleration ({NEURON_TAINT['key']} "
                             f"{NEURON_TAINT['effect']}); repeat for more")
    parser.add_argument("--no-toleration", action="store_true", help="no toleration at all")
    parser.add_argument("--full-verify", action="store_true",
                        help="the init container re-hashes every byte (default: the manifest, its signature "
                             "and the store's own checksums, no byte read)")


def _node_selector(args: argparse.Namespace) -> dict[str, str] | None:
    if args.no_node_selector and args.node_selector:
        raise ConfigError("give --node-selector or --no-node-selector, not both")
    if args.no_node_selector:
        return {}
    if not args.node_selector:
        return None
    selector = {}
    for item in args.node_selector:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--node-selector {item!r}: expected KEY=VALUE, e.g. "
                              "node.kubernetes.io/instance-type=trn2.48xlarge")
        selector[key] = value
    return selector


def _tolerations(args: argparse.Namespace) -> list[dict[str, str]] | None:
    if args.no_toleration and args.toleration:
        raise ConfigError("give --toleration or --no-toleration, not both")
    if args.no_toleration:
        return []
    if not args.toleration:
        return None
    tolerations = []
    for item in args.toleration:
        taint, sep, effect = item.rpartition(":")
        key, has_value, value = taint.partition("=")
        if not sep or not key or effect not in EFFECTS:
            raise ConfigError(f"--toleration {item!r}: expected KEY[=VALUE]:EFFECT with EFFECT one of "
                              f"{', '.join(EFFECTS)}, e.g. {NEURON_TAINT['key']}:NoSchedule")
        toleration = {"key": key, "operator": "Equal", "value": value, "effect": effect} if has_value else \
            {"key": key, "operator": "Exists", "effect": effect}
        tolerations.append(toleration)
    return tolerations


def run(args: argparse.Namespace, settings: Settings) -> int:
    options = ServingOptions(name=args.name, namespace=args.namespace, image=args.image, region=args.region,
                             mount_root=args.mount_root, replicas=args.replicas, port=args.port,
                             service_account=args.service_account, node_selector=_node_selector(args),
                             tolerations=_tolerations(args), full_verify=args.full_verify,
                             s3_endpoint=args.s3_endpoint, s3_secret=args.s3_secret)
    print(render_k8s(args.uri, settings, options), end="")
    return 0
