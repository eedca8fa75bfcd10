"""The target and draft an artifact was built from, found again from its build.json, for validating an
artifact outside a run (`fusedspec validate`). A run hands its plan's models to validation instead.

A Hub model is downloaded at the commit build.json records; a local directory must still hold files that
hash to what was built (validating against a changed checkpoint would prove nothing).
"""

from __future__ import annotations

from pathlib import Path

from fusedspec.compile.documents.build import BuildDescription, ModelRecord
from fusedspec.compile.modelref import parse_model_ref
from fusedspec.core.errors import ArtifactError
from fusedspec.core.settings import Settings
from fusedspec.registry.download import download_model
from fusedspec.registry.hub import resolve_model


def model_dir(record: ModelRecord, role: str, settings: Settings) -> Path:
    if record.commit and record.repo_id:
        return download_model(resolve_model(parse_model_ref(f"hf://{record.repo_id}@{record.commit}"),
                                            settings),
                              settings)
    path = Path(record.ref)
    if not path.is_dir():
        raise ArtifactError(f"the {role} this artifact was built from ({record.ref}) is not a directory "
                            "here; run validate where that checkpoint is, or build from hf://ORG/NAME@COMMIT")
    resolved = resolve_model(str(path), settings)
    changed = sorted(n for n, h in record.files.items() if resolved.file_hashes.get(n) != h)
    if changed:
        raise ArtifactError(f"the {role} at {path} changed since this artifact was built "
                            f"({', '.join(changed[:3])} differ from build.json); validating against it would "
                            "prove nothing: rebuild")
    return resolved.local_dir


def artifact_model_dirs(description: BuildDescription, settings: Settings) -> tuple[Path, Path]:
    return (model_dir(description.target, "target", settings),
            model_dir(description.draft, "draft", settings))
