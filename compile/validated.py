"""Whether an artifact's validation.json vouches for the artifact as it is now: the one rule by which a run
reuses a passed gate (flows.pipeline) and a publish marks a version validated (registry.publish).

    read_passed_validation(artifact_dir, description, content_hash) -> HeldValidation | None
    vouching(held, artifact_dir, description, content_hash, found_sha256)  -> the same rule for a report
        in hand, which must also still be the bytes of the artifact's validation.json

A report vouches when it says passed, does not contradict its own sections, was written under this gate's
rules (GATE_VERSION), is of this build (key and spec of build.json), and of the tokenizer and files the
artifact holds now. It is trusted for nothing it could have been crafted to say: each of those is checked
against the artifact, not taken from the report. A run adds its own settings on top (prompt set, tokens,
tolerance: flows.pipeline.passed_validation).

A run holds validation.json as `HeldValidation`: the document and the sha256 of the bytes its validation
wrote (or its reuse read). Publishing fills the manifest from the document it is handed and uploads the
file, so it refuses a file that is not those bytes: the version then holds exactly the report its manifest
says, and a later run's reuse, which reads the file, reads what the gate wrote.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.documents.validation import GATE_VERSION, VALIDATION_FILE, ValidationDocument
from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
from fusedspec.core.errors import ArtifactError


@dataclass(frozen=True)
class HeldValidation:
    """An artifact's validation.json as a run holds it: `document`, and `sha256` of the bytes it was
    written as or read from."""

    document: ValidationDocument
    sha256: str

    @classmethod
    def read(cls, path: Path) -> HeldValidation:
        """The document in file `path` with the sha256 of its bytes (ValidationDocument.read's errors)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValidationDocument.ERROR(f"{path}: cannot be read ({exc.strerror or exc}); "
                                           f"{ValidationDocument.FIX}") from None
        return cls(ValidationDocument.parse_bytes(data, str(path)), hashlib.sha256(data).hexdigest())


def read_passed_validation(artifact_dir: Path, description: BuildDescription,
                           content_hash: Callable[[], str]) -> HeldValidation | None:
    """The artifact's validation.json when it vouches for the artifact; None when there is none or it says
    the gate failed. ArtifactError, saying why and to validate again, for a report that does not parse or
    says passed without vouching. `content_hash()` (the artifact's files hashed, compile.documents.
    validation.content_hash) is called only for a report that passes every cheaper check."""
    path = Path(artifact_dir) / VALIDATION_FILE
    if not path.is_file():
        return None
    held = HeldValidation.read(path)
    return held if _vouches(held.document, artifact_dir, description, content_hash) else None


def vouching(held: HeldValidation, artifact_dir: Path, description: BuildDescription,
             content_hash: Callable[[], str], found_sha256: str | None) -> HeldValidation | None:
    """`held` (the artifact's validation.json, as its validation or the run's reuse handed it over) when it
    vouches for the artifact as it is now, by read_passed_validation's rule; None when it says the gate
    failed. ArtifactError naming the file when validation.json is not the bytes held: `found_sha256` is
    the sha256 of the file among the artifact's files as the caller hashed them (None: it is missing)."""
    path = Path(artifact_dir) / VALIDATION_FILE
    if found_sha256 != held.sha256:
        what = ("is missing" if found_sha256 is None
                else "is not the report its validation wrote (changed since)")
        raise ArtifactError(f"{path} {what}; the report the run holds cannot be published with it: validate "
                            f"it again (`fusedspec validate {artifact_dir}`)")
    return held if _vouches(held.document, artifact_dir, description, content_hash) else None


def _vouches(document: ValidationDocument, artifact_dir: Path, description: BuildDescription,
             content_hash: Callable[[], str]) -> bool:
    """True when `document` says passed and vouches for the artifact as it is now; False when it says the
    gate failed; ArtifactError saying why when it says passed without vouching."""
    if not document.passed:
        return False
    problems = _stale(document, description, Path(artifact_dir), content_hash)
    if problems:
        raise ArtifactError(f"{Path(artifact_dir) / VALIDATION_FILE} says passed but {'; '.join(problems)}; "
                            f"validate it again (`fusedspec validate {artifact_dir}`)")
    return True


def _stale(document: ValidationDocument, description: BuildDescription, artifact_dir: Path,
           content_hash: Callable[[], str]) -> list[str]:
    """Why a report that says passed does not vouch for this artifact as it is now (empty: it does)."""
    problems = document.contradictions()
    if document.gate_version != GATE_VERSION:
        problems.append(f"it was written under gate rules {document.gate_version} and the gate's rules are "
                        f"now {GATE_VERSION}")
    if document.staggered is None:
        problems.append("it has no staggered (continuous batching) section")
    if document.key != description.key:
        problems.append(f"it is the report of build {document.key[:12]}, not of this artifact "
                        f"({description.key[:12]})")
    elif document.spec != description.spec:
        problems.append(f"its spec {document.spec.slug} is not build.json's {description.spec.slug}")
    if problems:
        return problems
    if document.tokenizer_hash != artifact_tokenizer_hash(artifact_dir):
        return ["the artifact's tokenizer is not the one it was validated with"]
    if document.content_hash is None or document.content_hash != content_hash():
        return ["its files changed since validation.json was written (content hash differs)"]
    return []
