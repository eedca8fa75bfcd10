"""The connection guard's log (issue 27 #5): an error the event loop reports over and over, as accept()
out of descriptors was, 208,892 times in 45 s, is logged once with its reason, then as counts, never per
attempt. (The slow-client test in tests/test_serve_clients.py runs the guard in a real server.)"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading

import pytest

from fusedspec.serve import connections
from fusedspec.serve.connections import ConnectionGuard


class Kept(logging.Handler):
    """The guard logger's records, taken on that logger itself: what pytest's caplog sees through the root
    depends on which handlers earlier tests in the worker left on the `fusedspec` loggers (it once saw each
    record twice)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == threading.get_ident():  # not another test's
            self.records.append(record)


def test_a_repeated_accept_error_is_logged_once_then_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = ConnectionGuard(header_timeout_s=5, max_connections=16)
    loop = asyncio.new_event_loop()
    context = {"message": "socket.accept() out of system resource",
               "exception": OSError(errno.EMFILE, "Too many open files")}
    clock = [1000.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: clock[0])  # the log's own clock, stepped here
    logger = logging.getLogger("fusedspec.serve")
    kept = Kept()
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(kept)
    try:
        for _ in range(20_000):  # as fast as a failing accept loop retries
            guard.loop_exception(loop, context)
            clock[0] += 0.001
        guard.summary()
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
        loop.close()
    lines = [r.getMessage() for r in kept.records]
    assert 1 < len(lines) <= 4, lines  # the first, a count every 10 s of the 20 s, the rest at shutdown
    assert lines[0] == "socket.accept() out of system resource: OSError: [Errno 24] Too many open files"
    counted = sum(int(line.rsplit("(", 1)[1].split(" more")[0]) for line in lines[1:])
    assert counted == 20_000 - 1 and not any(r.exc_info for r in kept.records)  # no traceback
