"""The wheel installs one import name, `fusedspec`, so it lives beside any other distribution: configobj, for
one, installs a top-level `validate` package, which the old layout (four generic top-level names) shadowed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    return next(out.glob("fusedspec-*.whl"))


def test_the_wheel_holds_fusedspec_and_nothing_else_at_the_top(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"fusedspec"}
    assert "fusedspec/validate/prompts/default.jsonl" in names  # data files travel with their package
    assert "fusedspec/registry/manifest.schema.json" in names


def test_fusedspec_and_configobj_import_side_by_side(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel), "configobj==5.0.9"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip(f"configobj is not reachable from this machine's package index: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    # -I -S: neither this checkout, nor the editable install, nor site-packages: only what was installed above
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import validate, fusedspec.validate, fusedspec.compile; "
            "assert hasattr(validate, 'Validator'), validate.__file__; "
            "assert fusedspec.validate.__file__.startswith(sys.argv[1]), fusedspec.validate.__file__; "
            "print('ok')")
    shown = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(target)], capture_output=True,
                           text=True, timeout=60)
    assert shown.stdout.strip() == "ok", shown.stderr
