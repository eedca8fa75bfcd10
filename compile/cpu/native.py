"""AOTInductor's native code: the C++ compiler a build needs, and the CPU instruction set it targets.

Compiler: torch inductor (2.13) tries each of `torch._inductor.config.cpp.cxx` in turn, `$CXX` or else
`g++` (plus a conda-installed gcc only when TORCH_INDUCTOR_INSTALL_GXX is set), and takes the first whose
`--version` runs. `compiler_problem` checks the same way, so a host without one is refused at plan time,
not after the weights are sharded and exported.

Instruction set: left alone, inductor compiles with `-march=native` and the widest vector ISA the build
host has (AVX-512 here), so a package built on one machine can die with SIGILL on a serving pod with an
older CPU. A build pins a portable baseline instead (`cpp.march` + `cpp.simdlen`): x86-64-v3 (AVX2, FMA,
F16C, BMI1/2) with inductor's AVX2 kernels on x86-64, armv8-a (NEON) on aarch64. The baseline is the
`cpu_isa` compile option: in the content key and in build.json, and a host whose CPU lacks it refuses
the package at load (ArtifactError) instead of crashing.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path

from fusedspec.core.errors import ArtifactError

COMPILER_FIX = "install g++ (apt install g++), or set compile.aot_inductor: false"

# baseline -> (gcc -march, inductor simdlen, the vector ISA inductor must pick or None for scalar,
#              /proc/cpuinfo flags the host needs)
BASELINES: dict[str, tuple[str, int, str | None, tuple[str, ...]]] = {
    "x86-64-v3": ("x86-64-v3", 256, "avx2",
                  ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3",  # x86-64-v2
                   "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")),
    "x86-64-v2": ("x86-64-v2", 1, None, ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")),
    "armv8-a": ("armv8-a", 128, "asimd", ("asimd",)),
}
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """This host's CPU feature flags (x86 `flags`, arm `Features`); empty when /proc/cpuinfo is unreadable."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def missing_flags(isa: str, flags: set[str] | None = None) -> list[str]:
    """The flags of baseline `isa` this host lacks (all of them for an unknown baseline name)."""
    have = cpu_flags() if flags is None else flags
    if isa not in BASELINES:
        return [f"unknown baseline {isa!r}"]
    return [flag for flag in BASELINES[isa][3] if flag not in have]


def build_isa() -> str | None:
    """The baseline an AOTInductor build on this host targets, or None where none is known (not x86-64 or
    aarch64: such a host cannot build a portable package)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86-64-v3" if not missing_flags("x86-64-v3") else "x86-64-v2"
    if machine in ("aarch64", "arm64"):
        return "armv8-a"
    return None


def host_description() -> str:
    return f"{platform.node() or 'this host'} ({platform.machine()})"


def check_host_isa(isa: object, where: Path) -> None:
    """Refuse (ArtifactError) an AOTInductor package this host's CPU cannot run."""
    if not isinstance(isa, str) or not isa:
        raise ArtifactError(
            f"{where}: an AOTInductor package without a recorded cpu_isa (built before builds were pinned to "
            "a portable baseline, for its build host's own CPU): running it on another CPU can crash with "
            "SIGILL. Build it again here")
    missing = missing_flags(isa)
    if missing:
        raise ArtifactError(
            f"{where}: AOTInductor package compiled for CPU ISA {isa}, which this host {host_description()} "
            f"lacks (missing CPU flags: {', '.join(missing)}); running it would crash with SIGILL. Serve it "
            "on a CPU that has it, or build with compile.aot_inductor: false (portable exported programs)")


@contextlib.contextmanager
def pinned_isa(isa: str) -> Iterator[None]:
    """Inductor's config for compiling to baseline `isa` instead of the build host's own CPU."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    march, simdlen, vector, _flags = BASELINES[isa]
    with inductor_config.patch({"cpp.march": march, "cpp.simdlen": simdlen}):
        picked = str(cpu_vec_isa.pick_vec_isa())
        if vector is not None and picked != vector:
            # e.g. an SVE host: its only vector ISA is not the baseline's; scalar code is portable
            with inductor_config.patch({"cpp.simdlen": 1}):
                yield
        else:
            yield


def compiler_problem() -> str | None:
    """Why an AOTInductor build cannot compile here (no working C++ compiler found the way torch inductor
    looks for one), or None."""
    import torch._inductor.config as inductor_config

    candidates = inductor_config.cpp.cxx
    if not isinstance(candidates, (list, tuple)):
        candidates = (candidates,)
    tried = []
    for cxx in candidates:
        if cxx is None:  # inductor's conda-installed gcc, only when asked for
            if not os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"):
                continue
            return None
        tried.append(cxx)
        try:
            subprocess.run([cxx, "--version"], check=True, capture_output=True, timeout=30)
            return None
        except (OSError, subprocess.SubprocessError):
            continue
    return ("compile.aot_inductor needs a C++ compiler and none runs here (tried "
            f"{', '.join(tried) or 'none'}; torch inductor uses $CXX, else g++): {COMPILER_FIX}")
