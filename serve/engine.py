"""The engine: one thread owns the runner's ContinuousBatcher and steps it; requests come and go by messages.

    engine = Engine(runner, metrics, max_queue=16); engine.start()
    stream = engine.submit(prompt_ids, max_new_tokens, loop)   # QueueFull when lines + max_queue are taken
    streams = engine.submit_all([(ids, n, eos), ...], loop)     # a batch: all admitted, or none
    event = await stream.next()                                 # TokenEvent: new tokens, finish reason
    engine.cancel(stream)                                       # a client went away: its line is free again

Admission control happens at submit, in the caller's thread: at most `lines + max_queue` requests are in
the engine (decoding in a cache line, or waiting for one); one more is refused at once with QueueFull, so a
client is told to come back (HTTP 429) instead of waiting behind an unbounded queue. The batcher itself is
touched by the engine thread alone (its caches are one thread's), so submissions and cancellations reach it
through an inbox the thread drains before every step. Each step's tokens go back to the asyncio loop of the
request's handler with call_soon_threadsafe. A step that raises fails every request in flight and stops the
engine: /health then answers 503, and the orchestrator restarts the server.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fusedspec.compile.backend import LineEvent, Runner, StepReport
from fusedspec.core.errors import PromptError
from fusedspec.serve.metrics import ServeMetrics

IDLE_WAIT_S = 0.5  # an idle engine waits on its inbox this long at a time (any message wakes it at once)


class QueueFull(Exception):
    """Every cache line is taken and max_queue requests wait: come back later."""


class EngineStopped(Exception):
    """The engine is not running (stopped, or failed: its reason is the message)."""


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request; `finish` is set on its last event ("eos", "length", "cancelled",
    "error")."""

    tokens: tuple[int, ...]
    finish: str | None = None
    error: str | None = None


@dataclass(eq=False)
class RequestStream:
    """One request's side of the engine: the events of its tokens, in order, on its handler's loop."""

    id: str
    loop: asyncio.AbstractEventLoop
    submitted_at: float = field(default_factory=time.perf_counter)
    last_tokens_at: float | None = None  # engine thread only
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)

    async def next(self) -> TokenEvent:
        return await self.events.get()

    def deliver(self, event: TokenEvent) -> None:
        """From the engine thread; a handler whose loop is gone no longer listens."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass


@dataclass(frozen=True)
class _Submit:
    stream: RequestStream
    prompt: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _Cancel:
    stream: RequestStream


class _Stop:
    pass


class Engine:
    def __init__(self, runner: Runner, metrics: ServeMetrics, *, max_queue: int, speculate: bool = True):
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0")
        self.runner, self.metrics, self.speculate = runner, metrics, speculate
        self.lines = runner.lines
        self.capacity = self.lines + max_queue
        self._batcher = runner.batcher(speculate=speculate)
        self._inbox: queue.SimpleQueue[_Submit | _Cancel | _Stop] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # in the engine: submitted, not finished
        self._lock = threading.Lock()  # guards _streams between handlers (submit) and the engine thread
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="fusedspec-engine", daemon=True)
        self.failure: str | None = None

    # ---- the handlers' side --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """The thread runs and has not failed (what /health reports)."""
        return self._thread.is_alive() and self.failure is None

    @property
    def target_eos(self) -> frozenset[int]:
        """The target's EOS ids: what ends a request unless it asks otherwise (ignore_eos, stop_token_ids)."""
        return self.runner.target_eos()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        """PromptError unless the artifact can run this request (prompt length, seq_len, vocabulary). Reads
        the layout only, so any thread may call it."""
        self.runner.check_prompt(prompt_ids, max_new_tokens)

    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int, loop: asyncio.AbstractEventLoop,
               eos_token_ids: Sequence[int] | None = None) -> RequestStream:
        """Admit a checked request, or raise QueueFull (capacity reached) or EngineStopped. eos_token_ids:
        what ends it early (None: the target's EOS; []: only max_new_tokens)."""
        return self.submit_all([(prompt_ids, max_new_tokens, eos_token_ids)], loop)[0]

    def submit_all(self, requests: Sequence[tuple[Sequence[int], int, Sequence[int] | None]],
                   loop: asyncio.AbstractEventLoop) -> list[RequestStream]:
        """Admit every request of a batch (one per prompt of a completion) or none: QueueFull when they do
        not all fit."""
        if not self.alive:
            raise EngineStopped(self.failure or "the engine is stopped")
        with self._lock:
            if len(self._streams) + len(requests) > self.capacity:
                many = f"{len(requests)} prompts do not fit: " if len(requests) > 1 else ""
                raise QueueFull(f"{many}all {self.lines} cache lines are decoding and "
                                f"{self.capacity - self.lines} requests are waiting; retry later")
            streams = [RequestStream(id=f"req-{next(self._ids)}", loop=loop) for _ in requests]
            for stream in streams:
                self._streams[stream.id] = stream
        for stream, (prompt, max_new_tokens, eos) in zip(streams, requests, strict=True):
            self._inbox.put(_Submit(stream, tuple(prompt), max_new_tokens,
                                    None if eos is None else tuple(eos)))
        return streams

    def cancel(self, stream: RequestStream) -> None:
        """Free the request's line (or queue place); nothing happens when it has finished already."""
        self._inbox.put(_Cancel(stream))

    # ---- the engine thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if not self._take_messages(wait=self._batcher.idle):
                    return
                if not self._batcher.idle:
                    self._dispatch(self._batcher.step())
                self._record_load()
        except Exception as exc:  # noqa: BLE001 - a failed step ends the engine; every client is told why
            self.failure = f"the engine failed: {type(exc).__name__}: {exc}"
            with self._lock:
                streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                stream.deliver(TokenEvent((), "error", self.failure))

    def _take_messages(self, *, wait: bool) -> bool:
        """Apply every message in the inbox (waiting for one when idle); False on _Stop."""
        try:
            message = self._inbox.get(timeout=IDLE_WAIT_S) if wait else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(message, _Stop):
                return False
            if isinstance(message, _Submit):
                self._admit(message)
            else:
                self._cancel(message.stream)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _admit(self, message: _Submit) -> None:
        try:
            self._batcher.submit(message.prompt, message.max_new_tokens, message.eos_token_ids,
                                 request_id=message.stream.id)
        except PromptError as exc:
            # the handler checked it already; should the batcher still refuse it, say so
            with self._lock:
                self._streams.pop(message.stream.id, None)
            message.stream.deliver(TokenEvent((), "error", str(exc)))

    def _cancel(self, stream: RequestStream) -> None:
        with self._lock:
            if self._streams.pop(stream.id, None) is None:
                return  # finished before the cancellation arrived
        try:
            self._batcher.cancel(stream.id)
        except PromptError:
            pass  # not in the batcher yet cannot be: submissions come first in the inbox
        stream.deliver(TokenEvent((), "cancelled"))

    def _dispatch(self, report: StepReport) -> None:
        now = time.perf_counter()
        if report.decoded:
            self.metrics.step(report.step_s, [len(event.tokens) for event in report.decoded])
        for event in report.events:
            self._deliver(event, now)

    def _record_load(self) -> None:
        """Queue depth and busy lines after this round (a cancellation changes them without a step)."""
        active = len(self._batcher.active_lines)
        with self._lock:
            in_engine = len(self._streams)
        self.metrics.load(waiting=max(0, in_engine - active), active=active)

    def _deliver(self, event: LineEvent, now: float) -> None:
        with self._lock:
            stream = self._streams.get(str(event.request_id))
            if stream is not None and event.completion is not None:
                del self._streams[stream.id]
        if stream is None:
            return  # cancelled in between
        if event.prefill:
            self.metrics.first_token(now - stream.submitted_at)
        elif stream.last_tokens_at is not None and event.tokens:
            self.metrics.tokens_arrived(now - stream.last_tokens_at, len(event.tokens))
        stream.last_tokens_at = now
        finish = event.completion.reason if event.completion is not None else None
        stream.deliver(TokenEvent(event.tokens, finish))
