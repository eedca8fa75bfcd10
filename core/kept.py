"""Values made from bytes, kept in this process by the bytes' sha256 (parsed tokenizers, deserialized
programs): one file read from many places is parsed once, and only its digest is held, not its bytes.

    KeptByContent(size).get(parts, make)   the value made from `parts` before, else make() kept; the
                                           newest `size` are kept, the least recently used dropped first
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")


class KeptByContent(Generic[V]):
    """Thread-safe. `make` runs outside the lock (it may take seconds): two threads missing one key at once
    both make it, and the value made last is kept. Kept values are shared: treat them as read-only."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: dict[tuple[bytes | None, ...], V] = {}  # least recently used first
        self._lock = threading.Lock()

    def get(self, parts: Sequence[bytes | None], make: Callable[[], V]) -> V:
        key = tuple(hashlib.sha256(part).digest() if part is not None else None for part in parts)
        with self._lock:
            if key in self._values:
                value = self._values[key] = self._values.pop(key)  # the most recently used again
                return value
        value = make()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                del self._values[next(iter(self._values))]
        return value
