"""The NxDI version gate and the field lists it checks against (issue 26, must-show 2): a stored release, or a
newer NxDI installed on the host whose own models/config.py is read by the same reader that produced the
stored lists. NxDI 0.10 (SDK 2.30 to 2.32) has no public source, so the installed layout here is a directory
laid out as pip installs a distribution (its dist-info METADATA and the package's models/config.py), the
config.py written with the classes and keyword names of NxDI 0.9.0's, under version 0.10.18399."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.compile.neuron.fields import (
    CONFIG_CLASSES,
    FIELDS_FILE,
    INSTALLED,
    check_nxdi_version,
    field_lists,
    field_table,
    installed_nxdi,
    release,
    version_warnings,
)
from fusedspec.compile.neuron.read_nxdi_fields import read_fields
from fusedspec.core.errors import ConfigError
from tests.test_neuron_translate import SPEC, arch, plan_for

NEWER = "0.10.18399+ed62453e"  # the NxDI wheel of SDK 2.31 and 2.32


def config_source(fields: dict[str, list[str]]) -> str:
    """A models/config.py shaped like NxDI's: NeuronConfig pops its names in __init__ and one in a helper
    (as _get_lnc pops logical_nc_config), OnDeviceSamplingConfig pops in __init__, FusedSpecNeuronConfig
    takes its names as parameters; plus code the reader must not count."""
    neuron = [n for n in fields["NeuronConfig"] if n != "logical_nc_config"]
    lines = ["import os", "", "", "class NeuronConfig:", "    def __init__(self, **kwargs):"]
    lines += [f"        self.{n} = kwargs.pop({n!r}, None)" for n in neuron]
    lines += ["        self.logical_nc_config = self._get_lnc(kwargs)",
              "        self.unread = kwargs.get('only_looked_at')", "",
              "    def _get_lnc(self, kwargs):"]
    lines += ["        return kwargs.pop('logical_nc_config', 1)"
              if "logical_nc_config" in fields["NeuronConfig"] else "        return 1"]
    lines += ["", "", "class OnDeviceSamplingConfig:", "    def __init__(self, **kwargs):"]
    lines += [f"        self.{n} = kwargs.pop({n!r}, None)" for n in fields["OnDeviceSamplingConfig"]]
    params = ", ".join(f"{n}=None" for n in fields["FusedSpecNeuronConfig"] if n != "worker_cls")
    lines += ["", "", "class FusedSpecNeuronConfig:", f"    def __init__(self, worker_cls, {params}):",
              "        pass", ""]
    return "\n".join(lines)


def install_nxdi(site: Path, version: str, source: str) -> Path:
    """A distribution of neuronx-distributed-inference in `site` as pip lays one out; returns `site`."""
    info = site / "neuronx_distributed_inference-0.10.18399.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: neuronx-distributed-inference\n"
                                   f"Version: {version}\n")
    package = site / "neuronx_distributed_inference" / "models"
    package.mkdir(parents=True)
    (package / "config.py").write_text(source)
    return site


def stored(version: str) -> dict[str, list[str]]:
    return {c: field_table()["versions"][version][c] for c in CONFIG_CLASSES}


def test_the_reader_reads_an_installed_nxdi_and_the_gate_admits_a_newer_release(tmp_path: Path) -> None:
    site = install_nxdi(tmp_path / "site", NEWER, config_source(stored("0.9.0")))
    installed = installed_nxdi([str(site)])
    assert installed is not None and installed.version == NEWER and installed.problem is None
    assert installed.config_py == site / "neuronx_distributed_inference/models/config.py"
    assert {c: sorted(names) for c, names in (installed.fields or {}).items()} == \
        {c: sorted(names) for c, names in stored("0.9.0").items()}
    assert check_nxdi_version(NEWER, installed.fields) == NEWER  # admitted, checked against its own list
    lists = field_lists(installed)
    assert list(lists) == ["0.6.0", "0.7.0", "0.8.0", "0.9.0", NEWER]
    # The translation is checked against the installed list too, and says so.
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), installed=installed)
    assert plan["nxdi_versions"][NEWER] == INSTALLED
    assert all(plan["unknown_fields_per_nxdi_version"][c][NEWER] == [] for c in CONFIG_CLASSES)
    warnings = version_warnings(installed)
    assert len(warnings) == 1 and \
        f"{NEWER} installed here is newer than the stored field lists" in warnings[0]
    assert installed_nxdi([str(tmp_path / "empty")]) is None


def test_a_newer_nxdi_that_no_longer_reads_an_emitted_field_is_refused(tmp_path: Path) -> None:
    fields = stored("0.9.0")
    fields["NeuronConfig"] = [n for n in fields["NeuronConfig"] if n != "async_mode"]
    installed = installed_nxdi([str(install_nxdi(tmp_path, NEWER, config_source(fields)))])
    assert installed is not None and check_nxdi_version(NEWER, installed.fields) == NEWER
    with pytest.raises(ConfigError, match=r"installed here \(0\.10\.18399\+ed62453e\) would silently drop "
                                          r"NeuronConfig field 'async_mode'"):
        plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), installed=installed)


def test_a_newer_nxdi_whose_config_cannot_be_read_is_refused_by_compile_and_warned_by_a_dry_run(
        tmp_path: Path) -> None:
    installed = installed_nxdi([str(install_nxdi(tmp_path, NEWER, "class NeuronConfig(:\n"))])
    assert installed is not None and installed.fields is None and "config.py" in (installed.problem or "")
    with pytest.raises(ConfigError, match="newer than the stored field lists .* could not be read"):
        check_nxdi_version(NEWER, installed.fields)
    [warning] = version_warnings(installed)
    assert warning.startswith("a compile on this host would be refused: neuronx-distributed-inference "
                              f"{NEWER} is newer")
    # A dry run still translates, against the stored lists only.
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), installed=installed)
    assert list(plan["nxdi_versions"]) == ["0.6.0", "0.7.0", "0.8.0", "0.9.0"]


def test_stored_releases_match_by_major_minor_and_older_ones_are_refused() -> None:
    assert check_nxdi_version("0.6.10598+a59fdc00") == "0.6.0"  # wheel numbering of SDK 2.26
    assert check_nxdi_version("0.7.14366") == "0.7.0"  # SDK 2.27
    assert check_nxdi_version("0.8.16251") == "0.8.0"  # SDK 2.28
    assert check_nxdi_version("0.9.17034") == "0.9.0"
    with pytest.raises(ConfigError, match=r"builds with NxDI 0\.6 \(SDK 2\.26\) or later") as info:
        check_nxdi_version("0.5.9230")
    assert "0.7.0 (SDK 2.27), 0.8.0 (SDK 2.28)" in str(info.value)
    with pytest.raises(ConfigError, match=f"compile/neuron/{FIELDS_FILE.name}"):
        check_nxdi_version("0.10.1234")  # newer, nothing read
    with pytest.raises(ConfigError, match="is not MAJOR.MINOR"):
        release("latest")
    assert release("0.10.18399+ed62453e") > release("0.9.0") > release("0.6.10598")


def test_the_stored_lists_are_what_the_reader_reads_from_a_config_shaped_like_each() -> None:
    # The reader is the one code path for both sources: a config.py written with a stored version's names
    # gives back exactly that version's list.
    for version in field_table()["versions"]:
        read = read_fields(config_source(stored(version)))
        assert {c: sorted(n) for c, n in read.items()} == {c: sorted(n) for c, n in stored(version).items()}
