"""Compiled programs by graph key across machines: which version of a store holds a graph key's programs.

    .graphs/<graph key>/<signer key id>    {"version": "{config}/{key}"}    (GraphPointer)

Programs are code the loader runs (an AOTInductor package is native code), so another machine takes them only
from a version whose manifest is signed by the key it trusts. A publisher with a signing key therefore writes,
once its version's manifest is committed (registry/publish.py, beside the content index of registry/blobs.py),
a pointer under its own key id; an unsigned version points nowhere, and no publisher can displace another
signer's pointer. A build of the same graph key on a machine whose work dir lacks the programs
(`fetch_programs`) reads the pointer of its verify key, checks that version's manifest (it names the programs,
and its signature verifies), downloads them with every byte hashed against that manifest, and compiles
nothing; its publish then copies them server-side, so a new revision uploads only its weights. Otherwise
nothing is fetched and the build compiles; `programs_in_store` says why, and the plan shows it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from fusedspec.compile import program_cache
from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.manifest import Manifest
from fusedspec.compile.documents.programs import ProgramSet
from fusedspec.core.errors import ArtifactError, InputError, StoreError
from fusedspec.core.settings import Settings
from fusedspec.registry.signing import key_id, load_verify_key, signature_problem
from fusedspec.registry.store import NotFound, Store
from fusedspec.registry.uri import join_key
from fusedspec.registry.versions import read_manifest

GRAPHS = ".graphs"


class GraphPointer(Document):
    FIX: ClassVar[str] = "the next publish of that graph key rewrites it"
    ERROR: ClassVar[type[InputError]] = StoreError

    version: str = Field(min_length=1, max_length=2048,
                         description="{config}/{key} of a version holding them")


def pointer_key(graph_key: str, signer: str) -> str:
    return join_key(GRAPHS, graph_key, signer)


def remember_graph(store: Store, manifest: Manifest, version: str) -> None:
    """Point the graph key of a just-committed, signed version at it, under its signer's key id."""
    if manifest.graph_key is not None and manifest.programs and manifest.signature is not None:
        store.put_bytes(pointer_key(manifest.graph_key, manifest.signature.key_id),
                        GraphPointer(version=version).to_bytes())


def _signers(store: Store, graph_key: str) -> list[str]:
    prefix = join_key(GRAPHS, graph_key) + "/"
    return sorted(info.key[len(prefix):] for info in store.list(prefix))


@dataclass(frozen=True)
class StorePrograms:
    """What the store holds for a graph key: a trusted version to fetch from, or why not."""

    version: str | None  # {config}/{key} of a version whose programs can be fetched
    manifest: Manifest | None
    refusal: str | None  # why the programs cannot be fetched (None when there are none, or they can be)


def programs_in_store(store: Store, graph_key: str, settings: Settings) -> StorePrograms:
    """The version that holds `graph_key`'s programs, when its manifest is signed by the verify key."""
    if settings.verify_key is None:
        signers = _signers(store, graph_key)
        return StorePrograms(None, None, None if not signers else (
            f"the store holds these programs, signed by {', '.join(signers)}, but no verify key is set, and "
            "programs are code this host would run: set FUSEDSPEC_VERIFY_KEY to the publisher's public key"))
    public = load_verify_key(settings.verify_key)
    mine = key_id(public)
    try:
        pointer = GraphPointer.parse_bytes(store.get(pointer_key(graph_key, mine)), GRAPHS)
        manifest, _, problems = read_manifest(store, pointer.version)
    except NotFound:
        others = [s for s in _signers(store, graph_key) if s != mine]
        return StorePrograms(None, None, None if not others else (
            f"the store holds these programs signed by {', '.join(others)}, not by the configured verify key "
            f"{mine}"))
    except StoreError as exc:
        return StorePrograms(None, None, f"the store's pointer to graph key {graph_key[:12]} is unusable "
                                         f"({exc})")
    where = store.describe(pointer.version)
    if manifest is None or manifest.graph_key != graph_key or not manifest.programs:
        return StorePrograms(None, None, f"{where} does not hold graph key {graph_key[:12]}'s programs "
                                         f"({'; '.join(problems) or 'its manifest names other programs'})")
    refused = signature_problem(manifest, public)
    if refused:
        return StorePrograms(None, None, f"{where}: {refused}")
    return StorePrograms(pointer.version, manifest, None)


def fetch_programs(store: Store, graph_key: str, backend: str, settings: Settings) -> ProgramSet | None:
    """The work dir's program cache entry of `graph_key`, downloaded from the store when a trusted version
    holds it (the caller holds the graph key's lock: compile/build.py graph_lock). None when there is none."""
    found = programs_in_store(store, graph_key, settings)
    if found.version is None or found.manifest is None:
        return None
    manifest = found.manifest
    prefix = join_key(found.version, manifest.attempt)
    with program_cache.filling(settings, graph_key, backend,
                               store.describe(found.version)) as (staging, files):
        for rel in manifest.programs:
            entry = manifest.files[rel]
            _download(store, join_key(prefix, rel), staging / rel, entry.size, entry.sha256)
            files[rel] = entry.size
    return program_cache.find(settings, graph_key)


def _download(store: Store, key: str, path: Path, size: int, sha256: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    with open(path, "wb") as out:
        for chunk in store.iter_bytes(key):
            digest.update(chunk)
            written += len(chunk)
            if written > size:
                break
            out.write(chunk)
    if written != size or digest.hexdigest() != sha256:
        raise ArtifactError(f"{store.describe(key)}: {written} bytes with sha256 "
                            f"{digest.hexdigest()[:16]}..., its signed manifest says {size} bytes, "
                            f"{sha256[:16]}...: the object was altered; publish the version again")
