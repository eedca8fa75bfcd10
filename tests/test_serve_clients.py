"""`fusedspec serve` as real processes against clients nobody here wrote, and against slow ones.

- guidellm 0.8.1 (the vLLM project's benchmark tool) at its defaults, synthetic data, 8 requests over 4
  streams at once (issue 25, must-show 2): every request succeeds, and the output tokens it
  reports for each request are the server's own count, as the server's access log (on by default) has it.
  guidellm pins click, uvloop and httptools, which would change our own server's loop and HTTP parser,
  so it lives in a venv of its own under the work dir (GUIDELLM_VENV), made by the `guidellm` fixture on
  first use: it sees this venv's torch and transformers through a .pth file (guidellm imports torch; a
  second 800 MB copy would be installed otherwise) and installs the rest from PyPI, about 2.3 minutes
  here on a busy host (5.6 minutes with its own torch). Reused while its version matches.
- 200 connections that never finish their request head (issue 27 #5): /health still answers within a
  second, the server's log stays under 100 lines, and once the request timeout has passed they are
  answered 408 and closed. The server runs with a descriptor limit of 150 (as a small pod's could be), so
  200 connections would exhaust it: the connection cap keeps it below, closing the longest-waiting one.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fusedspec.core.settings import Settings, load_settings
from fusedspec.registry.publish import publish_artifact
from tests.fixtures.servers import free_port
from tests.fixtures.serving import FUSEDSPEC, ServeProcess

pytestmark = pytest.mark.slow
GUIDELLM_VERSION = "0.8.1"
GUIDELLM_VENV = load_settings().work_dir / f"guidellm-{GUIDELLM_VERSION}"
ACCESS_LINE = re.compile(r"fusedspec\.serve\.access: POST /v1/completions (\d+) prompt_tokens=(\d+) "
                         r"completion_tokens=(\d+)")
REFUSED_LINE = re.compile(r"fusedspec\.serve\.access: POST /v1/completions 400 .* error=(.+)")


@pytest.fixture(scope="session")
def guidellm() -> Path:
    binary = GUIDELLM_VENV / "bin" / "guidellm"
    marker = GUIDELLM_VENV / ".installed"
    if marker.is_file() and marker.read_text() == GUIDELLM_VERSION:
        return binary
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(GUIDELLM_VENV)], check=True, timeout=300)
    site = subprocess.run([str(GUIDELLM_VENV / "bin" / "python"), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                          check=True)
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # after guidellm's own site-packages: what it installs wins, torch and transformers come from ours
    (Path(site.stdout.strip()) / "zz-fusedspec-venv.pth").write_text(ours + "\n")
    done = subprocess.run([str(GUIDELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                           f"guidellm=={GUIDELLM_VERSION}"], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    marker.write_text(GUIDELLM_VERSION)
    print(f"guidellm {GUIDELLM_VERSION} installed in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return binary


@pytest.fixture(scope="module")
def version(serve_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("clients-store")
    return publish_artifact(serve_artifact, str(root), Settings(work_dir=root.parent / "work"),
                            unvalidated=True).version_uri


def test_guidellm_at_its_defaults_gets_every_request_answered_with_the_servers_token_counts(
        guidellm: Path, version: str, serve_artifact: Path, serve_process: Callable[..., ServeProcess],
        tmp_path: Path) -> None:
    port = free_port()
    server = serve_process([FUSEDSPEC, "serve", version, "--port", str(port)], port=port)
    server.wait_ready()
    # 4 streams at once (as many as the build's cache lines), 8 requests: bounded, and continuous batching
    done = subprocess.run(
        [str(guidellm), "run", "--backend",
         f"kind=openai_http,target={server.url},request_format=/v1/completions",
         "--profile", "kind=concurrent,streams=4", "--data",
         "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
         "--constraint", "kind=max_requests,count=8", "--tokenizer",
         f"kind=huggingface_auto,model={serve_artifact}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    # (it exits 0 even when all failed)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [benchmark] = json.loads((tmp_path / "benchmarks.json").read_text())["benchmarks"]
    requests = benchmark["requests"]
    assert (len(requests["successful"]), len(requests["errored"]),
            len(requests["incomplete"])) == (8, 0, 0), server.log_text()[-3000:]
    reported = [r["output_metrics"]["text_tokens"] for r in requests["successful"]]
    assert reported == [16] * 8  # ignore_eos: true, so every request runs to max_tokens
    served = [m.groups() for m in ACCESS_LINE.finditer(server.log_text())]
    assert [status for status, _, _ in served] == ["200"] * 8, server.log_text()[-3000:]
    assert sorted(int(c) for _, _, c in served) == sorted(reported)

    # A refused request is in the same log, with its status and the reason the client was given.
    refused = httpx.post(f"{server.url}/v1/completions",
                         json={"prompt": "hi", "max_tokens": 4, "temperature": 0.7}, timeout=30)
    assert refused.status_code == 400, refused.text
    deadline = time.monotonic() + 10  # the line is written once the response has gone out
    while not (lines := REFUSED_LINE.findall(server.log_text())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(lines) == 1 and "temperature" in lines[0], server.log_text()[-3000:]


def limited(limit: int, argv: list[str]) -> list[str]:
    """`argv` run with an open-file limit of `limit` (soft and hard: the server cannot raise it)."""
    code = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", code, *argv]


def test_connections_that_never_send_their_headers_do_not_take_the_server_down(
        version: str, serve_process: Callable[..., ServeProcess]) -> None:
    port, timeout = free_port(), 6
    server = serve_process(limited(150, [FUSEDSPEC, "serve", version, "--port", str(port),
                                         "--request-timeout", str(timeout)]), port=port)
    server.wait_ready()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft > 400, f"this test opens 200 sockets; the test process's open-file limit is {soft}"
    stalled = []
    for _ in range(200):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: serve\r\n")  # never the empty line that ends the head
        stalled.append(sock)
    seconds = []
    for _ in range(5):
        started = time.monotonic()
        answer = httpx.get(f"{server.url}/health", timeout=5)
        seconds.append(time.monotonic() - started)
        assert answer.status_code == 200
    assert max(seconds) < 1.0, seconds

    time.sleep(timeout + 2)  # past the request timeout: every stalled connection has been closed
    answered = closed = 0
    for sock in stalled:
        sock.settimeout(5)
        try:
            data = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            data = None
        answered += bool(data and data.startswith(b"HTTP/1.1 408"))
        closed += data is not None
        sock.close()
    assert closed == 200 and answered > 0, (closed, answered)
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    server.stop()
    log = server.log_text()
    assert len(log.splitlines()) < 100, log[-3000:]
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]
    assert f"did not arrive within {timeout} s" in log and "at the connection limit (" in log, log[-3000:]
