"""Connections of `fusedspec serve`: slow clients cannot hold it, and a failing accept loop logs once.

    guard = ConnectionGuard(header_timeout_s=120, max_connections=512)
    config = uvicorn.Config(app, http=guard.protocol(), loop="asyncio", backlog=guard.backlog, ...)
    loop.set_exception_handler(guard.loop_exception)      # repeated loop errors: once, then a count
    guard.summary()                                       # at shutdown: what was closed or suppressed

uvicorn starts its request timeout (ours: the body's, serve.app.BodyLimit) only once the headers have
arrived, and its keep-alive timer stops at the first byte of the next request, so a client that sends a
request line and then nothing (or one header a minute) holds a connection, a file descriptor and a
parser for ever. Two hundred of them exhausted a pod's descriptors: accept() then failed in a loop
and logged each failure with its traceback. So:

- every connection waiting for a request head (new, or kept alive between requests) has until
  `header_timeout_s` for the request line and headers; then it is answered 408 and closed;
- at most `max_connections` are open, kept below the descriptors the process has left when it starts, less
  ACCEPT_TURNS listen backlogs (asyncio accepts that many at once, and a closed connection frees its
  descriptor only some turns of the loop later) and DESCRIPTOR_RESERVE, so accept() does not run out of
  them; a new connection beyond that closes the one that has waited longest for its request head, so a probe
  always gets in while idle or stalled clients make room (connections busy with a request are never evicted;
  when all are busy, the new one is closed at once);
- an error the event loop reports over and over (accept() out of descriptors) is logged once with its
  reason, then counted, and the count is logged at most every `REPEAT_LOG_S` seconds and at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("fusedspec.serve")
REPEAT_LOG_S = 10.0
DESCRIPTOR_RESERVE = 32  # descriptors left free beyond those open at start (a log file, a new thread's, ...)
DEFAULT_BACKLOG = 2048  # uvicorn's: the listen queue, and how many connections asyncio accepts per wake-up
MIN_BACKLOG = 16
ACCEPT_TURNS = 4  # loop turns from accept() to a closed connection's descriptor being free again
_TIMEOUT_TEXT = b"the request line and headers did not arrive within the request timeout\n"
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                    b"content-length: " + str(len(_TIMEOUT_TEXT)).encode() + b"\r\n\r\n" + _TIMEOUT_TEXT)


def free_descriptors() -> int:
    """Descriptors this process may still open: its open-file limit (raised to the hard limit first: the
    soft default is often 1024) less those open now (sockets, the loop, libraries' own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    limit = int(soft) if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    return limit - in_use


class ConnectionGuard:
    def __init__(self, header_timeout_s: float, max_connections: int):
        self.header_timeout_s = header_timeout_s
        free = free_descriptors()
        # asyncio accepts up to `backlog` connections per wake-up, runs their connection_made a turn later (a
        # task), and a connection closed meanwhile gives its descriptor back a turn after that; a busy loop
        # takes a batch on each of those turns, so the cap leaves room for ACCEPT_TURNS whole batches.
        self.backlog = max(MIN_BACKLOG, min(DEFAULT_BACKLOG, free // (2 * ACCEPT_TURNS)))
        self.max_connections = max(1, min(max_connections,
                                          free - ACCEPT_TURNS * self.backlog - DESCRIPTOR_RESERVE))
        # awaiting a request head, oldest first
        self.waiting: OrderedDict[GuardedProtocol, float] = OrderedDict()
        self.open = 0
        self.repeats = RepeatedLog(log)

    def protocol(self) -> type[H11Protocol]:
        """The HTTP protocol class uvicorn instantiates per connection, bound to this guard."""
        return type("GuardedProtocol", (GuardedProtocol,), {"guard": self})

    # ---- connections -------------------------------------------------------------------------------------

    def opened(self, connection: GuardedProtocol) -> bool:
        """Count a new connection; False when it must be closed (every slot busy with a request)."""
        self.open += 1
        if self.open <= self.max_connections:
            return True
        if self.waiting:
            oldest = next(iter(self.waiting))
            self.repeats.note("evicted", f"at the connection limit ({self.max_connections}): closed the "
                                         "connection that had waited longest for its request head")
            oldest.close_waiting(respond=False)
            return True
        self.repeats.note("refused", f"at the connection limit ({self.max_connections}) with every "
                                     "connection busy: closed a new connection at once "
                                     "(`fusedspec serve --max-connections`)")
        return False

    def closed(self, connection: GuardedProtocol) -> None:
        self.open -= 1
        self.waiting.pop(connection, None)

    def timed_out(self) -> None:
        self.repeats.note("header-timeout", "closed a connection whose request line and headers did not "
                                            f"arrive within {self.header_timeout_s:g} s (the request "
                                            "timeout)")

    # ---- the event loop's own errors -----------------------------------------------------------------------

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's exception handler: one line per kind of error, then counts (never a traceback per
        failed accept)."""
        exc = context.get("exception")
        reason = f"{context.get('message', 'event loop error')}: {type(exc).__name__}: {exc}" if exc else \
            str(context.get("message", "event loop error"))
        self.repeats.note(reason, reason)

    def summary(self) -> None:
        self.repeats.flush()


class RepeatedLog:
    """The first occurrence of each kind logged as it happens; later ones counted, and the count logged at
    most every REPEAT_LOG_S seconds (and by flush)."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.counts: dict[str, tuple[str, int, float]] = {}  # kind -> (message, unlogged count, last logged)

    def note(self, kind: str, message: str) -> None:
        now = time.monotonic()
        if kind not in self.counts:
            self.logger.warning("%s", message)
            self.counts[kind] = (message, 0, now)
            return
        message, count, last = self.counts[kind]
        count += 1
        if now - last >= REPEAT_LOG_S:
            self.logger.warning("%s (%d more times in the last %.0f s)", message, count, now - last)
            count, last = 0, now
        self.counts[kind] = (message, count, last)

    def flush(self) -> None:
        now = time.monotonic()
        for kind, (message, count, last) in self.counts.items():
            if count:
                self.logger.warning("%s (%d more times in the last %.0f s)", message, count, now - last)
                self.counts[kind] = (message, 0, now)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head and the guard's connection limit."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._head_deadline: asyncio.TimerHandle | None = None
        if not self.guard.opened(self):
            transport.close()
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self.guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._has_request():
            self._stop_waiting()
        elif self._head_deadline is None:  # the next request of a kept-alive connection has begun
            self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._has_request():
            self._await_head()

    def _has_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _await_head(self) -> None:
        self._stop_waiting()
        self._head_deadline = self.loop.call_later(self.guard.header_timeout_s, self._head_timed_out)
        self.guard.waiting[self] = time.monotonic()

    def _stop_waiting(self) -> None:
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()  # type: ignore[union-attr]
            self._head_deadline = None
        self.guard.waiting.pop(self, None)

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if not self._has_request():
            self.guard.timed_out()
            self.close_waiting(respond=True)

    def close_waiting(self, *, respond: bool) -> None:
        """Close a connection that has no request in progress (a 408 first when `respond`)."""
        self._stop_waiting()
        if self.transport.is_closing():
            return
        if respond:
            self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()
