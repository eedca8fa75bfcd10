"""Toolchain versions per backend, read from installed distributions without importing them.

They enter content keys and manifests: a compiled program is only valid for the toolchain that made it.
`CODE_VERSIONS` is the version of our own compile code per backend; bump it when a change to the
compiler would change what it produces, so old keys stop matching.
"""

from __future__ import annotations

import platform
from importlib import metadata

CODE_VERSIONS = {"cpu": "3", "neuron": "1"}  # cpu 2: dynamic context length; 3: context encoding per cache line

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
    return {**distribution_versions(CPU_DISTRIBUTIONS), "python": ".".join(platform.python_version_tuple()[:2])}
