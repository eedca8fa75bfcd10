"""`fusedspec serve` under load and through a crash (issue 14, must-show 3), on loopback: a tiny cpu version
synced from SeaweedFS, 4 cache lines and a queue of 2, so 8 closed-loop clients overrun it.

- 8 clients for 15 s (bench/serve_load.py: 60 s): no error; the requests that find
  every line and queue place taken are answered 429 with Retry-After (and retried after it); every answer
  is the target's greedy output; the server's resident memory stays flat.
- kill -9 of the server while clients are mid-stream: every client ends with a connection error within its
  timeout, none hangs; the server restarted on the same port serves correct answers again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fusedspec.core.settings import Settings
from fusedspec.registry.publish import publish_artifact
from fusedspec.validate.prompts import load_tokenizer
from tests.fixtures.cpu_artifacts import PROMPT_TEXTS
from tests.fixtures.servers import free_port
from tests.fixtures.serving import FUSEDSPEC
from tests.support.load_clients import Case, client_for, run_load, stream_until_cut

pytestmark = pytest.mark.slow
LOAD_SECONDS = 15.0
CLIENTS = 8
NEW_TOKENS = 24


def greedy_cases(artifact: Path, hf_greedy: Callable[[list[int], int], list[int]]) -> list[Case]:
    tokenizer = load_tokenizer(artifact)
    return [Case(text, NEW_TOKENS, tuple(hf_greedy(list(tokenizer(text)["input_ids"]), NEW_TOKENS)))
            for text in PROMPT_TEXTS]


def test_eight_clients_get_correct_answers_or_429_with_flat_memory_and_survive_a_kill(
        seaweed, s3_bucket: str, s3_settings: Settings, serve_artifact: Path,  # noqa: ANN001
        serve_process: Callable[..., Any], hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    result = publish_artifact(serve_artifact, f"s3://{s3_bucket}/load", s3_settings, unvalidated=True)
    argv = [FUSEDSPEC, "serve", result.version_uri, "--queue-size", "2", "--request-timeout", "30"]
    port = free_port()
    server = serve_process([*argv, "--port", str(port)], env=seaweed.env(), port=port)
    print(f"time to ready (sync from S3, verify, load): {server.wait_ready():.1f} s")
    cases = greedy_cases(serve_artifact, hf_greedy)
    model = client_for(server.url).models.list().data[0].id

    rss: list[int] = []
    report = run_load(server.url, model, cases, clients=CLIENTS, seconds=LOAD_SECONDS,
                      on_tick=lambda: rss.append(server.rss_kib()))
    print(f"{report.completed} correct answers, {report.rejected} answered 429, {report.tokens_per_s:.0f} "
          f"tokens/s, median inter-token latency {report.median_itl_ms():.1f} ms, RSS "
          f"{rss[len(rss) // 4] // 1024}->{rss[-1] // 1024} MiB")
    assert report.errors == [] and report.wrong == []
    # Enough answers that every cache line was reused several times while memory was watched. How many come
    # in 15 s depends on how busy the host is (a fixed 50 failed under a profiler); throughput is the bench's.
    assert report.completed >= 3 * CLIENTS, report
    assert report.rejected > 0 and report.retry_after == {"1"}  # 8 clients > 4 lines + 2 queue places
    # Flat: after a warm-up quarter, the resident set moves by less than 5% (and 24 MiB) over the rest.
    settled = rss[len(rss) // 4:]
    assert max(settled) - min(settled) < max(24 * 1024, 0.05 * statistics.median(settled)), rss

    endings = stream_until_cut(server.url, model, Case(cases[0].prompt, 100, ()), cut=server.kill,
                               clients=CLIENTS, run_s=1.0, timeout=10)
    print(f"clients after kill -9: {sorted(endings)}")
    assert "hung" not in endings and len(endings) == CLIENTS
    assert any(ending.startswith("mid-stream:") for ending in endings)  # the kill did cut streams

    restarted = serve_process([*argv, "--port", str(port)], env=seaweed.env(), port=port)
    print(f"time to ready after the kill (the synced copy reused): {restarted.wait_ready():.1f} s")
    again = run_load(restarted.url, model, cases, clients=CLIENTS, seconds=1.5)
    assert again.errors == [] and again.wrong == [] and again.completed > 0
