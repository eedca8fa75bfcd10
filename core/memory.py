"""The process's garbage collector: how often it runs, and giving the memory of dropped models back to the OS.

    tune_collector()                   CPython's generation-0 threshold raised to GEN0_THRESHOLD (by the
                                       import of fusedspec.flows: the CLI, flow runs, dask workers)
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
# Loading a program, torch.export and pydantic allocate millions of small objects that live as long as the
# program or the document, and at CPython's default of 700 the collector kept scanning them: a sixth of a
# tiny validation's CPU (bench/RESULTS.md). Only cyclic garbage waits longer: tensors are freed by reference
# counting, and release_freed_memory still collects at once after a large model. The Neuron isolation child
# keeps CPython's default: host memory, not CPU, is what limits an NxDI compile.
GEN0_THRESHOLD = 10_000


def tune_collector() -> None:
    young, older, oldest = gc.get_threshold()
    if 0 < young < GEN0_THRESHOLD:  # 0 (collection turned off) or a higher threshold: the process owner's
        gc.set_threshold(GEN0_THRESHOLD, older, oldest)


def release_freed_memory(held_bytes: int | None = None) -> None:
    if held_bytes is not None and held_bytes < RELEASE_FROM_BYTES:
        return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the collector's work is all we can do
        pass
