"""torch.export (strict) of both programs with static shapes, saved without weights; optional AOTInductor.

A program's inputs are (weights, tokens/state, caches); the weights are graph inputs, not
parameters, so a saved program holds no weights: the artifact's `weights/tp{r}_...safetensors` are the
only copy and are bound at load. Caches are inputs mutated in place (the graph signature records it).
Every shape is static: the program accepts exactly the batch, context, cache length and shard shapes
it was exported with.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

import torch

from compile.cpu.model import Decoder, Weights, new_caches
from compile.cpu.programs import ContextEncoding, FusedStep

PROGRAMS = ("context_encoding", "fused_step")
EXPORT_SUFFIX = ".pt2"
AOTI_SUFFIX = ".aoti.pt2"


class Program(Protocol):
    def __call__(self, *args: Any) -> Any: ...


def example_inputs(name: str, target: Decoder, draft: Decoder, weights: Weights, *, batch: int,
                   context_len: int, cache_len: int, dtype: torch.dtype) -> tuple[Any, ...]:
    """Inputs with the program's static shapes (values do not matter to export)."""
    tk, tv = new_caches(target.arch, target.plan, batch, cache_len, dtype)
    dk, dv = new_caches(draft.arch, draft.plan, batch, cache_len, dtype)
    if name == "context_encoding":
        tokens = torch.zeros(batch, context_len, dtype=torch.int64)
        lengths = torch.ones(batch, dtype=torch.int64)
        return (weights, tokens, lengths, tk, tv, dk, dv)
    cur = torch.zeros(batch, dtype=torch.int64)
    pos = torch.zeros(batch, dtype=torch.int64)
    return (weights, cur, pos, tk, tv, dk, dv)


_EXPORT_LOCK = threading.RLock()


def export_program(name: str, target: Decoder, draft: Decoder, weights: Weights, *, k: int, batch: int,
                   context_len: int, cache_len: int, dtype: torch.dtype) -> torch.export.ExportedProgram:
    module = ContextEncoding(target, draft) if name == "context_encoding" else FusedStep(target, draft, k)
    args = example_inputs(name, target, draft, weights, batch=batch, context_len=context_len,
                          cache_len=cache_len, dtype=dtype)
    # Dynamo's tracing state (its global counters among others) is not thread-safe: two builds exporting
    # at once in one process (local fan-out with max_workers > 1) failed with a KeyError inside dynamo.
    with _EXPORT_LOCK, torch.no_grad():
        return torch.export.export(module, args, strict=True)


def save_program(program: torch.export.ExportedProgram, out_dir: Path, name: str, *, aot_inductor: bool) -> Path:
    """Write one program into `out_dir`; returns its path (`name.pt2` or `name.aoti.pt2`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if aot_inductor:  # AOTInductor needs the example inputs to compile; the package does not keep them
        path = out_dir / (name + AOTI_SUFFIX)
        with _EXPORT_LOCK:  # inductor's compile state is process-global like dynamo's
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    else:
        path = out_dir / (name + EXPORT_SUFFIX)
        # export keeps its example inputs (here: the real weights) and would save them: drop them
        program.example_inputs = None  # type: ignore[assignment]
        with _EXPORT_LOCK:  # the (de)serializer keeps process-global state too
            torch.export.save(program, str(path))
    return path


def load_program(path: Path) -> Program:
    """A callable taking the same arguments the program was exported with."""
    # torch.export.load asserts on a process-global deserializer ("_CURRENT_DESERIALIZER is already
    # set") when two threads load at once, as two builds validating side by side do.
    with _EXPORT_LOCK:
        if path.name.endswith(AOTI_SUFFIX):
            return torch._inductor.aoti_load_package(str(path))  # type: ignore[no-any-return]
        return torch.export.load(str(path)).module()  # type: ignore[no-any-return]
