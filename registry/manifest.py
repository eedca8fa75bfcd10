"""The manifest: what a published version is, written last, checked by every reader.

A version directory without `manifest.json` does not exist for any reader. The manifest records the
content key, the build spec, both models (reference, commit, file hashes) and the tokenizer hash, the
toolchain, the size and sha256 of every file, a summary of the validation report, the producer and
the time. Its shape is `registry/manifest.schema.json` (JSON Schema 2020-12).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from compile.errors import ArtifactError

MANIFEST = "manifest.json"
LATEST = "LATEST"
VALIDATION = "validation.json"
SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")
MANIFEST_SCHEMA = 1
# A key or slug becomes one path segment in the store: keep it to safe characters.
SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def producer_version() -> str:
    try:
        return metadata.version("fusedspec")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@cache
def manifest_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())  # type: ignore[no-any-return]


def manifest_problems(manifest: Any) -> list[str]:
    """Every way `manifest` breaks the schema, as sentences naming the field. Empty when valid."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(manifest_schema())
    problems = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        problems.append(f"manifest {where}: {error.message}")
    return problems


def model_slug(entry: dict[str, Any]) -> str:
    """The store path segment of a model from build.json: `ORG--NAME` for a Hub repo, else the dir name.

    Same rule as `compile.modelref.ModelRef.slug`, computed from the recorded reference because the
    local directory need not exist on the publishing machine.
    """
    repo_id = entry.get("repo_id")
    if repo_id:
        return str(repo_id).replace("/", "--")
    name = Path(str(entry.get("ref", "")).rstrip("/")).name
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "model"


def _canonical_tokenizer_hash(artifact_dir: Path) -> str:
    """sha256 over the parsed tokenizer files (formatting-independent); used when the gate's hash is absent."""
    content = {}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = artifact_dir / name
        if path.is_file():
            try:
                content[name] = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def tokenizer_hash(artifact_dir: Path) -> str | None:
    """The tokenizer gate's hash of the artifact's tokenizer files; None when it has no tokenizer.json."""
    if not (artifact_dir / "tokenizer.json").is_file():
        return None
    try:
        from validate.tokenizers import tokenizer_hash as gate_hash
    except ImportError:
        return _canonical_tokenizer_hash(artifact_dir)
    return gate_hash(artifact_dir)


def validation_summary(artifact_dir: Path) -> dict[str, Any] | None:
    """The scalar fields of the artifact's validation.json (and of its `summary` object), or None."""
    path = artifact_dir / VALIDATION
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}); re-run `fusedspec validate`") from exc
    if not isinstance(report, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    nested = report.get("summary")
    sources: list[dict[str, Any]] = [report, nested if isinstance(nested, dict) else {}]
    summary: dict[str, Any] = {}
    for source in sources:
        for name, value in source.items():
            short_text = isinstance(value, str) and len(value) <= 200
            if isinstance(value, bool | int | float) or short_text or value is None:
                summary[name] = value
    return summary


def build_manifest(
    artifact_dir: Path,
    description: dict[str, Any],
    files: dict[str, dict[str, Any]],
    *,
    config_path: str,
) -> dict[str, Any]:
    """The manifest of an artifact whose files were hashed into `files` ({path: {size, sha256}})."""
    return {
        "schema": MANIFEST_SCHEMA,
        "key": description["key"],
        "backend": description["backend"],
        "config_path": config_path,
        "spec": description["spec"],
        "models": {
            role: {name: description[role].get(name) for name in ("ref", "repo_id", "commit", "files")}
            for role in ("target", "draft")
        },
        "tokenizer_hash": tokenizer_hash(artifact_dir),
        "toolchain": description.get("toolchain", {}),
        "code_version": str(description.get("code_version", "")),
        "options": description.get("options", {}),
        "files": dict(sorted(files.items())),
        "validation": validation_summary(artifact_dir),
        "producer": {"name": "fusedspec", "version": producer_version()},
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def manifest_files(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's {path: {size, sha256}}, or {} when a broken manifest has none (its schema check says so)."""
    files = manifest.get("files")
    return files if isinstance(files, dict) else {}


def encode(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def decode(data: bytes, where: str) -> dict[str, Any]:
    """Parse a manifest or pointer; a broken one is reported, not crashed on."""
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{where}: expected a JSON object")
    return document
