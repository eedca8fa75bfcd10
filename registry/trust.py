"""What a loader may believe about a published version's files (compile.trust.LoadTrust), from its manifest.

    version_trust(where, manifest, settings)     every file's sha256 from the manifest; signer when its
                                                 signature verified with the configured verify key
    directory_trust(artifact_dir, settings)      `fusedspec validate DIR`: a build of this work dir, or the
                                                 attempt directory of a version whose manifest is beside it

The signature is checked here and nowhere else on the load path: a manifest whose signature fails under
a configured key never gets this far (registry.verify refuses the version first), so a LoadTrust with a
signer is one whose hashes the key's owner published.
"""

from __future__ import annotations

from pathlib import Path

from fusedspec.compile.documents.manifest import MANIFEST, Manifest
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.settings import Settings
from fusedspec.registry.signing import key_id, load_verify_key, signature_problem


def version_trust(where: str, manifest: Manifest, settings: Settings) -> LoadTrust:
    hashes = {name: entry.sha256 for name, entry in manifest.files.items()}
    key = load_verify_key(settings.verify_key) if settings.verify_key else None
    if key is None:
        reason = (f"its manifest is signed by {manifest.signature.key_id}, but no verify key is configured"
                  if manifest.signature else "its manifest is unsigned")
        return LoadTrust(where, hashes=hashes, unsigned_reason=reason)
    refused = signature_problem(manifest, key)
    if refused:
        return LoadTrust(where, hashes=hashes, unsigned_reason=refused)
    return LoadTrust(where, hashes=hashes, signer=key_id(key))


def directory_trust(artifact_dir: Path, settings: Settings) -> LoadTrust:
    """A build of this work dir as it is; else, when the directory is a version's attempt directory (its
    manifest one level up names it), that manifest's trust; else nothing vouches for it."""
    local = LoadTrust.for_directory(artifact_dir, settings.builds_dir)
    if local.built_here:
        return local
    path = Path(artifact_dir).absolute()
    manifest_path = path.parent / MANIFEST
    if not manifest_path.is_file():
        return local
    manifest = Manifest.read(manifest_path)
    if manifest.attempt != path.name:
        return local
    return version_trust(str(path.parent), manifest, settings)
