"""What `fusedspec serve` does with hostile or sloppy requests, in process (the app over a real engine on the
tiny artifact, as tests/test_serve_timeout.py does): a huge body is 413 before it is in memory, a huge prompt
is tokenized off the event loop (the /health probe and the streams in flight do not wait for it), every error
is OpenAI's error document (an unknown route too), and booleans or strings are not taken for integers."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fusedspec.flows.cli import main
from fusedspec.serve.app import ServerState, create_app
from fusedspec.serve.engine import Engine
from fusedspec.serve.metrics import ServeMetrics
from fusedspec.serve.text import ArtifactText
from tests.fixtures.serving import SERVE_BUILD

LIMIT = 1 << 20  # the default
# The ASGI scope of a POST whose headers promise a 100-byte JSON body, for driving the app with a body
# that stops short (copied per call: the app may add to a scope)
PARTIAL_POST: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
    "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
    "client": ("127.0.0.1", 1), "server": ("serve", 80)}


@pytest.fixture(scope="module")
def state(build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any]) -> Iterator[ServerState]:
    artifact = build_tiny(**SERVE_BUILD)
    runner = cpu_runner(artifact)
    metrics = ServeMetrics(runner.spec.speculation_length)
    engine = Engine(runner, metrics, max_queue=0)
    engine.start()
    yield ServerState(engine=engine, text=ArtifactText(artifact), metrics=metrics, model_name="tiny", key="k",
                      seq_len=runner.layout.seq_len, request_timeout_s=30, max_body_bytes=LIMIT)
    engine.stop()


def ask(state: ServerState, work: Callable[[httpx.AsyncClient], Any]) -> Any:
    async def run() -> Any:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=30) as client:
            return await work(client)
    return asyncio.run(run())


def test_a_body_over_the_limit_is_413_naming_the_flag_sized_or_chunked(state: ServerState) -> None:
    huge = b'{"model": "tiny", "prompt": "' + b"a" * (LIMIT + 1) + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(huge), 65536):
            yield huge[start:start + 65536]

    async def small() -> AsyncIterator[bytes]:
        yield b'{"model": "tiny", "prompt": '
        yield b'"hi", "max_tokens": 2}'

    async def work(client: httpx.AsyncClient) -> list[httpx.Response]:
        headers = {"Content-Type": "application/json"}
        return [await client.post("/v1/completions", content=huge, headers=headers),
                await client.post("/v1/completions", content=chunks(), headers=headers),
                await client.post("/v1/completions", content=small(), headers=headers)]

    sized, chunked, fine = ask(state, work)
    for answer in (sized, chunked):
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]
        assert f"accepts at most {LIMIT} bytes (`fusedspec serve --max-request-bytes`)" in error["message"]
        assert error["code"] == "request_too_large"
    assert fine.status_code == 200, fine.text  # a chunked body under the limit is replayed to the app whole
    assert fine.json()["usage"]["completion_tokens"] == 2


def test_a_large_prompt_is_tokenized_off_the_event_loop(state: ServerState) -> None:
    prompt = "hello world " * ((LIMIT - 100) // 12)  # ~1 MiB of text: ~180k tokens, most of a second

    async def work(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
        big = asyncio.ensure_future(client.post("/v1/completions", json={"model": "tiny", "prompt": prompt}))
        worst, started = 0.0, time.perf_counter()
        while not big.done():  # a probe every 5 ms: how long the loop goes without answering one
            assert (await client.get("/health")).status_code == 200
            await asyncio.sleep(0.005)
            worst, started = max(worst, time.perf_counter() - started), time.perf_counter()
        return await big, worst

    refused, worst = ask(state, work)
    assert refused.status_code == 400 and \
        "compiled for prompts of at most" in refused.json()["error"]["message"]
    assert worst < 0.3, f"/health waited {worst:.2f} s behind a prompt's tokenization"


@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v1/nothing", 404, "there is no route /v1/nothing; this server answers /v1/completions"),
    ("GET", "/v1/completions", 405, "GET is not allowed on /v1/completions"),
    ("POST", "/v1/models", 405, "POST is not allowed on /v1/models"),
])
def test_unknown_routes_and_methods_are_openai_errors(state: ServerState, method: str, path: str, status: int,
                                                      words: str) -> None:
    answer = ask(state, lambda client: client.request(method, path))
    assert answer.status_code == status
    assert words in answer.json()["error"]["message"]


@pytest.mark.parametrize("body, words", [
    (b'{"model": "tiny", "prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}", "the body is not valid JSON"),
    (b'{"model": "tiny", "prompt": "\xff\xfe"}', "the body is not valid JSON"),
    (b'{"model": "tiny", "prompt": [true, false]}', "prompt.list[int].0: Input should be a valid integer"),
    (b'{"model": "tiny", "prompt": "hi", "max_tokens": true}', "max_tokens: Input should be a valid integer"),
    (b'{"model": "tiny", "prompt": "hi", "max_tokens": "3"}', "max_tokens: Input should be a valid integer"),
    (b'{"model": "tiny", "prompt": "hi", "stream": "yes"}', "stream: Input should be a valid boolean"),
])
def test_unparseable_bodies_and_loose_types_are_400_openai_errors(state: ServerState, body: bytes,
                                                                  words: str) -> None:
    answer = ask(state, lambda client: client.post("/v1/completions", content=body,
                                                   headers={"Content-Type": "application/json"}))
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]["message"]


@pytest.mark.parametrize("flags, words", [
    (["--request-timeout", "nan"], "--request-timeout nan must be a positive number of seconds"),
    (["--request-timeout", "inf"], "--request-timeout inf must be a positive number of seconds"),
    (["--max-request-bytes", "0"], "--max-request-bytes 0 must be 1 or more"),
])
def test_a_timeout_or_body_limit_that_is_not_a_number_is_refused_before_loading(
        flags: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_refused_at_once_not_after_verify_and_loading(
        serve_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.core.settings import Settings
    from fusedspec.registry.publish import publish_artifact

    version = publish_artifact(serve_artifact, str(tmp_path / "store"), Settings(work_dir=tmp_path / "work"),
                               unvalidated=True).version_uri
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        assert main(["serve", version, "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert time.monotonic() - started < 5 and "verified" not in out  # before the verify, before the load
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_client_that_leaves_before_its_body_arrives_is_counted_as_disconnected(state: ServerState) -> None:
    async def run() -> None:
        app = create_app(state)
        sent: list[dict[str, Any]] = []
        messages = iter([{"type": "http.request", "body": b'{"model": "tiny", ', "more_body": True},
                         {"type": "http.disconnect"}])

        async def receive() -> dict[str, Any]:
            return next(messages)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(dict(PARTIAL_POST), receive, send)

    def count(outcome: str) -> float:
        value = state.metrics.requests.labels(outcome=outcome)._value.get()  # noqa: SLF001
        return float(value)

    before = count("client_disconnected"), count("bad_request")
    asyncio.run(run())
    assert (count("client_disconnected"), count("bad_request")) == (before[0] + 1, before[1])


def test_a_body_that_never_arrives_is_408_within_the_request_timeout(state: ServerState) -> None:
    """Headers, part of a body, then nothing: the handler must not wait for ever (a few thousand such
    connections would otherwise hold every file descriptor)."""
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        app = create_app(dataclasses.replace(state, request_timeout_s=0.3))
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": b'{"model": "tiny", ', "more_body": True}
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(app(dict(PARTIAL_POST), receive, send), 5)

    asyncio.run(run())
    assert sent[0]["status"] == 408
    assert b"the request body did not arrive within 0.3 s" in sent[1]["body"]


@pytest.mark.parametrize("prompt, max_tokens, words, code", [
    ("", 2, "the prompt is empty", None),
    ([], 2, "the prompt is empty", None),
    ([-1], 2, "token id -1 outside the vocabulary", None),
    ([1] * 200, 1, "compiled for prompts of at most", "context_length_exceeded"),
    ([1], 10**30, "> seq_len=128", "context_length_exceeded"),
])
def test_prompt_refusals_carry_the_context_length_code_only_for_length(
        state: ServerState, prompt: Any, max_tokens: int, words: str, code: str | None) -> None:
    answer = ask(state, lambda client: client.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                           "max_tokens": max_tokens}))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert words in error["message"] and error["code"] == code
