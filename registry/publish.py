"""Publish one artifact directory as an immutable, crash-safe version in a store.

Layout under the store root (a bucket prefix or a directory):

    {target}/{draft}/{spec.slug}/{key}/manifest.json     the version's commit point: names its attempt
    {target}/{draft}/{spec.slug}/{key}/{attempt}/...     the version's files: a plain directory a pod mounts
    {target}/{draft}/{spec.slug}/LATEST                  the newest validated version, compare-and-swap
    .attempts/{target}/{draft}/{spec.slug}/{key}/{attempt}.json   a publisher at work (registry.attempts)
    .blobs/<sha256>                                      content index for copy-dedup (registry.blobs)

`{target}`/`{draft}` are the models' store names (compile.modelref.store_name, recorded in build.json).

The protocol, in the order things happen:
1. Read build.json and validation.json (or take them as the run that wrote them hands them over: then
   validation.json must still be the bytes it wrote, since the file is what is uploaded); refuse an
   artifact holding a symlink or special file, and one that did not pass the greedy gate unless
   `unvalidated` is asked for (the manifest then says so). Hash every file (a file hashed before and
   unchanged since is not read: core.files.FileHasher). Any bad input stops here, before the store is
   written to.
2. Read the version's manifest and list its attempt directory (registry.versions). Intact (every file there
   with the size and etag the manifest records, nothing else): send nothing; at most move LATEST (6).
   An intact version published --unvalidated is replaced like a damaged one when this artifact passed
   the gate, so a validated build of the key can become LATEST. With a signing key, an intact version
   whose manifest that key has not signed (signing turned on, a key rotated) gets its manifest signed
   again by compare-and-swap, nothing else sent, when this artifact holds the version's very files (and
   a passing validation.json if the version says it passed); otherwise that is refused, nothing written.
3. Otherwise (absent, or damaged: a broken manifest, a file missing, truncated or overwritten) start a new
   attempt under a fresh directory, its marker renewed while it works. For each file: server-side copy from
   an object whose store checksum equals the file's (registry.blobs: never on the writer's word), pinned
   to the etag that was checked; else upload it with its checksum, which the store verifies. HEAD it:
   size and store checksum must be the file's. Before committing, list the attempt once more.
4. Commit: write manifest.json naming the attempt (with every file's size, sha256 and etag; signed when a
   signing key is set), create-only (If-None-Match) when there was none, or by compare-and-swap on the
   damaged manifest's etag. Exactly one publisher wins a race; a loser deletes its attempt and reports
   the winner's; both exit 0. A loser whose artifact passed the gate while the winner's version is
   unvalidated goes back to step 2, which replaces that version (at most REPLACE_ROUNDS times, then it
   exits non-zero saying so). A commit whose answer was lost (a timeout) is settled by reading it back.
   Only the winner then points the content index (registry.blobs) at its files, so a pointer never names
   an object that a losing or killed publisher's attempt held (those are deleted).
5. Delete the attempt's marker; sweep the version's attempts that no manifest names and no live publisher
   owns (a loser's, a killed publisher's, the damaged version a repair replaced): objects, unfinished
   multipart uploads, markers.
6. Move LATEST to this key by compare-and-swap (If-Match), only when the version passed the gate, and
   unless LATEST already names it or named it before (its history), so an old version republished never
   pulls LATEST back.

Why no interleaving of publishers, crashes and restarts makes a visible version differ from its manifest:
a reader sees a version only through its manifest, and a manifest names one attempt. An attempt's objects
are written only by its own publisher, only before that publisher commits, and each was checked against
the bytes the manifest records before the commit. After the commit nobody writes into that attempt: other
publishers write into their own, and sweeps delete only attempts that the manifest read *after* listing
them does not name (the marker of a winner is deleted only after its commit). So a visible version is
what its publisher checked, unless something outside fusedspec deletes or overwrites objects: then the
version is damaged, every reader's check (a listing: sizes and etags) says so, and the next publish or
run replaces it by compare-and-swap, so that LATEST and readers move to a complete one.

A crash anywhere leaves either no new manifest (the attempt is invisible; the next publish or
`fusedspec gc` removes it and aborts its uploads) or a complete committed version. The kill tests
(tests/test_publish_crash.py) stop the publisher at every named point below with SIGKILL.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

from fusedspec.compile.artifact_files import LocalFile, artifact_files
from fusedspec.compile.backend import read_build_description
from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.documents.manifest import (
    LATEST,
    MANIFEST,
    FileEntry,
    LatestPointer,
    Manifest,
    Models,
    Producer,
)
from fusedspec.compile.documents.validation import VALIDATION_FILE, ValidationDocument, content_hash
from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
from fusedspec.compile.validated import HeldValidation, read_passed_validation, vouching
from fusedspec.core.errors import ArtifactError, StoreError, UnreadableObject
from fusedspec.core.files import FileHasher
from fusedspec.core.settings import Settings
from fusedspec.registry.attempts import Attempt, sweep
from fusedspec.registry.blobs import remember, trusted_source
from fusedspec.registry.graphs import remember_graph
from fusedspec.registry.signing import load_signing_key, sign, signature_problem
from fusedspec.registry.store import NotFound, ObjectInfo, PreconditionFailed, Store
from fusedspec.registry.stores import open_writable_store
from fusedspec.registry.uri import join_key
from fusedspec.registry.versions import VersionState, read_latest, read_manifest, version_state

LATEST_HISTORY = 50  # previous keys kept in LATEST, so a re-run of an old publish can tell it was superseded
CAS_ATTEMPTS = 50
# a validated publisher that loses to unvalidated ones goes back to step 2 at most this often
REPLACE_ROUNDS = 3
Outcome = Literal["created", "existing", "repaired", "re-signed", "lost"]
Step = Callable[[str], None]  # test seam: called with the name of each point of the protocol


class PublishProgress(Protocol):
    """What a terminal progress display gets told (see flows/commands/publish.py for the rich one)."""

    def begin(self, total_bytes: int, files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def end(self) -> None: ...


@dataclass
class PublishResult:
    version_uri: str  # the version directory (manifest.json; verify and k8s take it)
    files_uri: str  # the attempt directory that holds the version's files
    key: str
    config_path: str
    outcome: Outcome  # created | existing (intact, nothing sent) | repaired (a damaged one replaced)
    #                   | re-signed (intact, its manifest signed again with this signing key) | lost
    attempt: str  # the attempt the version's manifest names (the winner's when this call lost a race)
    validated: bool
    latest_moved: bool
    bytes_sent: int  # request body bytes sent to the store by this call (files, manifest, pointers)
    files_uploaded: int = 0
    files_copied: int = 0  # server-side copies of identical content already in the store
    removed_attempts: list[str] = field(default_factory=list)  # dead or losing attempts swept
    # dead attempts left whole: a version is nested in each
    kept_attempts: list[str] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)  # version existed: local files that differ from it

    @property
    def created(self) -> bool:
        return self.outcome in ("created", "repaired")

    @property
    def repaired(self) -> bool:
        return self.outcome == "repaired"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def config_path_of(description: BuildDescription) -> str:
    return join_key(description.target.store_name, description.draft.store_name, description.spec.slug)


def producer_version() -> str:
    try:
        return metadata.version("fusedspec")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass
class Prepared:
    """Everything a publish knows before it touches the store (step 1)."""

    description: BuildDescription
    validation: ValidationDocument | None
    files: list[LocalFile]
    config_path: str
    tokenizer_hash: str | None

    @property
    def key(self) -> str:
        return self.description.key

    @staticmethod
    def _entry(local: LocalFile, info: ObjectInfo | None) -> FileEntry:
        """A file's manifest entry, with what the store said of the object it holds (etag, checksum)."""
        return FileEntry(size=local.size, sha256=local.sha256, etag=info.etag if info else None,
                         checksum=info.checksum if info else None)

    def manifest(self, attempt: str, stored: dict[str, ObjectInfo], settings: Settings, *,
                 created_at: str | None = None) -> Manifest:
        d = self.description
        manifest = Manifest(
            key=d.key, graph_key=d.graph_key, weight_key=d.weight_key, programs=d.programs, backend=d.backend,
            config_path=self.config_path, attempt=attempt, spec=d.spec,
            models=Models(target=d.target, draft=d.draft), tokenizer_hash=self.tokenizer_hash,
            toolchain=d.toolchain, code_version=d.code_version, options=d.options,
            files={f.rel: self._entry(f, stored.get(f.rel)) for f in self.files},
            validated=self.validation is not None,
            validation=self.validation.summary_record() if self.validation is not None else None,
            producer=Producer(version=producer_version()),
            created_at=created_at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return sign(manifest, load_signing_key(settings.signing_key)) if settings.signing_key else manifest


def prepare(artifact_dir: Path, settings: Settings, *, unvalidated: bool,
            description: BuildDescription | None = None,
            validation: HeldValidation | None = None) -> Prepared:
    """Step 1. The version is validated when validation.json vouches for the artifact as it is now
    (compile.validated, the rule a run's reuse applies); a report that says passed without vouching is
    refused, unless publishing unvalidated is allowed (then the version is published unvalidated). A caller
    that holds build.json and validation.json as its build and validation handed them over passes them as
    `description` and `validation` (they are not parsed again; the same checks apply, and validation.json
    must still be the bytes held, since it is uploaded as it is)."""
    description = description or read_build_description(artifact_dir)
    hasher = FileHasher(settings.cache_dir)
    hashed: list[list[LocalFile]] = []  # the files, once a report needs their content hash

    def files_hash() -> str:
        if not hashed:
            hashed.append(artifact_files(artifact_dir, hasher))
        return content_hash((f.rel, f.sha256) for f in hashed[-1])

    try:
        if validation is not None:
            # the files as they are uploaded: validation.json among them must be the bytes handed over
            files_hash()
            found = {f.rel: f.sha256 for f in hashed[-1]}.get(VALIDATION_FILE)
            held = vouching(validation, artifact_dir, description, files_hash, found)
        else:
            held = read_passed_validation(artifact_dir, description, files_hash)
    except ArtifactError:
        if not unvalidated:
            raise
        held = None
    if held is None and not unvalidated:
        raise ArtifactError(f"{artifact_dir} has not passed the greedy gate (no passing validation.json); "
                            "run `fusedspec validate` on it first, or publish it with --unvalidated (the "
                            "manifest then says so, and LATEST never names it)")
    if settings.signing_key:
        load_signing_key(settings.signing_key)  # a bad key is refused now, before anything is sent
    files = hashed[-1] if hashed else artifact_files(artifact_dir, hasher)
    return Prepared(description=description, validation=held.document if held else None, files=files,
                    config_path=config_path_of(description),
                    tokenizer_hash=artifact_tokenizer_hash(artifact_dir))


def publish_artifact(artifact_dir: Path, uri: str, settings: Settings, *,
                     progress: PublishProgress | None = None,
                     on_step: Step | None = None, store: Store | None = None, unvalidated: bool = False,
                     description: BuildDescription | None = None,
                     validation: HeldValidation | None = None) -> PublishResult:
    """Publish `artifact_dir` under `uri` (see the module docstring for the protocol).

    `store` may be passed already opened for `uri` (tests tune part sizes with it); `on_step` is called
    at named points ("hashed", "attempt", "upload:<file>", "stored:<file>", "before-manifest",
    "committed", "before-latest", "done") so tests can stop the publisher at a chosen moment.
    `description` and `validation`: the artifact's build.json and validation.json as the run holds them
    (prepare).
    """
    step = on_step or (lambda _name: None)
    # a bad store is refused before the artifact is hashed
    store = store or open_writable_store(uri, settings)
    prepared = prepare(Path(artifact_dir), settings, unvalidated=unvalidated, description=description,
                       validation=validation)
    step("hashed")
    sent_before = store.bytes_sent
    version = join_key(prepared.config_path, prepared.key)
    state = version_state(store, prepared.config_path, prepared.key)
    result = PublishResult(version_uri=store.describe(version), files_uri="", key=prepared.key,
                           config_path=prepared.config_path, outcome="existing", attempt="",
                           validated=prepared.validation is not None, latest_moved=False, bytes_sent=0)
    for _round in range(REPLACE_ROUNDS):
        if state.intact and state.manifest is not None and (state.manifest.validated
                                                            or prepared.validation is None):
            try:
                manifest = _re_signed(store, prepared, state, result, settings) or state.manifest
            except PreconditionFailed:  # its manifest changed since it was read: decide again
                state = version_state(store, prepared.config_path, prepared.key)
                continue
            break
        # absent, damaged, or published --unvalidated while this artifact passed the gate: replace it
        manifest = _publish_attempt(store, prepared, state, result, settings, progress, step)
        if result.outcome != "lost" or manifest.validated or prepared.validation is None:
            break
        state = version_state(store, prepared.config_path, prepared.key)  # lost to an unvalidated one: step 2
    else:
        raise StoreError(f"{store.describe(version)}: lost {REPLACE_ROUNDS} commits in a row to publishers "
                         "of unvalidated builds of this key, so this validated one is not published; publish "
                         "again")
    result.attempt, result.validated = manifest.attempt, manifest.validated
    result.files_uri = store.describe(join_key(version, manifest.attempt))
    result.differs = [f.rel for f in prepared.files if (entry := manifest.files.get(f.rel)) is None
                      or (entry.size, entry.sha256) != (f.size, f.sha256)]
    swept = sweep(store, prepared.config_path, prepared.key, lambda: _named_by_manifest(store, version))
    result.removed_attempts += swept.removed
    result.kept_attempts += swept.kept
    step("before-latest")
    if manifest.validated:
        result.latest_moved = move_latest(store, prepared.config_path, prepared.key)
    result.bytes_sent = store.bytes_sent - sent_before
    step("done")
    return result


def _re_signed(store: Store, prepared: Prepared, state: VersionState, result: PublishResult,
               settings: Settings) -> Manifest | None:
    """Step 2, with a signing key: an intact version whose manifest this key has not signed (unsigned, or
    signed by another key: signing turned on, a key rotated) gets a manifest signed with it, by
    compare-and-swap on the one read. Nothing else of the version changes (same attempt, same files). A
    signature vouches for bytes and for the gate, so this artifact must hold the version's files, and a
    passing validation.json when the version says it passed. None when there is nothing to sign."""
    existing = state.manifest
    assert existing is not None
    if not settings.signing_key:
        return None
    private = load_signing_key(settings.signing_key)
    if signature_problem(existing, private.public_key()) is None:
        return None  # signed with this key already
    where = store.describe(state.version)
    local = {f.rel: (f.size, f.sha256) for f in prepared.files}
    differs = sorted(name for name in set(local) | set(existing.files)
                     if (entry := existing.files.get(name)) is None
                     or local.get(name) != (entry.size, entry.sha256))
    if differs:
        raise ArtifactError(f"{where}: cannot sign it with this key: {', '.join(differs[:3])} of this "
                            "artifact differ from the version's, and a signature vouches for the version's "
                            "bytes. Publish with the signing key from the artifact that was published")
    if existing.validated and prepared.validation is None:
        raise ArtifactError(f"{where}: cannot sign it with this key: the version says it passed the greedy "
                            "gate and this artifact has no passing validation.json to vouch for that; "
                            "publish with the signing key from the validated artifact")
    stored = {name: ObjectInfo(key=name, size=entry.size, etag=entry.etag, checksum=entry.checksum)
              for name, entry in existing.files.items()}
    manifest = prepared.manifest(existing.attempt, stored, settings, created_at=existing.created_at)
    store.swap(join_key(state.version, MANIFEST), manifest.to_bytes(), expected_etag=state.manifest_etag)
    result.outcome = "re-signed"
    remember_graph(store, manifest, state.version)  # now signed: another machine may take its programs
    return manifest


def _named_by_manifest(store: Store, version: str) -> set[str]:
    """The attempt the version's manifest names now (read after a sweep's listing; see registry.attempts)."""
    manifest, _, _ = read_manifest(store, version)
    return {manifest.attempt} if manifest is not None else set()


def _publish_attempt(store: Store, prepared: Prepared, state: VersionState, result: PublishResult,
                     settings: Settings, progress: PublishProgress | None, step: Step) -> Manifest:
    """Steps 3-4: a new attempt, committed over an absent or damaged version; the manifest that won."""
    attempt = Attempt(store, prepared.config_path, prepared.key)
    version = join_key(prepared.config_path, prepared.key)
    with attempt.live():
        step("attempt")
        try:
            stored = _store_files(store, attempt.prefix, prepared.files, result, progress, step)
            problems = _recheck(store, attempt.prefix, prepared.files, stored)
            if problems:
                raise StoreError(f"{store.describe(attempt.prefix)}: changed before it was committed "
                                 f"({'; '.join(problems[:3])}); publish again (nothing was made visible)")
            manifest = prepared.manifest(attempt.id, stored, settings)
            step("before-manifest")
            won = _commit(store, version, manifest, state.manifest_etag if state.exists else None)
        except BaseException:
            attempt.discard()
            raise
        if won:
            result.outcome = "repaired" if state.exists else "created"
            step("committed")
            for local in prepared.files:  # only now: a pointer names an object of a committed version
                remember(store, local.sha256, join_key(attempt.prefix, local.rel), local.size)
            remember_graph(store, manifest, version)
            return manifest
        attempt.discard()
    result.outcome = "lost"
    winner, _, problems = read_manifest(store, version)
    if winner is None:
        raise StoreError(f"{store.describe(version)}: another publisher committed this version, but its "
                         f"manifest cannot be read ({'; '.join(problems) or 'gone'}); publish again")
    return winner


def _store_files(store: Store, prefix: str, files: list[LocalFile], result: PublishResult,
                 progress: PublishProgress | None, step: Step) -> dict[str, ObjectInfo]:
    """Copy or upload every file into the attempt, each checked by the store's checksum; what the store
    then says of each (its etag and checksum go into the manifest)."""
    if progress is not None:
        progress.begin(sum(f.size for f in files), len(files))
    stored: dict[str, ObjectInfo] = {}
    try:
        for local in files:
            dest = join_key(prefix, local.rel)
            expected = store.expected_checksum(local.path, local.sha256)
            info = _copy_trusted(store, local, dest, expected)
            if info is not None:
                result.files_copied += 1
                if progress is not None:
                    progress.advance(local.size)
            else:
                step(f"upload:{local.rel}")
                store.put_file(dest, local.path, sha256=local.sha256,
                               progress=progress.advance if progress is not None else None)
                result.files_uploaded += 1
                info = store.head(dest)
                if info is None or info.size != local.size or info.checksum != expected:
                    seen = "nothing" if info is None else f"size {info.size}, checksum {info.checksum}"
                    raise StoreError(f"{store.describe(dest)}: after writing, the store reports {seen}; "
                                     f"expected size {local.size}, checksum {expected}. Publish again "
                                     "(nothing was made visible)")
            stored[local.rel] = info
            step(f"stored:{local.rel}")
    finally:
        if progress is not None:
            progress.end()
    return stored


def _copy_trusted(store: Store, local: LocalFile, dest: str, expected: str) -> ObjectInfo | None:
    """Copy `local`'s bytes from an object already in the store, when one is trusted (registry.blobs), and
    check the copy; its info, or None when nothing was copied (the caller uploads the file).

    A copy whose own checksum is not the file's is deleted: its source held other bytes than the checksum
    the store gave for it. A directory store's checksum comes from a cache keyed by size, mtime and inode,
    which a file corrupted in place on disk keeps; without this, every later publish of that content
    would copy the same bad bytes and fail."""
    source = trusted_source(store, local.sha256, local.size, expected)
    if source is None or source.etag is None:
        return None
    try:
        store.copy(source.key, dest, if_match=source.etag)
    except (PreconditionFailed, NotFound, UnreadableObject):
        # replaced, removed or damaged since it was checked: upload instead (the pointer then moves)
        return None
    info = store.head(dest)
    if info is None or info.size != local.size or info.checksum != expected:
        store.delete(dest)
        return None
    return info


def _recheck(store: Store, prefix: str, files: list[LocalFile], stored: dict[str, ObjectInfo]) -> list[str]:
    """Problems of the attempt's listing against what was written (nothing may have changed or been added)."""
    present = {info.key[len(prefix) + 1:]: info for info in store.list(prefix)}
    problems = [f"{f.rel}: missing or changed" for f in files
                if (info := present.get(f.rel)) is None or info.size != f.size
                or info.etag != stored[f.rel].etag]
    return problems + [f"{name}: not written by this publisher"
                       for name in sorted(set(present) - {f.rel for f in files})]


def _commit(store: Store, version: str, manifest: Manifest, replaced_etag: str | None) -> bool:
    """Write the manifest create-only, or over a damaged one by compare-and-swap. True when this call won.
    A write whose answer was lost is settled by reading the manifest back."""
    key = join_key(version, MANIFEST)
    try:
        if replaced_etag is None:
            return store.create(key, manifest.to_bytes())
        store.swap(key, manifest.to_bytes(), expected_etag=replaced_etag)
        return True
    except PreconditionFailed:
        return False
    except StoreError:
        found, _, _ = read_manifest(store, version)
        if found is not None and found.attempt == manifest.attempt:
            return True
        raise


def read_published_validation(store: Store, manifest: Manifest) -> ValidationDocument | None:
    """The validation.json published with a version (None when it has none or it cannot be read)."""
    if VALIDATION_FILE not in manifest.files:
        return None
    key = join_key(manifest.config_path, manifest.key, manifest.attempt, VALIDATION_FILE)
    try:
        return ValidationDocument.parse_bytes(store.get(key), store.describe(key))
    except (NotFound, ArtifactError):
        return None


def move_latest(store: Store, config_path: str, key: str) -> bool:
    """Point `config_path`/LATEST at `key` by compare-and-swap. False when it already does or did.

    Only call this for a committed, validated version: LATEST must always name a complete one.
    """
    pointer_key = join_key(config_path, LATEST)
    for _attempt in range(CAS_ATTEMPTS):
        try:
            current, etag = read_latest(store, config_path)
        except StoreError:
            # a broken pointer is replaced, still by CAS
            current, etag = None, store.get_with_etag(pointer_key)[1]
        if current is not None and (current.key == key or key in current.history):
            return False
        history = ([current.key, *current.history][:LATEST_HISTORY]) if current is not None else []
        document = LatestPointer(key=key, version=join_key(config_path, key), history=history,
                                 updated_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        try:
            store.swap(pointer_key, document.to_bytes(), expected_etag=etag)
            return True
        except PreconditionFailed:
            time.sleep(random.uniform(0.01, 0.1))  # another publisher moved it: re-read and decide again
    raise StoreError(f"{store.describe(pointer_key)}: could not move LATEST after {CAS_ATTEMPTS} attempts "
                     "(too many publishers at once); publish again")
