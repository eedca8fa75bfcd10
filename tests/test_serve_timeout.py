"""The per-request timeout of `fusedspec serve` (serve/app.py), in process: the app over a real engine
on the tiny artifact, with a timeout no request can meet. A whole answer is 504 and a stream ends with an
error event then [DONE]; either way the request's cache line is freed, and the engine serves the next
request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from fusedspec.serve.app import ServerState, create_app
from fusedspec.serve.engine import Engine
from fusedspec.serve.metrics import ServeMetrics
from fusedspec.serve.text import ArtifactText
from tests.fixtures.serving import SERVE_BUILD


def test_a_request_past_its_timeout_is_cancelled_and_its_line_freed(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any]) -> None:
    artifact = build_tiny(**SERVE_BUILD)
    runner = cpu_runner(artifact)
    metrics = ServeMetrics(runner.spec.speculation_length)
    engine = Engine(runner, metrics, max_queue=0)
    state = ServerState(engine=engine, text=ArtifactText(artifact), metrics=metrics, model_name="tiny",
                        key="k", seq_len=runner.layout.seq_len, request_timeout_s=1e-6)
    engine.start()
    try:
        asyncio.run(_ask(state))
        deadline = time.monotonic() + 10
        while engine.in_flight and time.monotonic() < deadline:  # the cancellations reach the engine thread
            time.sleep(0.05)
        assert engine.in_flight == 0 and engine.alive
        text = metrics.exposition().decode()
        assert 'fusedspec_requests_total{outcome="timeout"} 2.0' in text
    finally:
        engine.stop()


async def _ask(state: ServerState) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 100}
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
        whole = await client.post("/v1/completions", json=body)
        assert whole.status_code == 504
        assert "did not finish within 1e-06 s (the server's request timeout)" in \
            whole.json()["error"]["message"]
        streamed = await client.post("/v1/completions", json={**body, "stream": True})
        events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["type"] == "timeout"
