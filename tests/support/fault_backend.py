"""A test backend that injects faults no real input can cause on demand: the cpu backend, plus the faults
named in FUSEDSPEC_TEST_FAULTS (comma-separated `<fault>:<spec slug>`):

    greedy:<slug>         the compiled artifact computes a wrong answer (one target weight scaled), so
                          the greedy gate must fail it and nothing may be published for it
    compile-crash:<slug>  compiling it raises an unexpected RuntimeError (a toolchain bug)
    load-crash:<slug>     loading it for validation raises an unexpected RuntimeError

Registered by the tests as backend `cpu-faults` (FUSEDSPEC_BACKEND_PLUGINS=cpu-faults=tests.support.
fault_backend), so production code carries no test seam. The faults are part of the toolchain, so a
faulty build never shares a content key with a sound one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import ProgramSource
from fusedspec.compile.content_key import BuildKeys
from fusedspec.compile.cpu.backend import CpuBackend
from fusedspec.compile.cpu.runner import CpuRunner
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.trust import LoadTrust

NAME = "cpu-faults"


def faults() -> dict[str, str]:
    """slug -> fault, from the environment of this process (a worker inherits it)."""
    found = {}
    for item in os.environ.get("FUSEDSPEC_TEST_FAULTS", "").split(","):
        if ":" in item:
            fault, slug = item.strip().split(":", 1)
            found[slug] = fault
    return found


class FaultyCpuBackend(CpuBackend):
    name = NAME

    def toolchain(self) -> dict[str, str]:
        return {**super().toolchain(), "test-faults": os.environ.get("FUSEDSPEC_TEST_FAULTS", "")}

    def compile(self, spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, out_dir: Path, *,
                keys: BuildKeys, options: dict[str, Any] | None = None,
                programs: ProgramSource | None = None) -> Path:
        fault = faults().get(spec.slug)
        if fault == "compile-crash":
            raise RuntimeError(f"injected compile crash for {spec.slug}")
        out = super().compile(spec, target, draft, out_dir, keys=keys, options=options, programs=programs)
        if fault == "greedy":
            perturb_artifact(out)
        return out

    def load(self, artifact_dir: Path, trust: LoadTrust | None = None) -> CpuRunner:
        runner = super().load(artifact_dir, trust)
        if faults().get(runner.spec.slug) == "load-crash":
            raise RuntimeError(f"injected load crash for {runner.spec.slug}")
        return runner


def perturb_artifact(artifact: Path) -> None:
    """Scale one target weight of shard 0 so the artifact's greedy output changes."""
    from safetensors.torch import load_file, save_file

    shard = artifact / "weights" / "tp0_sharded_checkpoint.safetensors"
    tensors = load_file(shard)
    name = next(n for n in sorted(tensors) if n.startswith("target_model.") and n.endswith("o_proj.weight"))
    tensors[name] = tensors[name] * 25.0
    save_file(tensors, shard)


BACKEND = FaultyCpuBackend()
