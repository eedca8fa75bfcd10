"""Make the README's Prefect UI screenshots: docs/prefect-run.png, docs/prefect-summary.png, docs/prefect-table.png.

    .venv/bin/python docs/screenshots.py [--port PORT]

It follows the README's server/worker/deploy/run sequence on the demo's tiny pair (made under the work dir
as `make demo` makes it): a Prefect server on PORT (its own PREFECT_HOME under .work/screenshots), the
process pool, both deployments, one worker on a fresh work dir (.work/screenshots/work), one
`compile-fused/local` run (tp 1, seq_len 256, k 3 and 5, float32, published to that work dir's store). Then headless Chromium (Debian's `chromium` package, a fresh
profile under .work/screenshots) captures the run page and its two artifacts, and Pillow shrinks each PNG to
a palette image of a few hundred KB at most. Worker and server are stopped (by PID) at the end.

Not part of `make test`: it takes minutes and writes into docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WIDTH = 1440  # browser window width (a laptop screen); the PNGs are shrunk to OUT_WIDTH
OUT_WIDTH = 1000
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=20000"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def prefect(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(REPO / ".venv" / "bin" / "prefect"), *args], env=env, cwd=REPO, text=True,
                          capture_output=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"prefect {' '.join(args[:3])} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([str(REPO / ".venv" / "bin" / "prefect"), *args], env=env, cwd=REPO,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def screenshot(url: str, out: Path, height: int, profile: Path) -> None:
    """The page at `url` as a PNG, shrunk to OUT_WIDTH wide and to 256 colours (a UI has few)."""
    from PIL import Image

    raw = out.with_suffix(".raw.png")
    subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}",
                    f"--screenshot={raw}", url], check=True, capture_output=True, timeout=120)
    image = Image.open(raw).convert("RGB")
    image = image.resize((OUT_WIDTH, round(image.height * OUT_WIDTH / image.width)), Image.Resampling.LANCZOS)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    raw.unlink()
    print(f"{out.relative_to(REPO)}: {out.stat().st_size // 1024} KB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="the Prefect server's port (default: a free one)")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")

    sys.path.insert(0, str(REPO))
    from fusedspec.core.settings import load_settings
    from fusedspec.demo import DEMO_COST_RATIO, demo_models

    settings = load_settings()
    target, draft = demo_models(settings)
    root = settings.work_dir / "screenshots"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = args.port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true", "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1", "COLUMNS": "200",
           # a first run, as a new user sees it: the worker compiles, validates and publishes both builds
           "FUSEDSPEC_WORK_DIR": str(root / "work")}
    server = start(["server", "start", "--host", "127.0.0.1", "--port", str(port)], env, root / "server.log")
    worker = None
    try:
        prefect(["server", "status", "--wait", "--timeout", "120"], env)
        prefect(["work-pool", "create", "fusedspec-local", "--type", "process", "--overwrite"], env)
        prefect(["--no-prompt", "deploy", "--name", "compile-fused/local", "--name", "compile-one/local"], env)
        worker = start(["worker", "start", "--pool", "fusedspec-local", "--limit", "4"], env, root / "worker.log")
        config = {"target": str(target), "draft": str(draft), "backend": "cpu",
                  "matrix": {"tp_degree": [1], "seq_len": [256], "speculation_length": [3, 5], "dtype": ["float32"]},
                  "validation": {"cost_ratio": DEMO_COST_RATIO}, "compile": {"aot_inductor": False}}
        done = prefect(["deployment", "run", "compile-fused/local", "--watch", "--param",
                        f"config={json.dumps(config)}"], env, timeout=1800)
        flow_run_id = re.search(r"Created flow run .*?\n└── UUID:\s*([0-9a-f-]{36})", done.stdout, re.S)
        if flow_run_id is None:
            raise SystemExit(f"no flow run in:\n{done.stdout[-3000:]}")
        run_id = flow_run_id.group(1)
        artifacts = {a["key"].rsplit("-", 1)[-1]: a["id"] for a in
                     api(f"{api_url}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
                     if a.get("key")}
        ui = f"http://127.0.0.1:{port}"
        profile = root / "chromium-profile"
        screenshot(f"{ui}/runs/flow-run/{run_id}", REPO / "docs" / "prefect-run.png", 1560, profile)
        screenshot(f"{ui}/artifacts/artifact/{artifacts['summary']}", REPO / "docs" / "prefect-summary.png", 1280,
                   profile)
        screenshot(f"{ui}/artifacts/artifact/{artifacts['builds']}", REPO / "docs" / "prefect-table.png", 420,
                   profile)
    finally:
        if worker is not None:
            stop(worker)  # the worker before the server, as the README says
        stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
