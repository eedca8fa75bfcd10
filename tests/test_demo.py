"""`make demo` as the README has a newcomer run it: `fusedspec demo` publishes its four builds, and a second
run compiles and uploads nothing. `--publish artifacts` also checks that a relative store is taken from
the directory the demo runs in (the flow alone would refuse it: a worker's directory is temporary).

The first run is on Prefect's temporary server with every core kept busy from the moment that server is
started until it has answered (issue 24: it gave up after Prefect's 20 s there), and with PREFECT_HOME
pointing where a user's own server lives: the temporary server must use the demo's own home. The second
run goes to a real server (PREFECT_API_URL)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil
import pytest

from fusedspec.core.settings import load_settings

pytestmark = pytest.mark.slow
BUSY = "while True: pass"


def _demo(cwd: Path, env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([str(Path(sys.executable).with_name("fusedspec")), "demo", "--json", "--publish",
                             "artifacts"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _flow_runs(db: Path) -> int:
    """Flow runs in a Prefect server's database; 0 before the database has its tables or while it is
    locked."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            return int(conn.execute("SELECT count(*) FROM flow_run").fetchone()[0])
    except sqlite3.Error:
        return 0


def _temporary_server_started(demo: subprocess.Popen[str]) -> bool:
    """Prefect's temporary server, a `python -m uvicorn` process, runs below the demo."""
    try:
        children = psutil.Process(demo.pid).children(recursive=True)
    except psutil.Error:  # the demo has ended
        return False
    for child in children:
        try:
            if "uvicorn" in child.cmdline():
                return True
        except psutil.Error:  # a child that ended (or is a zombie) while being read
            continue
    return False


def _finished(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_demo_passes_on_a_busy_host_in_its_own_prefect_home_and_reruns_do_nothing(
        tmp_path: Path, prefect_server: Any) -> None:
    # The work dir is the session's (the demo models and builds are cached by content there, as on a
    # laptop); the store is new: ./artifacts of a fresh directory.
    users_home = tmp_path / "users-prefect-home"  # where the README's server keeps its database
    users_home.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(users_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    demo_home = load_settings().work_dir / "demo" / "prefect-home"
    runs_before = _flow_runs(demo_home / "prefect.db")  # a laptop's work dir keeps earlier demo runs
    demo = _demo(tmp_path, env)
    made = time.monotonic() + 600  # the models are made first (its output is read once it ends)
    while demo.poll() is None and not _temporary_server_started(demo):
        assert time.monotonic() < made, "the demo never started Prefect's temporary server"
        time.sleep(0.2)
    started = time.monotonic()
    loaders = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(os.cpu_count() or 2)]
    try:
        # busy until the temporary server has started and answered: the demo's flow run is in its database
        while demo.poll() is None and time.monotonic() - started < 240:
            if _flow_runs(demo_home / "prefect.db") > runs_before:
                break
            time.sleep(1)
    finally:
        for loader in loaders:
            loader.kill()
            loader.wait()
    first = _finished(demo)
    assert first["counts"]["published"] == 4, first["counts"]
    store = tmp_path / "artifacts"
    assert all(o["version_uri"].startswith(str(store)) for o in first["outcomes"])
    assert len(list(store.rglob("manifest.json"))) == 4
    assert (demo_home / "prefect.db").is_file() and not list(users_home.glob("*.db")), \
        "the temporary server must keep to the demo's own Prefect home"
    assert first["advice"]["cost_model"]["cost_ratio"] == 0.1, "the demo advises with its own config's c"

    second = _finished(_demo(tmp_path, prefect_server.env))  # a real server: PREFECT_API_URL
    assert second["counts"] == {**second["counts"], "reused": 4, "compiled": 0, "bytes_uploaded": 0}
    assert second["advice"]["cost_model"]["cost_ratio"] == 0.1
