"""Publish attempts: every publisher writes a version's files under a directory of its own, and says it is
alive with a marker, so that leftovers of a killed publisher can be told from a publisher at work.

    {config}/{key}/{attempt}/...              the attempt's files (a version's, once a manifest names it)
    .attempts/{config}/{key}/{attempt}.json   the marker: host, process, start time, heartbeat

An attempt is dead when its marker says it ran on this host in a process that no longer exists (the
process's start time guards against a reused pid), or when its heartbeat is older than its lease. Both
the heartbeat's time and the age it is judged at come from the store's clock (`Store.now`), never from a
host's: a host whose clock is minutes ahead would otherwise take every live publisher elsewhere for dead.
A publisher writes its marker before its first object and deletes it last (after committing, or after
deleting its own objects when it lost), so a sweep that sees no marker and then reads the manifest sees
every attempt that won. `sweep` removes dead and unmarked attempts that no manifest names: their objects,
their unfinished multipart uploads, their markers. An attempt that holds a committed version (a
manifest.json or LATEST below it: a version nested there by hand) is never deleted; it is reported kept.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

from pydantic import Field

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.manifest import LATEST, MANIFEST
from fusedspec.core.errors import InputError, StoreError
from fusedspec.registry.heartbeat import heartbeat
from fusedspec.registry.store import NotFound, Store
from fusedspec.registry.uri import join_key

ATTEMPTS = ".attempts"
LEASE_SECONDS = 600.0  # a heartbeat older than this means the publisher is gone (it renews every 30 s)
HEARTBEAT_SECONDS = 30.0


class AttemptMarker(Document):
    FIX: ClassVar[str] = "it is debris of a publisher: `fusedspec gc URI` removes it"
    ERROR: ClassVar[type[InputError]] = StoreError

    host: str
    pid: int
    process_start: str | None = Field(default=None, description="the process's start time (/proc), if known")
    started_at: float = Field(description="the store's clock when the publisher began")
    renewed_at: float = Field(description="the store's clock at the last heartbeat")
    lease_seconds: float = LEASE_SECONDS


# What an attempt directory is called; nothing else under a version is ever taken for one (so a sweep
# never deletes what it does not recognise, e.g. a whole version when gc is given the wrong root).
ATTEMPT_NAME = re.compile(r"^a\d{8}T\d{6}-[0-9a-f]{8}$")


def new_attempt_id() -> str:
    """Sortable by start time, unique across hosts: `a20261201T061500-1f2e3d4c`."""
    return f"a{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def marker_key(config_path: str, key: str, attempt: str) -> str:
    return join_key(ATTEMPTS, config_path, key, f"{attempt}.json")


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None where /proc is not there."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return fields[19]  # field 22 of stat(5), counted after the command name
    except (OSError, IndexError):
        return None


def this_process() -> tuple[str, int, str | None]:
    return socket.gethostname(), os.getpid(), _process_start(os.getpid())


def is_dead(marker: AttemptMarker, now: float) -> bool:
    host, _, _ = this_process()
    if marker.host == host and marker.process_start is not None:
        start = _process_start(marker.pid)
        if start is None or start != marker.process_start:
            return True  # that process is gone (or the pid belongs to another process now)
        return False
    return marker.renewed_at + marker.lease_seconds < now


@dataclass
class Attempt:
    """A publisher's attempt at a version; `live()` keeps its marker renewed while it works."""

    store: Store
    config_path: str
    key: str
    id: str = field(default_factory=new_attempt_id)
    lease_seconds: float = LEASE_SECONDS
    heartbeat_seconds: float = HEARTBEAT_SECONDS

    @property
    def prefix(self) -> str:
        return join_key(self.config_path, self.key, self.id)

    def _write_marker(self, started: float) -> None:
        host, pid, process_start = this_process()
        marker = AttemptMarker(host=host, pid=pid, process_start=process_start, started_at=started,
                               renewed_at=self.store.now(), lease_seconds=self.lease_seconds)
        self.store.put_bytes(marker_key(self.config_path, self.key, self.id), marker.to_bytes())

    @contextmanager
    def live(self) -> Iterator[Attempt]:
        """Marker written now and renewed in the background until the block ends; then deleted."""
        started = self.store.now()
        self._write_marker(started)

        def beat() -> bool:
            try:
                self._write_marker(started)
            except StoreError:
                pass  # the publisher's own requests will report the store; a missed beat is not fatal
            return True

        try:
            with heartbeat(self.heartbeat_seconds, beat, name=f"attempt-{self.id}"):
                yield self
        finally:
            self.store.delete(marker_key(self.config_path, self.key, self.id))

    def discard(self) -> None:
        """Delete this attempt's objects and unfinished uploads (it lost, or failed before committing)."""
        remove_attempt(self.store, self.config_path, self.key, self.id)


def versions_inside(store: Store, prefix: str) -> list[str]:
    """Manifests and LATEST pointers below `prefix`: versions (or configs) someone put inside it."""
    return [info.key for info in store.list(prefix) if info.key.rsplit("/", 1)[-1] in (MANIFEST, LATEST)]


def remove_attempt(store: Store, config_path: str, key: str, attempt: str) -> int | None:
    """Delete an attempt's objects and abort its unfinished uploads; how many things were removed, or None
    when it holds a committed version (see the module docstring: then nothing of it is deleted)."""
    prefix = join_key(config_path, key, attempt)
    if versions_inside(store, prefix):
        return None
    removed = 0
    for upload in store.list_uploads(prefix):
        store.abort_upload(upload)
        removed += 1
    for info in store.list(prefix):
        store.delete(info.key)
        removed += 1
    return removed


def attempts_of(store: Store, config_path: str, key: str) -> dict[str, AttemptMarker | None]:
    """Every attempt of a version that has objects, uploads or a marker, with its marker (None: none).
    Only directories named like attempts count (ATTEMPT_NAME)."""
    version = join_key(config_path, key)
    found: dict[str, AttemptMarker | None] = {}
    for item_key in [info.key for info in store.list(version)] + [u.key for u in store.list_uploads(version)]:
        rest = item_key[len(version) + 1:]
        if "/" in rest and ATTEMPT_NAME.match(rest.split("/", 1)[0]):
            found.setdefault(rest.split("/", 1)[0], None)
    markers = join_key(ATTEMPTS, version)
    for info in store.list(markers):
        name = info.key.rsplit("/", 1)[-1]
        if not name.endswith(".json") or not ATTEMPT_NAME.match(name[:-5]):
            continue
        try:
            found[name[:-5]] = AttemptMarker.parse_bytes(store.get(info.key), store.describe(info.key))
        except (NotFound, StoreError):
            found.setdefault(name[:-5], None)  # gone since the listing, or unreadable: no live owner
    return found


@dataclass
class Swept:
    """What a sweep removed (or, dry, would remove) of one version."""

    removed: list[str] = field(default_factory=list)  # attempts deleted
    kept: list[str] = field(default_factory=list)  # dead attempts left whole: each holds a version
    uploads: list[str] = field(default_factory=list)  # unfinished uploads aborted (their keys)
    markers: list[str] = field(default_factory=list)  # markers of dead publishers deleted


def sweep(store: Store, config_path: str, key: str, referenced: Callable[[], set[str]],
          *, now: float | None = None, dry_run: bool = False) -> Swept:
    """Remove the attempts of a version that no manifest names and no live publisher owns, with their
    unfinished uploads and markers; of the committed attempt, once its publisher is gone, only its marker
    and unfinished uploads (tries of a part that failed and could not be aborted).

    `referenced()` (the attempt the manifest names) is called after the listing: see the module docstring
    for why the order matters. `now` is the store's clock (read from the store when not given). With
    `dry_run`, nothing is removed: the result says what would be."""
    now = store.now() if now is None else now
    candidates = attempts_of(store, config_path, key)
    keep = referenced()
    swept = Swept()
    for attempt, marker in sorted(candidates.items()):
        if marker is not None and not is_dead(marker, now):
            continue  # a publisher at work
        prefix = join_key(config_path, key, attempt)
        uploads = store.list_uploads(prefix)
        if attempt not in keep and versions_inside(store, prefix):
            swept.kept.append(attempt)
            uploads = []
        elif attempt not in keep:
            swept.removed.append(attempt)
        swept.uploads += [upload.key for upload in uploads]
        if marker is not None:
            swept.markers.append(marker_key(config_path, key, attempt))
        if dry_run:
            continue
        for upload in uploads:
            store.abort_upload(upload)
        if attempt in swept.removed:
            remove_attempt(store, config_path, key, attempt)
        if marker is not None:
            store.delete(marker_key(config_path, key, attempt))
    return swept
