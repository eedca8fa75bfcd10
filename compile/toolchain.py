"""Toolchain versions per backend, read from installed distributions without importing them.

They enter content keys and manifests: a compiled program is only valid for the toolchain that made it.
`code_version(backend)` is the version of our own compile code. For `cpu` it is derived from the source
of compile/cpu/ (its syntax tree without docstrings, so a comment or docstring edit keeps every key and
any code change makes new ones): cpu builds take seconds to minutes, so a needless rebuild is cheap and a
forgotten bump would serve stale programs. For `neuron` it is bumped by hand: a Qwen3-32B compile takes
hours, and a refactor of the translation that emits the same NxDI configuration must not throw them away
(tests/test_neuron_translate.py pins the emitted configuration, so a change that alters it is seen).
"""

from __future__ import annotations

import ast
import hashlib
import platform
from functools import cache
from importlib import metadata
from pathlib import Path

# 2: continuous batching and buckets, both configs and the tokenizer in the artifact
NEURON_CODE_VERSION = "2"
CPU_SOURCE = Path(__file__).parent / "cpu"

CPU_DISTRIBUTIONS = ("torch",)
NEURON_DISTRIBUTIONS = ("neuronx-cc", "neuronx-distributed-inference", "neuronx-distributed",
                        "torch-neuronx", "libneuronxla", "torch")
ABSENT = "absent"


def distribution_versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ABSENT
    return versions


def cpu_toolchain() -> dict[str, str]:
    # torch.export archives are tied to the torch release; the Python minor version to its pickles.
    return {**distribution_versions(CPU_DISTRIBUTIONS),
            "python": ".".join(platform.python_version_tuple()[:2])}


def code_version(backend: str) -> str:
    return source_version(CPU_SOURCE) if backend == "cpu" else NEURON_CODE_VERSION


@cache
def source_version(package_dir: Path) -> str:
    """`src-` + the sha256 (16 hex) of the package's modules as syntax trees without docstrings."""
    digest = hashlib.sha256()
    for path in sorted(Path(package_dir).glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        digest.update(path.name.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return "src-" + digest.hexdigest()[:16]
