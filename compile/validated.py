"""Whether an artifact's validation.json vouches for the artifact as it is now: the one rule by which a run
reuses a passed gate (flows.pipeline) and a publish marks a version validated (registry.publish).

    read_passed_validation(artifact_dir, description, content_hash) -> ValidationDocument | None
    vouching(document, artifact_dir, description, content_hash)  -> the same rule for a report in hand

A report vouches when it says passed, does not contradict its own sections, was written under this gate's
rules (GATE_VERSION), is of this build (key and spec of build.json), and of the tokenizer and files the
artifact holds now. It is trusted for nothing it could have been crafted to say: each of those is checked
against the artifact, not taken from the report. A run adds its own settings on top (prompt set, tokens,
tolerance: flows.pipeline.passed_validation).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.documents.validation import GATE_VERSION, VALIDATION_FILE, ValidationDocument
from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
from fusedspec.core.errors import ArtifactError


def read_passed_validation(artifact_dir: Path, description: BuildDescription,
                           content_hash: Callable[[], str]) -> ValidationDocument | None:
    """The artifact's validation.json when it vouches for the artifact; None when there is none or it says
    the gate failed. ArtifactError, saying why and to validate again, for a report that does not parse or
    says passed without vouching. `content_hash()` (the artifact's files hashed, compile.documents.
    validation.content_hash) is called only for a report that passes every cheaper check."""
    path = Path(artifact_dir) / VALIDATION_FILE
    if not path.is_file():
        return None
    return vouching(ValidationDocument.read(path), artifact_dir, description, content_hash)


def vouching(document: ValidationDocument, artifact_dir: Path, description: BuildDescription,
             content_hash: Callable[[], str]) -> ValidationDocument | None:
    """`document` (the artifact's validation.json, as its validation handed it over) when it vouches for the
    artifact as it is now, by read_passed_validation's rule; None when it says the gate failed."""
    if not document.passed:
        return None
    problems = _stale(document, description, Path(artifact_dir), content_hash)
    if problems:
        raise ArtifactError(f"{Path(artifact_dir) / VALIDATION_FILE} says passed but {'; '.join(problems)}; "
                            f"validate it again (`fusedspec validate {artifact_dir}`)")
    return document


def _stale(document: ValidationDocument, description: BuildDescription, artifact_dir: Path,
           content_hash: Callable[[], str]) -> list[str]:
    """Why a report that says passed does not vouch for this artifact as it is now (empty: it does)."""
    problems = document.contradictions()
    if document.gate_version != GATE_VERSION:
        problems.append(f"it was written under gate rules {document.gate_version} and the gate's rules are now "
                        f"{GATE_VERSION}")
    if document.staggered is None:
        problems.append("it has no staggered (continuous batching) section")
    if document.key != description.key:
        problems.append(f"it is the report of build {document.key[:12]}, not of this artifact ({description.key[:12]})")
    elif document.spec != description.spec:
        problems.append(f"its spec {document.spec.slug} is not build.json's {description.spec.slug}")
    if problems:
        return problems
    if document.tokenizer_hash != artifact_tokenizer_hash(artifact_dir):
        return ["the artifact's tokenizer is not the one it was validated with"]
    if document.content_hash is None or document.content_hash != content_hash():
        return ["its files changed since validation.json was written (content hash differs)"]
    return []
