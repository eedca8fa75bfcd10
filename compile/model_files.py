"""Which files of a checkpoint a build reads, by name: one list for resolving, downloading, compiling
and shipping the tokenizer inside an artifact; and the one reader of its JSON files (untrusted input).

Only top-level files: a repo's onnx/ or original/ folders can hold their own config.json, which must
not shadow or join the real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fusedspec.core.errors import CheckpointError

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
# The files that alone define a tokenizer's vocabulary (one of them must be present).
TOKENIZER_VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
WEIGHT_SUFFIX = ".safetensors"


def is_needed(path: str) -> bool:
    """True for the files a build needs: weights (safetensors), JSON configs and tokenizer files."""
    if "/" in path:
        return False
    return path.endswith((WEIGHT_SUFFIX, ".json")) or path in TOKENIZER_FILES


def is_config_file(path: str) -> bool:
    """True for the small files that plans and the tokenizer gate read (no weights, no weight index)."""
    return path in CONFIG_FILES or path in TOKENIZER_FILES


def is_weight_file(path: str) -> bool:
    return "/" not in path and path.endswith(WEIGHT_SUFFIX)


def read_json_object(path: Path, fix: str, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON object in a checkpoint file, or CheckpointError naming the file and ending with `fix`."""
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes is not a {path.name}; {fix}")
    return parse_json_object(path.read_bytes(), path, fix)


def parse_json_object(text: bytes, path: Path, fix: str) -> dict[str, Any]:
    """The JSON object `text`, read from `path`, or CheckpointError naming the file and ending with `fix`."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); {fix}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object; {fix}")
    return data
