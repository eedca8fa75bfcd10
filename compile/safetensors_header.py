"""A safetensors file checked against its own header without reading a tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
shape and byte range, then the tensors' bytes. A download cut short or a copy that ran out of disk leaves a
file whose header promises bytes that are not there; loading notices only when a tensor is read, deep inside
a compile. safetensors' `safe_open` checks the header against the file (valid JSON, every tensor's dtype,
shape and byte range, the data fully covered) and maps nothing in: a millisecond at any file size, so a
local checkpoint is checked by the library that later loads it, before it is hashed or planned. Its errors
do not say which tensor runs past the end of a truncated file; `parse_header` names it.

    check_safetensors_file(path)          CheckpointError naming the file (and the first tensor that does
                                          not fit)
    describe_safetensors_error(path, exc) what is wrong with the file, for any error safetensors raised
    parse_header(raw, data_bytes)         the header's tensors in file order, checked; compile/cpu/layout.py
                                          reads an artifact's rank files through it while it hashes them
                                          (safe_open maps the file and would read every byte a second time)
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from fusedspec.core.errors import CheckpointError

# Bytes per element of each dtype the format defines (safetensors' Dtype enum).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library itself enforces
FIX = "re-download or re-convert the checkpoint"
NOT_COVERED = "file not fully covered"  # safetensors' words for data bytes the header does not account for
TOO_SHORT = ("header too small", "invalid header length", "header too large")


def check_safetensors_file(path: Path) -> None:
    """Refuse a file whose header is malformed or promises bytes the file does not hold."""
    path = Path(path)
    try:
        with safe_open(path, framework="numpy"):
            pass
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: {describe_safetensors_error(path, exc)}: {FIX}") from None


def describe_safetensors_error(path: Path, exc: Exception) -> str:
    """What is wrong with the file at `path`, from an error safe_open (or a read through it) raised."""
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    detail = str(exc).removeprefix("Error while deserializing header: ")
    if detail.startswith(TOO_SHORT):
        return (f"{path.stat().st_size} bytes cannot hold the safetensors header it starts with; the file is "
                "truncated or not safetensors")
    if NOT_COVERED in detail:
        return _uncovered(path)
    if isinstance(exc, SafetensorError):
        return f"its safetensors header is malformed ({detail[:200]}); the file is damaged"
    return f"not a readable safetensors file ({detail[:200]}); it is truncated or damaged"


def _uncovered(path: Path) -> str:
    """The first tensor whose bytes lie past the end of the file (safe_open parsed the header already)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        length = struct.unpack("<Q", handle.read(8))[0]
        raw = handle.read(length)
    try:
        parse_header(raw, size - 8 - length)
    except ValueError as exc:
        return str(exc)
    return ("holds bytes after its last tensor that its safetensors header does not account for; the file is "
            "damaged")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte range in the data section (after the header)
    end: int


def parse_header(raw: bytes, data_bytes: int) -> tuple[dict[str, str], list[TensorEntry]]:
    """The header's metadata and its tensors in file order, each checked against a data section of
    `data_bytes`; ValueError naming the first problem (the caller names the file)."""
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the safetensors header is not valid JSON; the file is damaged") from None
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a JSON object; the file is damaged")
    metadata = header.get("__metadata__") or {}
    tensors = sorted(((name, entry) for name, entry in header.items() if name != "__metadata__"),
                     key=lambda item: _start(item[1]))
    entries = []
    for name, entry in tensors:
        problem = _entry_problem(entry, data_bytes)
        if problem:
            raise ValueError(f"tensor {name!r} {problem}")
        start, end = entry["data_offsets"]
        entries.append(TensorEntry(name, entry["dtype"], tuple(entry["shape"]), start, end))
    return (metadata if isinstance(metadata, dict) else {}), entries


def _start(entry: Any) -> int:
    try:
        return int(entry["data_offsets"][0])
    except (TypeError, KeyError, IndexError, ValueError):
        return -1  # malformed entries first: they are reported as such


def _entry_problem(entry: Any, data_bytes: int) -> str | None:
    """Why one header entry does not describe bytes of this file, or None."""
    if not isinstance(entry, dict):
        return "has no dtype, shape and data_offsets in the header; the file is damaged"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES or not isinstance(shape, list) or not isinstance(offsets, list) \
            or len(offsets) != 2 or not all(isinstance(v, int) and v >= 0 for v in [*shape, *offsets]):
        return f"has a malformed header entry ({json.dumps(entry)[:120]}); the file is damaged"
    start, end = offsets
    if end > data_bytes:
        return (f"needs bytes {start}..{end} of the data, but the file holds {data_bytes}; the file is "
                "truncated (an interrupted download or copy)")
    if end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
        return (f"spans {end - start} bytes but a {dtype} tensor of shape {shape} needs "
                f"{math.prod(shape) * DTYPE_BYTES[dtype]}")
    return None
