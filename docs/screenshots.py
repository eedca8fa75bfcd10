"""Make the README's Prefect UI screenshots: docs/prefect-run.png, docs/prefect-summary.png, docs/prefect-table.png.

    .venv/bin/python docs/screenshots.py [--port PORT]

It runs the README's own "Try it on Prefect" block, as a user pastes it, on the demo's tiny pair (made
under the work dir as `make demo` makes it), with four things of its own: the port, the server's
PREFECT_HOME (under .work/screenshots), the pair's directories for /abs/target and /abs/draft, and where
the run config is written. The worker gets a fresh work dir (.work/screenshots/work), so the run compiles,
validates and publishes both builds as a first run does. Then headless Chromium (Debian's `chromium`
package, a fresh profile under .work/screenshots) captures the run page and its two artifacts, and Pillow
shrinks each PNG to a palette image of a few hundred KB at most. The block's worker and server are
stopped (their process group, by the shell's PID) at the end.

tests/test_prefect_ux.py runs the same block with `readme_try_out` and `own`. Not part of `make test`:
it takes minutes and writes into docs/.
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
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Try it on Prefect: server, worker, deployments"
WIDTH = 1400  # browser window width (a laptop screen); the PNGs are shrunk to OUT_WIDTH
OUT_WIDTH = 1000
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=20000"]
CREATED = re.compile(r"created flow run '[^']*' \(([0-9a-f-]{36})\)")


def readme_try_out() -> str:
    """The first bash block of the README's Prefect section, as a user copies it."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION):]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    if match is None:
        raise SystemExit("the README's Prefect section has no bash block")
    return match.group(1)


def own(block: str, old: str, new: str, times: int = 1) -> str:
    """Substitute something the caller must own (a port, a path); the README must say it `times` times."""
    if block.count(old) != times:
        raise SystemExit(f"the README's Prefect block should contain {old!r} {times} time(s)")
    return block.replace(old, new)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def stop_group(proc: subprocess.Popen) -> None:
    """TERM the shell's process group (the block's server and worker), then KILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)


def screenshot(url: str, out: Path, height: int, profile: Path) -> None:
    """The page at `url` as a PNG, shrunk to OUT_WIDTH wide and to 256 colours (a UI has few)."""
    from PIL import Image

    raw = out.with_suffix(".raw.png")
    subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}",
                    f"--screenshot={raw}", url], check=True, capture_output=True, timeout=180)
    image = Image.open(raw).convert("RGB")
    image = image.resize((OUT_WIDTH, round(image.height * OUT_WIDTH / image.width)), Image.Resampling.LANCZOS)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    raw.unlink()
    print(f"{out.relative_to(REPO)}: {out.stat().st_size // 1024} KB")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="the Prefect server's port (default: a free one)")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")

    sys.path.insert(0, str(REPO))
    from fusedspec.core.settings import load_settings
    from fusedspec.demo import demo_models

    settings = load_settings()
    target, draft = demo_models(settings)
    root = settings.work_dir / "screenshots"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = args.port or free_port()
    block = own(readme_try_out(), "PORT=4200", f"PORT={port}")
    block = own(block, "$PWD/.work/prefect-server", str(root / "prefect-server"))
    block = own(block, "/abs/target", str(target))
    block = own(block, "/abs/draft", str(draft))
    block = own(block, ".work/try.yaml", str(root / "try.yaml"), times=2)
    (root / "readme.sh").write_text("set -e\n" + block)
    # A first run, as a new user sees it: the worker compiles, validates and publishes both builds.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_")}
    env |= {"FUSEDSPEC_WORK_DIR": str(root / "work"), "PREFECT_WORKER_QUERY_SECONDS": "1", "COLUMNS": "200",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = root / "readme.log"
    with open(log, "wb") as out:
        shell = subprocess.Popen(["bash", str(root / "readme.sh")], cwd=REPO, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = shell.wait(timeout=3600)
        output = log.read_text(errors="replace")
        created = CREATED.search(output)
        if code != 0 or created is None:
            raise SystemExit(f"the README's block ended {code}:\n{output[-3000:]}")
        run_id = created.group(1)
        api_url = f"http://127.0.0.1:{port}/api"
        artifacts = {a["key"].rsplit("-", 1)[-1]: a["id"] for a in
                     api(f"{api_url}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
                     if a.get("key")}
        ui = f"http://127.0.0.1:{port}"
        profile = root / "chromium-profile"
        screenshot(f"{ui}/runs/flow-run/{run_id}", REPO / "docs" / "prefect-run.png", 3400, profile)  # to the outcome line
        screenshot(f"{ui}/artifacts/artifact/{artifacts['summary']}", REPO / "docs" / "prefect-summary.png", 1280,
                   profile)
        screenshot(f"{ui}/artifacts/artifact/{artifacts['builds']}", REPO / "docs" / "prefect-table.png", 420,
                   profile)
        print(f"the README's block printed (the run's outcome is its last lines): {log}")
    finally:
        stop_group(shell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
