"""The Neuron toolchain of this host, and what differs from the one an artifact was built with.

NEFFs inside model.pt are tied to the neuronx-cc that made them, the runtime that loads them and the
flags they were compiled with; NxDI names its classes in neuron_config.json by module and name. All of it
enters the content key and the manifest, and `fusedspec verify --runtime-check` refuses an artifact whose
recorded versions differ from the serving host's.

Python packages are read from installed distribution metadata (no import). The Neuron runtime
(libnrt.so) is a system package, `aws-neuronx-runtime-lib`: read from the dpkg database when present,
else from the versioned file name libnrt.so.1 resolves to (`libnrt.so.2.31.24.0`), else "absent".
"""

from __future__ import annotations

import re
from pathlib import Path

from fusedspec.compile.toolchain import ABSENT, NEURON_DISTRIBUTIONS, distribution_versions
from fusedspec.core.settings import Settings

RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"
DPKG_STATUS = Path("/var/lib/dpkg/status")
RUNTIME_LIB_DIRS = (Path("/opt/aws/neuron/lib"),)
RUNTIME_KEY = "neuron-runtime"
FLAGS_KEY = "neuron_cc_flags"
# Compile-time inputs: they change the artifact, but a serving host need not have them set the same way.
NOT_RUNTIME = (FLAGS_KEY,)


def runtime_version(dpkg_status: Path = DPKG_STATUS, lib_dirs: tuple[Path, ...] = RUNTIME_LIB_DIRS) -> str:
    """The Neuron runtime library version visible on this host, or "absent"."""
    if dpkg_status.is_file():
        version = _dpkg_version(dpkg_status.read_text(errors="replace"), RUNTIME_PACKAGE)
        if version:
            return version
    for lib_dir in lib_dirs:
        lib = lib_dir / "libnrt.so.1"
        if lib.exists():
            match = re.search(r"libnrt\.so\.(\d+(?:\.\d+)+)$", lib.resolve().name)
            return match.group(1) if match else "present, version unknown"
    return ABSENT


def _dpkg_version(status: str, package: str) -> str | None:
    # dpkg's status file: stanzas separated by blank lines, "Field: value" lines.
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Package") == package and "installed" in fields.get("Status", "").split():
            return fields.get("Version")
    return None


def neuron_toolchain(settings: Settings, *, dpkg_status: Path = DPKG_STATUS,
                     lib_dirs: tuple[Path, ...] = RUNTIME_LIB_DIRS) -> dict[str, str]:
    """Versions of neuronx-cc, NxDI, neuronx-distributed, torch-neuronx, libneuronxla, torch, the runtime,
    and the compiler flags; "absent" for what is not installed."""
    return {
        **distribution_versions(NEURON_DISTRIBUTIONS),
        RUNTIME_KEY: runtime_version(dpkg_status, lib_dirs),
        FLAGS_KEY: settings.neuron_cc_flags or "",
    }


def runtime_mismatches(recorded: dict[str, str], host: dict[str, str]) -> list[str]:
    """One sentence per serving-relevant component whose recorded version differs from the host's. Empty
    when this host can serve the artifact. A component recorded as absent (say, no runtime on a CPU compile
    node) cannot be compared and is skipped."""
    problems = []
    for name in sorted(recorded):
        if name in NOT_RUNTIME or recorded[name] == ABSENT:
            continue
        have = host.get(name, ABSENT)
        if have != recorded[name]:
            problems.append(f"{name}: the artifact was built with {recorded[name]}, this host has {have}; "
                            f"install {name} {recorded[name]} or recompile on this toolchain")
    return problems
