"""Neuron toolchain capture and the runtime check that refuses an artifact this host cannot serve."""

from __future__ import annotations

from pathlib import Path

from fusedspec.compile.neuron.toolchain import neuron_toolchain, runtime_mismatches, runtime_version
from fusedspec.compile.toolchain import NEURON_DISTRIBUTIONS
from fusedspec.core.settings import load_settings

DPKG_STATUS = """Package: aws-neuronx-dkms
Status: install ok installed
Version: 2.21.37.0

Package: aws-neuronx-runtime-lib
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 2.27.23.0-8deec4dbf
Description: Neuron Runtime library
 multi-line description: with a colon

Package: aws-neuronx-collectives
Status: deinstall ok config-files
Version: 2.27.34.0
"""


def test_runtime_version_from_dpkg(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(DPKG_STATUS)
    assert runtime_version(status, ()) == "2.27.23.0-8deec4dbf"


def test_runtime_version_from_the_library_file(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnrt.so.2.31.24.0").write_bytes(b"\x7fELF")
    (lib / "libnrt.so.1").symlink_to("libnrt.so.2.31.24.0")
    assert runtime_version(tmp_path / "no-dpkg", (lib,)) == "2.31.24.0"
    assert runtime_version(tmp_path / "no-dpkg", (tmp_path / "empty",)) == "absent"


def test_toolchain_on_this_host_records_every_component(tmp_path: Path) -> None:
    settings = load_settings({"FUSEDSPEC_WORK_DIR": str(tmp_path),
                              "NEURON_CC_FLAGS": "--model-type=transformer"})
    tc = neuron_toolchain(settings, dpkg_status=tmp_path / "none", lib_dirs=())
    assert set(tc) == {*NEURON_DISTRIBUTIONS, "neuron-runtime", "neuron_cc_flags"}
    assert tc["neuron_cc_flags"] == "--model-type=transformer"
    assert tc["neuronx-cc"] == "absent" and tc["neuron-runtime"] == "absent"  # no Neuron SDK on this machine
    assert tc["torch"] != "absent"


def test_runtime_mismatches_name_each_difference() -> None:
    recorded = {"neuronx-cc": "2.21.18209.0", "neuronx-distributed-inference": "0.6.10598",
                "torch-neuronx": "2.8.0.2.10", "neuron-runtime": "absent", "neuron_cc_flags": "-O1"}
    host = {**recorded, "neuronx-cc": "2.22.1.0", "neuron-runtime": "2.27.23.0", "neuron_cc_flags": ""}
    assert runtime_mismatches(recorded, recorded) == []
    problems = runtime_mismatches(recorded, host)
    # The runtime was not visible at compile time and flags are a compile-time input: neither is compared.
    assert problems == ["neuronx-cc: the artifact was built with 2.21.18209.0, this host has 2.22.1.0; "
                        "install neuronx-cc 2.21.18209.0 or recompile on this toolchain"]
    assert "this host has absent" in runtime_mismatches(recorded, {})[0]
