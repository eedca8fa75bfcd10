"""A safetensors file's header, checked against the file's size without reading a tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
shape and byte range, then the tensors' bytes. A download cut short or a copy that ran out of disk
leaves a file whose header promises bytes that are not there; the safetensors library notices only
when a tensor is read, deep inside a compile. Reading the header takes a millisecond at any file size,
so a local checkpoint is checked this way before it is hashed or planned.

    check_safetensors_file(path)   CheckpointError naming the file (and the first tensor that does not fit)
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from fusedspec.core.errors import CheckpointError

# Bytes per element of each dtype the format defines (safetensors' Dtype enum).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library itself enforces
FIX = "re-download or re-convert the checkpoint"


def check_safetensors_file(path: Path) -> None:
    """Refuse a file whose header is malformed or promises bytes the file does not hold."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
            if length is None or length > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{path}: {size} bytes cannot hold the safetensors header it starts with; "
                                      f"the file is truncated or not safetensors: {FIX}")
            raw = handle.read(length)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror}); {FIX}") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON; the file is damaged: {FIX}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object; the file is damaged: {FIX}")
    data_bytes = size - 8 - length
    tensors = sorted(((name, entry) for name, entry in header.items() if name != "__metadata__"),
                     key=lambda item: _start(item[1]))
    for name, entry in tensors:
        problem = _entry_problem(entry, data_bytes)
        if problem:
            raise CheckpointError(f"{path}: tensor {name!r} {problem}: {FIX}")


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
        return (f"needs bytes {start}..{end} of the data, but the file holds {data_bytes}; the file is truncated "
                "(an interrupted download or copy)")
    if end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
        return f"spans {end - start} bytes but a {dtype} tensor of shape {shape} needs {math.prod(shape) * DTYPE_BYTES[dtype]}"
    return None
