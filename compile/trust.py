"""What a loader may believe about an artifact's files, and the one way it reads them: hashed as it reads.

    trust = LoadTrust.for_directory(artifact_dir, builds_dir)   # built here, or nothing vouches for it
    trust = LoadTrust(where, hashes=manifest_hashes, signer="key id")  # a manifest whose signature verified
    data = trust.read_bytes(artifact_dir, "build.json")         # VerificationError unless sha256 matches
    with trust.open(artifact_dir, rel) as reader: reader.readinto(view); ...   # large files, chunk by chunk
    trust.native_refusal(rel)                                   # why native code may not load, or None
    trust.loaded_sha256(artifact_dir, rel)                      # sha256 of the bytes loaded, while unchanged

A loader reads every byte of the files it loads anyway, so it hashes them on the way in (in a second
thread, while the next chunk is read) and compares the digest with the manifest's when the file ends.
That costs no extra read, and what was checked is the very bytes that were loaded: a file cannot change
between a check and its use. A mismatch is a VerificationError naming the file; serving never starts.
Given a FileHasher (`hasher`), the loader hashes even with no manifest in hand, keeps each digest with the
file's stat when opened (`loaded`) and hands it to the hasher, so whoever hashes the artifact next reads
none of those files again. Validation's content hash takes each loaded file's entry from `loaded_sha256`:
the digest of the bytes that ran, or a refusal naming the file when it changed since it was read (hashing
it anew would vouch for bytes the gate never ran).

Native code (an AOTInductor package's shared library, NxDI's TorchScript model: anything a loader
executes) is loaded only from a build this work dir compiled (an artifact under its builds/ directory:
nothing but `fusedspec compile` writes there), or from bytes that matched a manifest whose signature
verified with the configured verify key. An unsigned manifest proves integrity, not authorship: anyone
who can write to the store can write a manifest. Everything else is refused before a byte of it runs,
with the way to trust it. `registry.trust` builds a LoadTrust from a version's manifest.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fusedspec.core.errors import ArtifactError, VerificationError
from fusedspec.core.files import FileHasher, unchanged

# The files a loader runs as code, to which the native-code rule applies: AOTInductor packages (a shared
# library inside) and NxDI's traced model (TorchScript holding the compiled NEFFs).
AOTI_SUFFIX = ".aoti.pt2"
NXDI_MODEL = "model.pt"
# read and hashed at a time: large enough that sha256 releases the GIL and runs beside the read
CHUNK_BYTES = 8 << 20
TRUST_FIX = ("build it here (`fusedspec compile`: builds under the work dir's builds/ are trusted), or serve "
             "a version whose manifest is signed (publish with FUSEDSPEC_SIGNING_KEY) with its public key "
             "set in FUSEDSPEC_VERIFY_KEY[_FILE] (`fusedspec keygen` makes a pair)")


def is_native(rel: str) -> bool:
    return rel.endswith(AOTI_SUFFIX) or rel == NXDI_MODEL


@dataclass(frozen=True)
class LoadedFile:
    """A file a loader read whole: sha256 and size of the bytes it read, and the file's stat when opened."""

    sha256: str
    size: int
    opened: os.stat_result


@dataclass
class LoadTrust:
    """What is known about one artifact directory's bytes before any of them is loaded.

    `hashes`: relative path -> sha256 of every file, from a manifest (empty: none known, as for a build
    of this work dir, which nothing else writes). `signer`: the key id whose signature over that manifest
    verified with the configured key. `built_here`: the directory is a build of this work dir.
    `unsigned_reason` says, for messages, why the manifest does not vouch for authorship. `hasher`: where
    the digest of every file read whole is remembered (core.files.FileHasher); with one, `loaded` keeps
    what the loader read of each file."""

    where: str  # the version or directory, for messages
    hashes: Mapping[str, str] = field(default_factory=dict)
    signer: str | None = None
    built_here: bool = False
    unsigned_reason: str = "no signed manifest vouches for it"
    verified: set[str] = field(default_factory=set)  # files whose bytes were hashed and matched
    hasher: FileHasher | None = None
    loaded: dict[str, LoadedFile] = field(default_factory=dict)  # relative path -> what the loader read

    @classmethod
    def for_directory(cls, artifact_dir: Path, builds_dir: Path) -> LoadTrust:
        """A directory with no manifest in hand: trusted with native code only when it lies under
        `builds_dir` (resolved, so a symlink out of it does not count)."""
        try:
            inside = Path(artifact_dir).resolve().is_relative_to(Path(builds_dir).resolve())
        except OSError:
            inside = False
        reason = "it is not a build of this work dir and no signed manifest vouches for it"
        return cls(where=str(artifact_dir), built_here=inside, unsigned_reason=reason)

    @property
    def checks_hashes(self) -> bool:
        return bool(self.hashes)

    @property
    def hashes_reads(self) -> bool:
        """The loader hashes what it reads (a manifest to check, or a hasher to hand digests to): a file it
        would load by path (native code) is then loaded from a private copy of the bytes it hashed."""
        return self.checks_hashes or self.hasher is not None

    def expected(self, rel: str) -> str | None:
        """The sha256 `rel` must have (None when no manifest is in hand); a file the loader reads that the
        manifest does not list is refused (it was not published with the version)."""
        if not self.hashes:
            return None
        if rel not in self.hashes:
            raise VerificationError(f"{self.where}: {rel} is read by the loader but not listed in the "
                                    "manifest; the version is not what was published: publish it again")
        return self.hashes[rel]

    def native_refusal(self, rel: str) -> str | None:
        """Why the native code in `rel` may not be loaded, or None when it may."""
        if self.built_here or self.signer is not None:
            return None
        return (f"{self.where}: {rel} is native code (a compiled shared library that loading runs) and "
                f"{self.unsigned_reason}: refused before loading. To trust it, {TRUST_FIX}")

    def mismatch(self, rel: str, size: int, digest: str, expected: str) -> VerificationError:
        return VerificationError(f"{self.where}: {rel}: sha256 {digest[:16]}… of the {size} bytes read "
                                 f"differs from the manifest's {expected[:16]}…; the file changed after it "
                                 "was published (a damaged or tampered object): "
                                 "refusing it. Publish the artifact again")

    @contextmanager
    def open(self, artifact_dir: Path, rel: str) -> Iterator[CheckedReader]:
        """`rel` under `artifact_dir`, read through a CheckedReader; its digest is compared when the block
        ends (the rest of the file is read and hashed first). A block that found the bytes malformed
        (ArtifactError) is reported as the mismatch when the bytes are not the manifest's."""
        path = Path(artifact_dir) / rel
        expected = self.expected(rel)
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise ArtifactError(f"{path}: missing; the artifact is incomplete "
                                "(rebuild or re-download it)") from None
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        opened = os.fstat(handle.fileno())
        reader = CheckedReader(handle, hashing=expected is not None or self.hasher is not None)
        try:
            try:
                yield reader
            except ArtifactError:
                # bytes the loader could not parse: when they are not the published ones, that is the reason
                if expected is not None and (found := reader.finish())[1] != expected:
                    raise self.mismatch(rel, *found, expected) from None
                raise
            size, digest = reader.finish()
        finally:
            reader.close()
        if expected is not None:
            if digest != expected:
                raise self.mismatch(rel, size, digest, expected)
            self.verified.add(rel)
        if self.hasher is not None:
            self.loaded[rel] = LoadedFile(digest, size, opened)
            self.hasher.remember(path, opened, size, digest)

    def loaded_sha256(self, artifact_dir: Path, rel: str) -> str | None:
        """The sha256 of the bytes the loader read of `rel` (None: it read none), while the file is still the
        one it read; else ArtifactError naming it: the loader ran the bytes it read, which are gone, and a
        hash of the file as it is now would vouch for bytes that never ran."""
        read = self.loaded.get(rel)
        if read is None:
            return None
        path = Path(artifact_dir) / rel
        try:
            now = path.stat()
        except OSError:
            now = None
        if now is None or not unchanged(read.opened, now) or now.st_size != read.size:
            what = "gone" if now is None else "changed"
            raise ArtifactError(f"{path}: {what} since the loader read it; what ran is not what is there "
                                f"now, so nothing vouches for it: validate it again (`fusedspec validate "
                                f"{artifact_dir}`)")
        return read.sha256

    def read_bytes(self, artifact_dir: Path, rel: str) -> bytes:
        """The whole of a small file, checked."""
        with self.open(artifact_dir, rel) as reader:
            return reader.read_all()

    def verify_file(self, artifact_dir: Path, rel: str) -> None:
        """Hash a file the caller does not load itself (what another loader will read, a tokenizer file)."""
        with self.open(artifact_dir, rel):
            pass

    def unverified(self) -> list[str]:
        """Files of the manifest no load has checked yet (the caller hashes them before it is ready)."""
        return sorted(set(self.hashes) - self.verified)


class CheckedReader:
    """Sequential reads of one file; every byte read is hashed in a second thread (hashlib and file reads
    both release the GIL, so hashing a chunk overlaps reading the next). Bytes handed to readinto must not
    change until the reader finishes (they are tensors being filled: nothing writes them again)."""

    def __init__(self, handle: io.BufferedReader, *, hashing: bool):
        self.handle = handle
        self.size = 0
        self._digest = hashlib.sha256()
        self._work: queue.SimpleQueue[memoryview | bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if hashing:
            self._work = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._hash, name="fusedspec-hash", daemon=True)
            self._thread.start()

    def _hash(self) -> None:
        assert self._work is not None
        while (chunk := self._work.get()) is not None:
            self._digest.update(chunk)

    def _seen(self, data: memoryview | bytes) -> None:
        self.size += len(data)
        if self._work is not None and len(data):
            self._work.put(data)

    def read(self, count: int) -> bytes:
        data = self.handle.read(count)
        self._seen(data)
        return data

    def readinto(self, target: memoryview) -> int:
        """Fill `target` completely (in chunks); fewer bytes only at the end of the file."""
        filled = 0
        while filled < len(target):
            view = target[filled:filled + CHUNK_BYTES]
            count = self.handle.readinto(view)
            if not count:
                break
            self._seen(view[:count])
            filled += count
        return filled

    def read_all(self) -> bytes:
        data = self.handle.read()
        self._seen(data)
        return data

    def finish(self) -> tuple[int, str]:
        """Read and hash what is left, then (bytes read, sha256 hex; '' when not hashing)."""
        if self._work is None:
            return self.size, ""
        while chunk := self.handle.read(CHUNK_BYTES):
            self._seen(chunk)
        self._stop()
        return self.size, self._digest.hexdigest()

    def _stop(self) -> None:
        if self._thread is not None and self._work is not None:
            self._work.put(None)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self._stop()
        self.handle.close()
