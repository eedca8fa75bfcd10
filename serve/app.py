"""The HTTP side of `fusedspec serve` (FastAPI on uvicorn): OpenAI's completions and chat completions, with
SSE streaming, over the engine; /v1/models; /health, /ready and /metrics for the orchestrator.

    POST /v1/completions        prompt (text or token ids) -> the target's greedy continuation
    POST /v1/chat/completions   messages, rendered with the artifact's chat template
    GET  /v1/models             the one model served
    GET  /health                200 while the engine thread runs (liveness), else 503
    GET  /ready                 200 once the verified version is loaded and while the engine runs, else 503
    GET  /metrics               Prometheus text (serve/metrics.py)

Status codes: 400 a request the server cannot honour (malformed, a sampling parameter, a prompt or
max_tokens beyond the artifact's seq_len), 404 another model's name or an unknown route, 405 a wrong method,
408 a body that has not arrived within the request timeout, 413 a body larger than `max_body_bytes` (refused
before it is read into memory), 429 with Retry-After when every cache
line and queue place is taken, 503 when the engine is not running, 504 after the request timeout. A stream
that times out or fails ends with an error event, then `data: [DONE]`. A client that disconnects (a closed
stream, or an abandoned non-streaming request) frees its cache line at the next step. Every error, whatever
raised it, is OpenAI's error document.

Prompts are tokenized (and chat templates rendered) on one worker thread, not on the event loop: a large
prompt then never stalls the streams in flight or the /health probe while it is encoded (the tokenizer
releases the GIL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fusedspec.core.errors import PromptError
from fusedspec.serve.engine import Engine, EngineStopped, QueueFull, RequestStream, TokenEvent
from fusedspec.serve.metrics import ServeMetrics
from fusedspec.serve.protocol import ChatRequest, CompletionRequest, error_body
from fusedspec.serve.text import ArtifactText

RETRY_AFTER_S = 1  # a cache line frees up within a request's lifetime; a second is a fair first wait
DISCONNECT_POLL_S = 0.1  # how often a non-streaming request checks whether its client is still there
FINISH_REASONS = {"eos": "stop", "length": "length"}
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than any prompt an artifact's seq_len admits, as text or token ids
USAGE = "fusedspec.usage"  # ASGI scope key: what a request's access log line reports (tokens, the refusal)
access_log = logging.getLogger("fusedspec.serve.access")


@dataclass
class ServerState:
    engine: Engine
    text: ArtifactText
    metrics: ServeMetrics
    model_name: str
    key: str  # the version's content key
    seq_len: int
    request_timeout_s: float
    ready: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    on_shutdown: Callable[[], None] | None = None  # e.g. the connection guard's last counts


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, outcome: str, *, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.outcome, self.code = status, message, kind, outcome, code
        self.headers = headers


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.ready = state.engine.alive
        yield
        state.ready = False  # draining: the orchestrator stops sending traffic first
        state.engine.stop()
        if state.on_shutdown is not None:
            state.on_shutdown()
        text_thread.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="fusedspec serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=state.max_body_bytes, timeout=state.request_timeout_s,
                       metrics=state.metrics)
    app.add_middleware(AccessLog)  # outermost: the body's 408 and 413 are logged too
    # One thread for the tokenizer: off the event loop, and never two encodes of one tokenizer at once.
    text_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusedspec-text")

    async def off_loop(work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(text_thread, work, *args)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        state.metrics.outcome(exc.outcome)
        request_usage(request)["error"] = exc.message
        return JSONResponse(error_body(exc.message, exc.kind, code=exc.code), status_code=exc.status,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        state.metrics.outcome("bad_request")
        request_usage(request)["error"] = message = describe_validation(exc)
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """An unknown route, a wrong method, a body FastAPI cannot parse: OpenAI's error document too. A
        client that left before its body arrived is a disconnection, not a bad request (nobody reads this)."""
        state.metrics.outcome("client_disconnected" if isinstance(exc.__cause__, ClientDisconnect)
                              else "bad_request")
        message = {404: f"there is no route {request.url.path}; this server answers /v1/completions, "
                        "/v1/chat/completions, /v1/models, /health, /ready and /metrics",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code)
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            message = "the body is not valid JSON (it does not parse as UTF-8 JSON within Python's limits)"
        request_usage(request)["error"] = message or str(exc.detail)
        return JSONResponse(error_body(message or str(exc.detail), "invalid_request_error"),
                            status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.engine.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "failed", "reason": state.engine.failure or "stopped"},
                            status_code=503)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if state.ready and state.engine.alive:
            return JSONResponse({"status": "ready", "model": state.model_name, "key": state.key})
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "fusedspec", "root": state.key,
                                            "max_model_len": state.seq_len}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_request(state, body)
        prompts = [body.truncated(item if isinstance(item, list) else
                                  await off_loop(state.text.encode_prompt, item, body.add_special_tokens))
                   for item in body.prompts]
        return await generate(state, request, body, prompts, body.max_tokens, completion_shapes)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        check_request(state, body)
        messages = [message.for_template() for message in body.messages]
        try:
            prompt = await off_loop(state.text.encode_chat, messages, body.template_inputs(),
                                    body.add_special_tokens)
        except PromptError as exc:
            raise ApiError(400, str(exc), "invalid_request_error", "bad_request") from None
        return await generate(state, request, body, [body.truncated(prompt)], body.token_limit, chat_shapes)

    return app


def request_usage(request: Request) -> dict[str, Any]:
    return request.scope.setdefault(USAGE, {})  # type: ignore[no-any-return]


class AccessLog:
    """One line per request, on by default (`fusedspec serve --no-access-log`): method, path, status, tokens
    in and out, seconds to the last byte, and a refusal's reason, so a 400 is visible where an operator
    looks. Logged when the response has been sent (a stream: at its end) or the client went away."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access_log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        usage: dict[str, Any] = scope.setdefault(USAGE, {})
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            tokens = (f" prompt_tokens={usage['prompt_tokens']} "
                      f"completion_tokens={usage['completion_tokens']}"
                      if "prompt_tokens" in usage else "")
            error = f" error={str(usage['error'])[:300]!r}" if "error" in usage else ""
            client = scope.get("client")
            access_log.info("%s %s %s%s %.3f s%s%s", scope["method"], scope["path"], status or "-", tokens,
                            time.perf_counter() - started, error,
                            f" client={client[0]}:{client[1]}" if client else "")


class BodyLimit:
    """The whole body, read before the app sees it, within bounds: 413 for one over `limit` bytes (at once for
    a Content-Length over it, else as soon as what arrived passes it), 408 for one that has not arrived within
    `timeout` seconds (a client that sends headers and then nothing would otherwise hold its connection and
    handler for ever). What arrived is replayed to the app; a client that left meanwhile is not answered."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float, metrics: ServeMetrics):
        self.app, self.limit, self.timeout, self.metrics = app, limit, timeout, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(scope, receive, send, 413,
                               f"the request body is {length.decode(errors='replace')} "
                               f"bytes; {self._accepts}", "request_too_large")
            return
        chunks: list[bytes] = []
        size, more = 0, True
        try:
            async with asyncio.timeout(self.timeout):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        self.metrics.outcome("client_disconnected")
                        return
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    more = message.get("more_body", False)
                    if size > self.limit:
                        await self._refuse(scope, receive, send, 413,
                                           f"the request body is over {self.limit} bytes; {self._accepts}",
                                           "request_too_large")
                        return
        except TimeoutError:
            await self._refuse(scope, receive, send, 408,
                               f"the request body did not arrive within {self.timeout:g} s "
                               f"(the server's request timeout; {size} bytes came)", "request_timeout")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: http.disconnect, when the client leaves
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    @property
    def _accepts(self) -> str:
        return f"this server accepts at most {self.limit} bytes (`fusedspec serve --max-request-bytes`)"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str,
                      code: str) -> None:
        self.metrics.outcome("bad_request" if status == 413 else "timeout")
        scope.setdefault(USAGE, {})["error"] = message
        response = JSONResponse(error_body(message, "invalid_request_error", code=code), status_code=status,
                                headers={"Connection": "close"})
        await response(scope, receive, send)


def describe_validation(exc: RequestValidationError) -> str:
    """One line per problem: the field's path and what is wrong with it."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        if error.get("type") == "json_invalid":
            lines.append(f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})")
        elif not where:  # a form or a bare string where the JSON object belongs
            lines.append("the body must be a JSON object, sent with Content-Type: application/json")
        else:
            lines.append(f"{where or 'body'}: {error.get('msg')}")
    return "invalid request: " + "; ".join(lines)


def check_request(state: ServerState, body: CompletionRequest | ChatRequest) -> None:
    if body.model is not None and body.model != state.model_name:  # no model: the one served (as vLLM)
        raise ApiError(404, f"model {body.model!r} does not exist; this server serves {state.model_name!r}",
                       "invalid_request_error", "bad_request", code="model_not_found")
    unsupported = body.unsupported()
    if unsupported:
        raise ApiError(400, "unsupported parameters: " + "; ".join(unsupported), "invalid_request_error",
                       "bad_request")


# ---- generation --------------------------------------------------------------------------------------------

def _completion_choice(index: int, text: str, ids: list[int], finish: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "token_ids": ids}


def _chat_choice(index: int, text: str, ids: list[int], finish: str | None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish, "token_ids": ids}


def _chat_delta(index: int, text: str, ids: list[int], finish: str | None) -> dict[str, Any]:
    delta = {"content": text} if text or finish is None else {}
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": ids}


# (object of a full response, its choice, object of a stream chunk, the chunk's choice)
completion_shapes = ("text_completion", _completion_choice, "text_completion", _completion_choice)
chat_shapes = ("chat.completion", _chat_choice, "chat.completion.chunk", _chat_delta)


async def generate(state: ServerState, request: Request, body: CompletionRequest | ChatRequest,
                   prompts: list[list[int]], limit: int | None, shapes: tuple[Any, ...]) -> Response:
    """Check every prompt, admit them all (one choice each) or answer 429, then the reply."""
    budgets = []
    for i, prompt in enumerate(prompts):
        max_tokens = limit if limit is not None else max(1, state.seq_len - len(prompt))  # null: what is left
        try:
            state.engine.check(prompt, max_tokens)
        except PromptError as exc:
            # OpenAI's code for a prompt or max_tokens beyond the context; an empty prompt or an id outside
            # the vocabulary is another mistake (both length refusals name seq_len, the others do not)
            code = "context_length_exceeded" if "seq_len" in str(exc) else None
            where = f"prompt {i}: " if len(prompts) > 1 else ""
            raise ApiError(400, where + str(exc), "invalid_request_error", "bad_request", code=code) from None
        budgets.append(max_tokens)
    eos = body.eos_token_ids(state.engine.target_eos)
    try:
        streams = state.engine.submit_all([(p, n, eos) for p, n in zip(prompts, budgets, strict=True)],
                                          asyncio.get_running_loop())
    except QueueFull as exc:
        raise ApiError(429, str(exc), "rate_limit_error", "rejected_queue_full", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineStopped as exc:
        raise ApiError(503, str(exc), "server_error", "error") from None
    prefix = "chatcmpl" if shapes is chat_shapes else "cmpl"  # OpenAI's id prefixes
    reply = Reply(state, streams, prompts, shapes, f"{prefix}-{body.request_id or uuid.uuid4().hex}",
                  int(time.time()), skip_special_tokens=body.skip_special_tokens,
                  include_stop=bool(body.include_stop_str_in_output),
                  usage=request_usage(request))
    if body.stream:
        return StreamingResponse(reply.events(body.include_usage, body.continuous_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await reply.whole(request)


class Reply:
    """One request's answer, whole or as a stream of server-sent events: a choice per admitted prompt."""

    def __init__(self, state: ServerState, streams: list[RequestStream], prompts: list[list[int]],
                 shapes: tuple[Any, ...], response_id: str, created: int, *, skip_special_tokens: bool = True,
                 include_stop: bool = False,
                 usage: dict[str, Any] | None = None):
        self.state, self.streams, self.prompts = state, streams, prompts
        self.full_object, self.full_choice, self.chunk_object, self.chunk_choice = shapes
        self.id, self.created = response_id, created
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop  # the text keeps the EOS or stop token ending a choice (vLLM: no)
        self.deadline = time.monotonic() + state.request_timeout_s
        self.tokens: list[list[int]] = [[] for _ in streams]
        self.usage = usage if usage is not None else {}  # what the access log line reports
        self.usage["prompt_tokens"] = sum(len(p) for p in prompts)
        self.usage["completion_tokens"] = 0

    def _got(self, index: int, tokens: tuple[int, ...]) -> None:
        self.tokens[index] += tokens
        self.usage["completion_tokens"] += len(tokens)

    def _usage(self, index: int | None = None) -> dict[str, int]:
        """Of one choice (a stream chunk's running count) or of the whole request."""
        prompt = sum(map(len, self.prompts)) if index is None else len(self.prompts[index])
        completion = sum(map(len, self.tokens)) if index is None else len(self.tokens[index])
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _document(self, kind: str, choices: list[dict[str, Any]],
                  usage: dict[str, int] | None) -> dict[str, Any]:
        document: dict[str, Any] = {"id": self.id, "object": kind, "created": self.created,
                                    "model": self.state.model_name, "choices": choices}
        if usage is not None:
            document["usage"] = usage
        return document

    def _finish_reason(self, event: TokenEvent) -> str:
        return FINISH_REASONS.get(event.finish or "", "stop")

    def _cancel_all(self) -> None:
        for stream in self.streams:
            self.state.engine.cancel(stream)

    async def _collect(self, index: int) -> str:
        """Every token of one choice; its finish reason. An engine failure is the client's 500."""
        while True:
            event = await self.streams[index].next()
            if event.finish == "error":
                raise ApiError(500, event.error or "the engine failed", "server_error", "error")
            self._got(index, event.tokens)
            if event.finish is not None:
                return self._finish_reason(event)

    async def whole(self, request: Request) -> Response:
        """Wait for every choice's last token, watching the deadline and whether the client is still there."""
        tasks = [asyncio.ensure_future(self._collect(i)) for i in range(len(self.streams))]
        try:
            pending: set[asyncio.Future[str]] = set(tasks)
            while pending:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self._cancel_all()
                    raise ApiError(504,
                                   f"the request did not finish within {self.state.request_timeout_s:g} s "
                                   "(the server's request timeout); its cache line was freed",
                                   "timeout", "timeout")
                _done, pending = await asyncio.wait(pending, timeout=min(remaining, DISCONNECT_POLL_S),
                                                    return_when=asyncio.FIRST_EXCEPTION)
                failed = [task for task in _done if task.exception() is not None]
                if failed:
                    self._cancel_all()
                    raise failed[0].exception()  # type: ignore[misc]
                if pending and await request.is_disconnected():
                    self._cancel_all()
                    self.state.metrics.outcome("client_disconnected")
                    return Response(status_code=499)  # nobody reads it
        finally:
            for task in tasks:
                task.cancel()
        self.state.metrics.outcome("completed")
        choices = [self.full_choice(i, self._decode(self.tokens[i], stopped=task.result() == "stop"),
                                    list(self.tokens[i]), task.result())
                   for i, task in enumerate(tasks)]
        return JSONResponse(self._document(self.full_object, choices, self._usage()))

    def _decode(self, ids: list[int], *, stopped: bool = False) -> str:
        """A choice's text; one that EOS or a stop token ended is without that token, as vLLM answers,
        unless the request asked for it (include_stop_str_in_output). Its token ids keep it."""
        shown = ids[:-1] if stopped and ids and not self.include_stop else ids
        return self.state.text.decode(shown, skip_special_tokens=self.skip_special_tokens)

    async def events(self, include_usage: bool, continuous_usage: bool) -> AsyncIterator[str]:
        """SSE: chunks of each step's tokens (per choice, as they come), a last chunk per choice with its
        finish reason, the usage when asked for, [DONE]. A client that goes away cancels this generator
        (Starlette), and the finally block frees the lines."""
        merged: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()

        async def pump(index: int) -> None:
            while True:
                event = await self.streams[index].next()
                await merged.put((index, event))
                if event.finish is not None:
                    return

        pumps = [asyncio.ensure_future(pump(i)) for i in range(len(self.streams))]
        decoders = [self.state.text.decoder(skip_special_tokens=self.skip_special_tokens)
                    for _ in self.streams]
        open_choices = set(range(len(self.streams)))
        done = False
        try:
            if self.chunk_object == "chat.completion.chunk":  # the role comes first, as OpenAI sends it
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}
                yield sse(self._document(self.chunk_object, [first],
                                         self._usage(0) if continuous_usage else None))
            while open_choices:
                try:
                    async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                        index, event = await merged.get()
                except TimeoutError:
                    self._cancel_all()
                    self.state.metrics.outcome("timeout")
                    done = True
                    yield sse(error_body("the request did not finish within "
                                         f"{self.state.request_timeout_s:g} s (the server's request timeout)",
                                         "timeout"))
                    break
                if event.finish == "error":
                    self._cancel_all()
                    self.state.metrics.outcome("error")
                    done = True
                    yield sse(error_body(event.error or "the engine failed", "server_error"))
                    break
                self._got(index, event.tokens)
                finish = self._finish_reason(event) if event.finish is not None else None
                text = decoders[index].add(event.tokens, final=finish is not None,
                                           drop_last=event.finish == "eos" and not self.include_stop)
                if text or event.tokens or finish:
                    choice = self.chunk_choice(index, text, list(event.tokens), finish)
                    yield sse(self._document(self.chunk_object, [choice],
                                             self._usage(index) if continuous_usage else None))
                if finish is not None:
                    open_choices.discard(index)
            else:
                done = True
                self.state.metrics.outcome("completed")
                if include_usage:
                    yield sse(self._document(self.chunk_object, [], self._usage()))
            yield "data: [DONE]\n\n"
        finally:
            for task in pumps:
                task.cancel()
            if not done:  # the client went away mid-stream
                self._cancel_all()
                self.state.metrics.outcome("client_disconnected")


def sse(document: dict[str, Any]) -> str:
    return f"data: {json.dumps(document, separators=(',', ':'))}\n\n"
