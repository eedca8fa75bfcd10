"""The cpu artifact's files and the `cpu` section of its build.json: written by compile, read by the runner.

    weights/tp{r}_sharded_checkpoint.safetensors   rank r's tensors, `target_model.` / `draft_model.`
    programs/context_encoding.pt2, programs/fused_step.pt2   (or *.aoti.pt2)
    build.json["cpu"]   both models' configs and shard plans, the static shapes, the program files,
                        and `ctx_batch_size: 1` (NxDI's name): the context programs prefill one cache line

Loading checks every rank file against the shapes the config implies and that replicated tensors are
identical on every rank, so a damaged or foreign weight file is an ArtifactError naming the tensor,
not a shape error deep inside a program.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fusedspec.compile.cpu.checkpoint import expected_shapes
from fusedspec.compile.cpu.export import TORCH_STATE_LOCK
from fusedspec.compile.cpu.model import Decoder
from fusedspec.compile.cpu.sharding import ShardPlan, Shards, is_replicated, rank_tensors, shard_rank
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.safetensors_header import MAX_HEADER_BYTES, parse_header
from fusedspec.compile.trust import CheckedReader, LoadTrust
from fusedspec.core.errors import ArtifactError

WEIGHTS_DIR = "weights"
PROGRAMS_DIR = "programs"
ROLES = {"target": "target_model.", "draft": "draft_model."}
# The context programs prefill one request into one cache line (continuous batching, programs.py). An
# artifact without this field was built by cpu code version 2, whose context programs took the whole
# batch at once and cannot be called the way the runner calls them now.
CTX_BATCH_SIZE = 1


def weights_file(artifact_dir: Path, rank: int) -> Path:
    return Path(artifact_dir) / WEIGHTS_DIR / f"tp{rank}_sharded_checkpoint.safetensors"


@dataclass(frozen=True)
class Layout:
    """Static facts of one build: what the programs were exported for."""

    target: Decoder
    draft: Decoder
    tp: int
    batch: int
    context_len: int  # longest prompt the context-encoding program takes
    cache_len: int  # KV slots per row: seq_len + k, so a step near the end never writes out of bounds
    seq_len: int
    k: int
    dtype: str
    programs: dict[str, str]  # program name -> file relative to the artifact dir

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    def to_json(self) -> dict[str, Any]:
        return {
            "models": {role: {"arch": dec.arch.to_json(), "sharding": dec.plan.describe()}
                       for role, dec in (("target", self.target), ("draft", self.draft))},
            "tp": self.tp, "batch": self.batch, "context_len": self.context_len,
            "cache_len": self.cache_len, "seq_len": self.seq_len, "k": self.k, "dtype": self.dtype,
            "ctx_batch_size": CTX_BATCH_SIZE, "programs": dict(self.programs),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        if data.get("ctx_batch_size") != CTX_BATCH_SIZE:
            raise ArtifactError(
                "build.json: this artifact's context programs prefill a whole batch at once (ctx_batch_size "
                f"{data.get('ctx_batch_size', 'absent')}; built by an older fusedspec), so requests cannot "
                "be admitted one cache line at a time; rebuild it with this fusedspec")
        try:
            tp = int(data["tp"])
            archs = {role: ModelArch.from_json(data["models"][role]["arch"]) for role in ROLES}
            decoders = {role: Decoder(archs[role], ShardPlan.for_arch(archs[role], tp), prefix)
                        for role, prefix in ROLES.items()}
            return cls(target=decoders["target"], draft=decoders["draft"], tp=tp, batch=int(data["batch"]),
                       context_len=int(data["context_len"]), cache_len=int(data["cache_len"]),
                       seq_len=int(data["seq_len"]), k=int(data["k"]), dtype=str(data["dtype"]),
                       programs=dict(data["programs"]))
        except (KeyError, TypeError) as exc:
            raise ArtifactError(f"build.json: the cpu section is incomplete ({exc!r}); rebuild the "
                                "artifact") from exc


def rank_shapes(dec: Decoder) -> dict[str, tuple[int, ...]]:
    """Name (with prefix) -> shape of every tensor one rank file holds for this model.

    Meta tensors run torch's Python reference ops, which set and delete torch.fx's process-global node
    annotations as they go; an export in another thread does the same, and the two interleaved failed a
    validation with KeyError 'custom' (CI, local fan-out of 2 builds in one process). So this holds the
    lock every trace and (de)serialization of ours holds."""
    with TORCH_STATE_LOCK:
        meta = {name: torch.empty(shape, device="meta") for name, shape in expected_shapes(dec.arch).items()}
        return {dec.prefix + name: tuple(t.shape) for name, t in shard_rank(meta, dec.plan, 0).items()}


def save_weights(artifact_dir: Path, weights: dict[str, torch.Tensor], tp: int) -> list[Path]:
    """Write `weights/tp{r}_sharded_checkpoint.safetensors` for every rank, one rank in memory at a time."""
    paths = []
    for rank in range(tp):
        path = weights_file(artifact_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors(path, rank_tensors(weights, rank), {"rank": str(rank), "tp_degree": str(tp)})
        paths.append(path)
    return paths


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write a safetensors file tensor by tensor from the tensors' own memory.

    Why not `safetensors.torch.save_file`: it turns every tensor into `bytes` before writing, a full
    extra copy of the rank (compile peaked at 3x the weights). The format is small: an 8-byte
    little-endian header length, a JSON header (dtype, shape, byte range of each tensor, padded with
    spaces to 8 bytes), then the tensors' bytes back to back. Readers (`safe_open`) check all of it.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}; expected one of "
                             f"{list(SAFETENSORS_DTYPES)}")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for tensor in tensors.values():
            # a uint8 view of the tensor's own storage (little-endian host), written without a copy
            f.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def load_shards(artifact_dir: Path, layout: Layout, trust: LoadTrust) -> Shards:
    """Every rank's tensors, in a fixed key order (programs take them as inputs in that structure). Each
    rank file is read once, front to back, into the tensors' own memory, and hashed on the way in
    (compile.trust): the bytes checked against the manifest are the bytes loaded."""
    expected = rank_shapes(layout.target) | rank_shapes(layout.draft)
    dtype = layout.torch_dtype
    shards: Shards = []
    for rank in range(layout.tp):
        path = weights_file(artifact_dir, rank)
        rel = path.relative_to(artifact_dir).as_posix()
        with trust.open(artifact_dir, rel) as reader:
            tensors = _read_rank_file(path, reader, rel)
        names = set(tensors)
        extra, missing = sorted(names - expected.keys()), sorted(expected.keys() - names)
        if missing or extra:
            raise ArtifactError(
                f"{path.name}: tensors do not match build.json (missing {missing[:3]}, unexpected "
                f"{extra[:3]}); the weights belong to another build: rebuild the artifact")
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != expected[name] or tensor.dtype != dtype:
                raise ArtifactError(
                    f"{path.name}: tensor {name!r} is {list(tensor.shape)} {tensor.dtype}, build.json "
                    f"implies {list(expected[name])} {dtype}; rebuild the artifact")
        shards.append(dict(sorted(tensors.items())))
    _check_replicas(artifact_dir, shards)
    return shards


TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def _read_rank_file(path: Path, reader: CheckedReader, rel: str) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file, each read straight into its own tensor (no mmap, no copy):
    the file's bytes in order, so the reader hashes all of them. Why not `safe_open`: it maps the file
    and copies out of the mapping, a second read of every byte after the hash (through a FUSE mount, a
    second download), and a file could change between the two."""
    damaged = f"{path}: the artifact is damaged: rebuild or re-download it"
    prefix = reader.read(8)
    size = path.stat().st_size
    length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
    if length is None or length > min(MAX_HEADER_BYTES, size - 8):
        raise ArtifactError(f"{path}: not a safetensors file ({size} bytes cannot hold its header); "
                            f"{damaged}")
    try:
        _metadata, entries = parse_header(reader.read(length), size - 8 - length)
    except ValueError as exc:
        raise ArtifactError(f"{path}: {exc}; {damaged}") from None
    tensors: dict[str, torch.Tensor] = {}
    position = 0
    for entry in entries:
        if entry.dtype not in TORCH_DTYPES:
            raise ArtifactError(f"{path}: tensor {entry.name!r} is {entry.dtype}, not a dtype fusedspec "
                                f"writes; {damaged}")
        if entry.start < position:
            raise ArtifactError(f"{path}: tensor {entry.name!r} overlaps the tensor before it; {damaged}")
        if entry.start > position:  # a gap: read (and hashed) all the same
            reader.read(entry.start - position)
        tensor = torch.empty(entry.shape, dtype=TORCH_DTYPES[entry.dtype])
        target = tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else memoryview(b"")
        if reader.readinto(target) != len(target):
            raise ArtifactError(f"{path}: ends inside tensor {entry.name!r}; {damaged}")
        tensors[entry.name] = tensor
        position = entry.end
    return tensors


def _check_replicas(artifact_dir: Path, shards: Shards) -> None:
    """Programs read replicated tensors from rank 0; every other rank must hold the same copy."""
    for rank in range(1, len(shards)):
        for name, tensor in shards[0].items():
            if is_replicated(name) and not torch.equal(shards[rank][name], tensor):
                raise ArtifactError(
                    f"{weights_file(artifact_dir, rank).name}: replicated tensor {name!r} differs from "
                    f"rank 0's copy; the artifact is damaged: rebuild or re-download it")
