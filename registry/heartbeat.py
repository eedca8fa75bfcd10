"""A heartbeat: a function called in the background at a fixed interval while a block of work runs.

What keeps a build claim (registry.claims) and a publish attempt's marker (registry.attempts) alive
while their holder works; others take either over once its beats stop for a lease.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def heartbeat(every_seconds: float, beat: Callable[[], bool], name: str) -> Iterator[None]:
    """Call `beat` every `every_seconds` in a daemon thread until the block ends or a beat returns
    False. When the block is left the thread has stopped: no beat runs after it."""
    stop = threading.Event()

    def beating() -> None:
        while not stop.wait(every_seconds) and beat():
            pass

    thread = threading.Thread(target=beating, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
