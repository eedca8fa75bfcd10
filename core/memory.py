"""Giving the memory of dropped models back to the OS, for large models only.

    release_freed_memory(held_bytes)   a full collection and malloc_trim, when `held_bytes` (the weights of
                                       what was just dropped) is at least RELEASE_FROM_BYTES, or is None

Exports and transformers models leave cyclic garbage and freed heap behind (measured on the 0.5B pair,
bfloat16: +0.9 GiB resident per exported program that gc + malloc_trim give back), so four programs in one
build stacked up to a peak 3.5x the weights and a real 1.5B + 0.5B build was OOM-killed on a 24 GiB host.
Below the threshold a full collection of the process's heap costs more than it gives back: a tenth of a
tiny program's export (bench/RESULTS.md).
"""

from __future__ import annotations

import ctypes
import gc

RELEASE_FROM_BYTES = 256 << 20


def release_freed_memory(held_bytes: int | None = None) -> None:
    if held_bytes is not None and held_bytes < RELEASE_FROM_BYTES:
        return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the collector's work is all we can do
        pass
