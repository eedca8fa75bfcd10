"""`make demo` as the README has a newcomer run it: `fusedspec demo` publishes its four builds, and a second
run compiles and uploads nothing. `--publish artifacts` also checks that a relative store is taken from
the directory the demo runs in (the flow alone would refuse it: a worker's directory is temporary)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _demo(cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([str(Path(sys.executable).with_name("fusedspec")), "demo", "--json", "--publish", "artifacts"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_demo_publishes_into_the_directory_it_runs_in_and_reruns_do_nothing(
        tmp_path: Path, prefect_server: Any) -> None:
    # The work dir is the session's (the demo models and builds are cached by content there, as on a
    # laptop); the store is new: ./artifacts of a fresh directory.
    first = _demo(tmp_path, prefect_server.env)
    assert first["counts"]["published"] == 4, first["counts"]
    store = tmp_path / "artifacts"
    assert all(o["version_uri"].startswith(str(store)) for o in first["outcomes"])
    assert len(list(store.rglob("manifest.json"))) == 4

    second = _demo(tmp_path, prefect_server.env)
    assert second["counts"] == {**second["counts"], "reused": 4, "compiled": 0, "bytes_uploaded": 0}
