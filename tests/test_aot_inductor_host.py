"""AOTInductor, the cpu default, against the host: a build needs a C++ compiler (refused up front when
none runs), and a package's native code is for a recorded CPU ISA a serving host must have (refused at
load, not a SIGILL). No AOTInductor compile here: those are tested in test_cpu_runner.py."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fusedspec.compile.cpu import native
from fusedspec.compile.cpu.export import load_program
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError
from tests.fixtures.fake_artifacts import make_artifact

FUSEDSPEC = Path(sys.executable).parent / "fusedspec"


def _config(path: Path, target: Path, draft: Path, **extra: object) -> Path:
    path.write_text(yaml.safe_dump({
        "target": str(target), "draft": str(draft), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "dtype": ["float32"]},
        "publish": {"uri": str(path.parent / "store")}, **extra}))
    return path


def _no_compiler_env(tmp_path: Path) -> dict[str, str]:
    """A real host condition: no $CXX, and a PATH on which no g++ (nor anything else) is found."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items()
           if name not in ("CXX", "TORCH_INDUCTOR_INSTALL_GXX")}
    return {**env, "PATH": str(empty), "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}


def test_without_a_cxx_compiler_plan_and_compile_refuse_the_default_and_accept_exported_programs(
        tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path) -> None:
    env = _no_compiler_env(tmp_path)
    default = _config(tmp_path / "run.yaml", tiny_target, tiny_drafts["cut"])  # aot_inductor by default
    for command in ("plan", "compile"):
        done = subprocess.run([str(FUSEDSPEC), command, str(default)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        for words in ("compile.aot_inductor", "install g++ (apt install g++)", "compile.aot_inductor: false"):
            assert words in done.stderr, (command, done.stderr)
    assert not (tmp_path / "work" / "builds").exists()  # nothing was compiled

    exported = _config(tmp_path / "exported.yaml", tiny_target, tiny_drafts["cut"],
                       compile={"aot_inductor": False})
    done = subprocess.run([str(FUSEDSPEC), "plan", str(exported), "--json"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["builds"]


def test_a_package_for_an_isa_this_cpu_lacks_is_refused_at_load_naming_isa_and_host(tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "artifact", validation=False)
    package = artifact / "programs" / "fused_step.aoti.pt2"
    package.write_bytes(b"never opened: the ISA check comes first")
    # an ISA whose flags this host's /proc/cpuinfo does not list: the other architecture's baseline
    foreign = "armv8-a" if platform.machine().lower() in ("x86_64", "amd64") else "x86-64-v3"
    # native code allowed: the ISA check is what is shown
    built_here = LoadTrust(str(artifact), built_here=True)
    for isa, expected in ((foreign, [f"CPU ISA {foreign}", platform.node(), "missing CPU flags", "SIGILL"]),
                          (None, ["without a recorded cpu_isa", "SIGILL", "Build it again"])):
        with pytest.raises(ArtifactError) as refused:
            load_program(artifact, "programs/fused_step.aoti.pt2", built_here, isa)
        for words in expected:
            assert words in str(refused.value), str(refused.value)


def test_builds_here_are_pinned_to_a_baseline_this_cpu_has(tmp_path: Path) -> None:
    isa = native.build_isa()
    if isa is None:
        pytest.skip(f"no baseline for {platform.machine()}")
    assert native.missing_flags(isa) == []
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx\n")  # an old x86 CPU: no AVX2, no SSE4
    assert "avx2" in native.missing_flags("x86-64-v3", native.cpu_flags(cpuinfo))
    if isa == "x86-64-v3":  # inductor's vector code inside the pin is AVX2, not the host's AVX-512
        from torch._inductor import cpu_vec_isa

        with native.pinned_isa(isa):
            assert str(cpu_vec_isa.pick_vec_isa()) == "avx2"


def test_torchs_isa_mismatch_warning_is_dropped_only_for_the_pinned_baseline(
        caplog: pytest.LogCaptureFixture) -> None:
    """torch warns at every package load that the package's ISA is not this host's widest; for a package
    of its pinned baseline that is by design and dropped. A package of another ISA still warns."""
    import logging

    from fusedspec.compile.cpu.export import _quiet_pinned_isa

    torch_log = logging.getLogger("torch.export.pt2_archive._package")
    message = "Device information mismatch for %s: %s vs %s. This could cause some issues"
    with caplog.at_level(logging.WARNING, logger=torch_log.name), _quiet_pinned_isa("x86-64-v3"):
        # the pinned package: dropped
        torch_log.warning(message, "AOTI_CPU_ISA", "AVX512 AVX512_VNNI", "AVX2")
        torch_log.warning(message, "AOTI_CPU_ISA", "AVX2", "AVX512")  # not what the baseline compiles to
    torch_log.warning(message, "AOTI_CPU_ISA", "AVX512 AVX512_VNNI", "AVX2")  # outside a load: untouched
    assert [r.args[2] for r in caplog.records if r.name == torch_log.name] == ["AVX512", "AVX2"]
