"""Content keys: sha256 over canonical JSON of everything that changes a compiled result.

In: both models' commits and file hashes, the BuildSpec, the backend, its toolchain versions, its
compile options, and the version of our own compile code. Out: model references as written (a branch
name, a local path), times, hosts, store locations: they do not change what gets compiled.
Same inputs give the same key in any process on any machine, so finished work is found, not redone.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec

KEY_SCHEMA = 1  # bump when the set or meaning of key inputs changes


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _model_identity(model: ResolvedModel) -> dict[str, Any]:
    return {"commit": model.commit, "files": dict(sorted(model.file_hashes.items()))}


def content_key(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, toolchain: dict[str, str],
                code_version: str, options: dict[str, Any] | None = None) -> str:
    """sha256 over the canonical JSON of `key_inputs` of the same arguments."""
    inputs = key_inputs(spec, target, draft, toolchain, code_version, options)
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def key_inputs(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, toolchain: dict[str, str],
               code_version: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": KEY_SCHEMA,
        "spec": spec.to_json(),
        "target": _model_identity(target),
        "draft": _model_identity(draft),
        "toolchain": dict(sorted(toolchain.items())),
        "code_version": code_version,
        # Unset and false options are every backend's defaults: {"aot_inductor": False}, {} and None
        # are the same build and must share a key (the CLI passes every option, a library caller few).
        "options": {name: value for name, value in sorted((options or {}).items())
                    if value is not None and value is not False},
    }
