"""torch.export (non-strict) of a build's programs, saved without weights; optional AOTInductor.

A program's inputs are (weights, tokens/state, caches); the weights are graph inputs, not
parameters, so a saved program holds no weights: the artifact's `weights/tp{r}_...safetensors` are the
only copy and are bound at load. Caches are inputs mutated in place (the graph signature records it).
Shapes are static (batch, cache length, shards) except the context length of the context-encoding
programs: it is dynamic in 2..max_context_length, so a prompt is prefilled over its own length, not
padded to the longest the build allows (padding to 256 made time to first token ~7x a 35-token prompt's,
for both models). NxDI gets the same effect from context-encoding buckets; torch.export does it in one
program. The context programs take one prompt (batch 1) and the index of the cache line it writes;
the caches they write are the build's batch-B caches (continuous batching, see programs.py).

Export is non-strict: the programs are plain tensor code (no data-dependent Python control flow, see
model.py), so tracing them by running Python gives the graph dynamo's strict tracing gives, in about half
the time (bench/RESULTS.md).
"""

from __future__ import annotations

import io
import logging
import tempfile
import threading
import typing
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import sympy
import torch
from torch import nn

from fusedspec.compile.cpu import native
from fusedspec.compile.cpu.archive import check_program_archive
from fusedspec.compile.cpu.model import Decoder, Weights, new_caches
from fusedspec.compile.cpu.programs import (
    ContextEncoding,
    FusedStep,
    TargetContextEncoding,
    TargetStep,
    TargetVerify,
)
from fusedspec.compile.trust import AOTI_SUFFIX, LoadTrust
from fusedspec.core.errors import ArtifactError, CompileError, VerificationError
from fusedspec.core.kept import KeptByContent
from fusedspec.core.memory import release_freed_memory

PROGRAMS = ("context_encoding", "fused_step")
TARGET_ALONE_PROGRAMS = ("target_context_encoding", "target_step")  # compile option target_alone
# also with target_alone, never served: what validation times to split a fused step into verify and draft
TIMING_PROGRAMS = ("target_verify",)
CONTEXT_PROGRAMS = ("context_encoding", "target_context_encoding")
MIN_CONTEXT = 2  # torch.export specializes sizes 0 and 1: the runner pads shorter batches to 2
EXPORT_SUFFIX = ".pt2"

log = logging.getLogger(__name__)


class Program(Protocol):
    def __call__(self, *args: Any) -> Any: ...


def program_module(name: str, target: Decoder, draft: Decoder, k: int) -> nn.Module:
    if name == "context_encoding":
        return ContextEncoding(target, draft)
    if name == "fused_step":
        return FusedStep(target, draft, k)
    if name == "target_context_encoding":
        return TargetContextEncoding(target)
    if name == "target_step":
        return TargetStep(target)
    if name == "target_verify":
        return TargetVerify(target)
    raise ValueError(f"unknown program {name!r}")


def uses_draft(name: str) -> bool:
    return not name.startswith("target_")


def example_inputs(name: str, target: Decoder, draft: Decoder, weights: Weights, *, batch: int,
                   context_len: int, cache_len: int, dtype: torch.dtype, k: int = 2) -> tuple[Any, ...]:
    """Inputs with the program's shapes (values do not matter to export)."""
    caches: tuple[list[torch.Tensor], ...] = new_caches(target.arch, target.plan, batch, cache_len, dtype)
    if uses_draft(name):
        caches += new_caches(draft.arch, draft.plan, batch, cache_len, dtype)
    if name in CONTEXT_PROGRAMS:  # one prompt [1, C], its length [1], its cache line [1]
        tokens = torch.zeros(1, max(context_len, MIN_CONTEXT), dtype=torch.int64)
        length, line = torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        return (weights, tokens, length, line, *caches)
    if name == "target_verify":  # k tokens per line [B, k], their first position [B]
        return (weights, torch.zeros(batch, k, dtype=torch.int64), torch.zeros(batch, dtype=torch.int64),
                *caches)
    return (weights, torch.zeros(batch, dtype=torch.int64), torch.zeros(batch, dtype=torch.int64), *caches)


def dynamic_shapes(name: str, args: tuple[Any, ...], context_len: int) -> tuple[Any, ...] | None:
    """The context programs' token dim is dynamic; everything else stays static."""
    if name not in CONTEXT_PROGRAMS or context_len <= MIN_CONTEXT:
        return None
    context = torch.export.Dim("context", min=MIN_CONTEXT, max=context_len)
    weights, _tokens, *rest = args
    static_rest = [None if isinstance(arg, torch.Tensor) else [None] * len(arg) for arg in rest]
    return ({name: None for name in weights}, {1: context}, *static_rest)


# torch's tracing, (de)serializer and fx annotations keep process-global state: every export, save, load
# and meta-tensor shape computation of ours holds this (builds run side by side in threads)
TORCH_STATE_LOCK = threading.RLock()


@contextmanager
def _swapped(owner: Any, name: str, value: object) -> Iterator[None]:
    """Inside TORCH_STATE_LOCK: `owner.<name>` (torch's process-global state) is `value` for the block, and
    what it was again after it, also when the block raises."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


class _PinnedIsaNotice(logging.Filter):
    """Drops torch's "Device information mismatch for AOTI_CPU_ISA: <this host's> vs <the package's>"
    warning when the package's ISA is the vector ISA of its pinned baseline (compile.cpu.native): such a
    package differs from the build host's widest ISA by design, and check_host_isa has already refused a
    host that lacks the baseline. Any other mismatch (a package not built for its recorded baseline) is left
    to warn. Left in, a pod's log says "this could cause some issues" once per program."""

    def __init__(self, pinned_vector_isa: str):
        super().__init__()
        self.pinned = pinned_vector_isa.lower()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        expected = len(args) == 3 and args[0] == "AOTI_CPU_ISA" and str(args[2]).lower() == self.pinned
        return not expected


@contextmanager
def _quiet_pinned_isa(isa: object) -> Iterator[None]:
    vector = native.BASELINES[isa][2] if isinstance(isa, str) and isa in native.BASELINES else None
    if vector is None:
        yield
        return
    logger, notice = logging.getLogger("torch.export.pt2_archive._package"), _PinnedIsaNotice(vector)
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def export_program(name: str, target: Decoder, draft: Decoder, weights: Weights, *, k: int, batch: int,
                   context_len: int, cache_len: int, dtype: torch.dtype) -> torch.export.ExportedProgram:
    return export_module(name, program_module(name, target, draft, k), target, draft, weights, batch=batch,
                         context_len=context_len, cache_len=cache_len, dtype=dtype, k=k)


def export_module(name: str, module: nn.Module, target: Decoder, draft: Decoder, weights: Weights, *,
                  batch: int, context_len: int, cache_len: int, dtype: torch.dtype,
                  k: int = 2) -> torch.export.ExportedProgram:
    """Export `module` with the inputs and dynamic shapes of program `name` (a variant of a program,
    exported the same way, is swapped into an artifact by the tests that show what the gate catches)."""
    args = example_inputs(name, target, draft, weights, batch=batch, context_len=context_len,
                          cache_len=cache_len, dtype=dtype, k=k)
    shapes = dynamic_shapes(name, args, context_len)

    def trace() -> torch.export.ExportedProgram:
        # Dynamo's tracing state (its global counters among others) is not thread-safe: two builds
        # exporting at once in one process (local fan-out with max_workers > 1) failed with a KeyError
        # inside dynamo. Reset: what an earlier trace in this process left behind must not reach this one.
        # A lifted constant is left to without_constants (torch would raise at once, and not try again).
        lifted_constants_allowed = torch._export.config.patch(error_on_lifted_constant_tensors=False)
        with TORCH_STATE_LOCK, torch.no_grad(), lifted_constants_allowed, _no_stack_traces():
            torch._dynamo.reset()
            return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)

    return without_constants(name, trace)


def _no_stack_traces() -> AbstractContextManager[None]:
    """Inside TORCH_STATE_LOCK: tracing records no Python stack trace per node. A trace names the build host's
    source paths (/home/<user>/.../model.py, line 122), so each exported program carried them into every
    artifact and differed by where fusedspec was installed (an AOTInductor package still names the host's
    torch headers); collecting them was up to a third of an export (bench/RESULTS.md). What is lost: an
    export error points at a graph node, not a line of model.py."""
    return _swapped(torch.fx.config, "do_not_emit_stack_traces", True)


def without_constants(name: str,
                      trace: Callable[[], torch.export.ExportedProgram]) -> torch.export.ExportedProgram:
    """The program `trace` exports, refusing one that holds tensor constants.

    Our programs take every tensor as an input (weights, tokens, caches), so a lifted constant is a
    tracing fault, not part of the model. It has been seen in dask workers only, under strict and
    non-strict export alike: a program holding a fake tensor as a constant, which every later load of the
    artifact refused ("Only as_int is supported, got as_expr"). The cause is not known, so we guard both
    ways: each export starts from a reset dynamo (above), one faulty trace is exported again, and a second
    one fails the build before anything is saved.
    """
    for attempt in (1, 2):
        program = trace()
        stray = _describe_constants(program)
        if not stray:
            return program
        del program
        release_freed_memory()
        if attempt == 1:
            log.warning("program %s: export lifted tensor constants (%s); exporting it again", name, stray)
    raise CompileError(f"program {name}: torch.export lifted tensor constants twice ({stray}); this program "
                       "takes every tensor as an input, so the trace is faulty and nothing was saved. "
                       f"Re-run the build; if it persists, report it with torch {torch.__version__}")


def _describe_constants(program: torch.export.ExportedProgram) -> str:
    """'' when the program holds no constants, else their names and shapes."""
    return ", ".join(f"{fqn} "
                     f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}"
                     for fqn, value in program.constants.items())


def save_program(program: torch.export.ExportedProgram, out_dir: Path, name: str, *, aot_inductor: bool,
                 cpu_isa: str | None = None) -> Path:
    """Write one program into `out_dir`; returns its path (`name.pt2` or `name.aoti.pt2`). An AOTInductor
    package is compiled for `cpu_isa` (default: this host's portable baseline, see native.py), not for
    the build host's own CPU."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if aot_inductor:  # AOTInductor needs the example inputs to compile; the package does not keep them
        path = out_dir / (name + AOTI_SUFFIX)
        isa = cpu_isa or native.build_isa()
        if isa is None:
            raise CompileError(f"no portable CPU ISA baseline is known for {native.host_description()}")
        # inductor's compile state is process-global like dynamo's
        with TORCH_STATE_LOCK, native.pinned_isa(isa):
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    else:
        path = out_dir / (name + EXPORT_SUFFIX)
        # export keeps its example inputs (here: the real weights) and would save them: drop them
        program.example_inputs = None  # type: ignore[assignment]
        buffer = io.BytesIO()  # the program alone (the weights are its inputs): megabytes
        with TORCH_STATE_LOCK, _unused_canonical_form_skipped():  # the serializer's state is global too
            torch.export.save(program, buffer)
        # Written by Python, not torch's zip writer: a full disk is then OSError(ENOSPC), which the build
        # reports as such; torch's writer makes it a RuntimeError and can abort the process when it closes.
        path.write_bytes(buffer.getvalue())
    return path


def _unused_canonical_form_skipped() -> AbstractContextManager[None]:
    """Inside TORCH_STATE_LOCK: torch.export.save without the canonical form it makes and throws away.

    The serializer canonicalizes a deep copy of the program it has just serialized ("Test canonical form is
    well defined") and discards the result, so no saved byte depends on it; it was about two thirds of a
    tiny program's save (bench/RESULTS.md). tests/test_cpu_export.py shows the bytes are the same with and
    without it, so a torch that starts using the result fails there. A torch laid out otherwise is left
    alone."""
    from torch._export.serde import serialize

    if not hasattr(serialize, "canonicalize"):
        return nullcontext()
    return _swapped(serialize, "canonicalize", _unchanged)


def _unchanged(program: Any, constants: object = None) -> Any:
    return program


def load_program(artifact_dir: Path, rel: str, trust: LoadTrust, cpu_isa: object) -> Program:
    """A callable taking the same arguments the program was exported with, from the file `rel` of the
    artifact. Its bytes are read once and checked (compile.trust) before anything parses them. An exported
    archive is then checked for code (compile.cpu.archive) and loaded from those bytes. An AOTInductor
    package is native code: refused unless `trust` allows it, and, whenever the loader hashes what it reads
    (a manifest to check, or validation taking its content hash from the loader's digests), loaded from a
    private copy of the bytes that were hashed: the package file itself could change between its hash and
    its load."""
    path = Path(artifact_dir) / rel
    if not rel.endswith(AOTI_SUFFIX):
        data = trust.read_bytes(artifact_dir, rel)
        check_program_archive(path, data)
        return _loaded(path, lambda: _deserialized(data).module())
    refusal = trust.native_refusal(rel)
    if refusal:
        raise VerificationError(refusal)
    # native code for a CPU ISA: refused here instead of dying with SIGILL
    native.check_host_isa(cpu_isa, path)
    if not trust.hashes_reads:  # a build of this work dir whose digests nobody asked for: loaded where it is
        return _loaded(path, lambda: _load_package(path, cpu_isa))
    # Not hashed first and then loaded by path: the copy runs exactly the bytes hashed, and the package
    # (programs carry no weight, so it is small) is read once instead of twice.
    data = trust.read_bytes(artifact_dir, rel)
    with tempfile.TemporaryDirectory(prefix="fusedspec-aoti-") as private:  # 0700: only this user reads it
        copy = Path(private) / path.name
        copy.write_bytes(data)
        return _loaded(path, lambda: _load_package(copy, cpu_isa))


# Deserialized programs by the sha256 of their bytes, newest last. Builds of one graph key carry the same
# program files (the target-alone programs are the same for every k and draft), and a process validating
# or serving several builds would deserialize each again: most of a load's time. `.module()` makes a new
# callable of a kept program at each load, and the programs hold no state two loads could share (weights
# and caches are inputs; check_program_archive refuses an archive with weights or constants).
_DESERIALIZED: KeptByContent[torch.export.ExportedProgram] = KeptByContent(8)


def _deserialized(data: bytes) -> torch.export.ExportedProgram:
    """Inside TORCH_STATE_LOCK (`_loaded`): the program `data` holds."""
    return _DESERIALIZED.get([data], lambda: torch.export.load(io.BytesIO(data)))


def _load_package(path: Path, cpu_isa: object) -> Program:
    with _quiet_pinned_isa(cpu_isa):
        return torch._inductor.aoti_load_package(str(path))  # type: ignore[no-any-return]


class _SchemaHints:
    """`typing` as torch's deserializer sees it while we load, with `get_type_hints` answered once per class.

    torch.export.load rebuilds its schema dataclasses field by field and asks `typing.get_type_hints` of
    the class at every object, re-evaluating the same annotations tens of thousands of times per program
    (pytorch/pytorch#196452, open; a C++ deserializer is pending upstream): about a fifth of a tiny
    program's load here, bench/RESULTS.md. The hints of a schema class never change in a process, so
    they are kept; every other name is typing's own."""

    def __init__(self) -> None:
        self._hints: dict[tuple[object, int, bool], dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(typing, name)

    def get_type_hints(self, obj: Any, globalns: Any = None, localns: Any = None,
                       include_extras: bool = False) -> dict[str, Any]:
        if localns is not None:
            return typing.get_type_hints(obj, globalns, localns, include_extras)
        key = (obj, id(globalns), include_extras)
        if key not in self._hints:
            self._hints[key] = typing.get_type_hints(obj, globalns, None, include_extras)
        return self._hints[key]


_SCHEMA_HINTS = _SchemaHints()


def _schema_hints_kept() -> AbstractContextManager[None]:
    """Inside TORCH_STATE_LOCK (every (de)serialization of ours holds it): the deserializer's `typing` swapped
    for _SCHEMA_HINTS, and put back. A torch whose deserializer is laid out otherwise is left alone."""
    from torch._export.serde import serialize

    if getattr(serialize, "typing", None) is not typing:
        return nullcontext()
    return _swapped(serialize, "typing", _SCHEMA_HINTS)


class _ParsedOnce:
    """`sympy` as torch's deserializer sees it during one load, with each symbolic size parsed once.

    The deserializer parses the expression string of every symbolic size of every node with
    `sympy.sympify` (the same few strings, "s0" and the like, a thousand times in a tiny context-encoding
    program), which was a fifth of a program's load (bench/RESULTS.md). A parse depends only on the
    string and on the names it is given, so it is kept under both; one load's keep is dropped with it,
    since another program's symbols are other objects. Every other name is sympy's own."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}

    def __getattr__(self, name: str) -> Any:  # looked up once, then an attribute of this proxy
        value = getattr(sympy, name)
        setattr(self, name, value)
        return value

    def sympify(self, a: Any, *args: Any, locals: dict[str, Any] | None = None, **kwargs: Any) -> Any:  # noqa: A002
        if args or kwargs or locals is None or not isinstance(a, str):
            return sympy.sympify(a, *args, locals=locals, **kwargs)
        key = (a, tuple(locals.items()))
        try:
            return self._parsed[key]
        except KeyError:
            self._parsed[key] = parsed = sympy.sympify(a, locals=locals)
            return parsed
        except TypeError:  # a name given something unhashable (no torch does): parsed each time
            return sympy.sympify(a, locals=locals)


def _expressions_parsed_once() -> AbstractContextManager[None]:
    """Inside TORCH_STATE_LOCK: the deserializer's `sympy` swapped for a new _ParsedOnce, and put back. A
    torch whose deserializer is laid out otherwise is left alone."""
    from torch._export.serde import serialize

    if getattr(serialize, "sympy", None) is not sympy:
        return nullcontext()
    return _swapped(serialize, "sympy", _ParsedOnce())


def _loaded(path: Path, load: Callable[[], Program]) -> Program:
    # torch.export.load asserts on a process-global deserializer ("_CURRENT_DESERIALIZER is already
    # set") when two threads load at once, as two builds validating side by side do.
    try:
        with TORCH_STATE_LOCK, _schema_hints_kept(), _expressions_parsed_once():
            return load()
    except Exception as exc:  # torch raises plain AssertionErrors, RuntimeErrors... for a bad archive
        raise ArtifactError(f"{path}: torch {torch.__version__} cannot load this program "
                            f"({type(exc).__name__}: {exc}); delete the artifact directory "
                            f"{path.parent.parent} and build it again") from exc
