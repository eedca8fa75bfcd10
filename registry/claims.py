"""Build claims: one worker at a time compiles a given content key, across runs and machines.

A claim is a small object `.claims/<key>.json` in the artifact store, created create-only
(If-None-Match: *), so of two runs that start the same build together exactly one wins. The winner
renews it while it works (compare-and-swap on its own etag); the loser waits for the version to be
published. A claim that has not been renewed for its lease (a killed worker, a lost node) is taken over
by compare-and-swap, so a crash never blocks a build for longer than one lease. A worker whose claim was
taken over is told (`Claim.lost`) and stops before publishing. Claims only prevent duplicate work:
correctness still rests on the publish protocol (registry.publish).

Time is the store's clock (`Store.now`: the server's Date, a directory's mtime), for writing `renewed_at`
and for judging it, never this host's: a waiter whose clock is minutes ahead of the holder's would
otherwise take a live claim over. Tests of the lease arithmetic inject a clock (`clock`, `sleep`) to decide
when a lease runs out.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from fusedspec.compile.documents.base import Document
from fusedspec.core.errors import InputError, StoreError
from fusedspec.registry.heartbeat import heartbeat
from fusedspec.registry.store import NotFound, PreconditionFailed, Store

CLAIMS_PREFIX = ".claims"
Clock = Callable[[], float]


class ClaimDocument(Document):
    FIX: ClassVar[str] = "it is taken over as a stale claim"
    ERROR: ClassVar[type[InputError]] = StoreError

    owner: str
    renewed_at: float = Field(description="the store's clock when the holder last renewed it")
    lease_seconds: float = Field(gt=0)

    def stale(self, now: float) -> bool:
        return self.renewed_at + self.lease_seconds < now


def claim_key(key: str) -> str:
    return f"{CLAIMS_PREFIX}/{key}.json"


def new_owner() -> str:
    """Who holds a claim: host, process and a random part, so two runs in one process differ too."""
    return f"{socket.gethostname()}:{uuid.uuid4().hex[:12]}"


def _body(owner: str, lease_seconds: float, now: float) -> bytes:
    return ClaimDocument(owner=owner, renewed_at=now, lease_seconds=lease_seconds).to_bytes()


@dataclass
class Claim:
    store: Store
    key: str
    owner: str
    lease_seconds: float
    etag: str
    clock: Clock | None = None  # the store's clock unless a test gives one
    lost: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def renew(self) -> bool:
        """Extend the lease. False (and `lost` set) when another worker took the claim over."""
        with self._lock:
            if self.lost:
                return False
            try:
                now = (self.clock or self.store.now)()
                self.etag = self.store.swap(claim_key(self.key), _body(self.owner, self.lease_seconds, now),
                                            expected_etag=self.etag)
            except (PreconditionFailed, NotFound):
                self.lost = True
            return not self.lost

    def release(self) -> None:
        with self._lock:
            if self.lost:
                return
            try:
                _, etag = self.store.get_with_etag(claim_key(self.key))
            except NotFound:
                return
            if etag == self.etag:  # never delete a claim that somebody else took over
                self.store.delete(claim_key(self.key))
            self.lost = True


def _is_stale(data: bytes, now: float) -> bool:
    try:
        return ClaimDocument.parse_bytes(data, CLAIMS_PREFIX).stale(now)
    except StoreError:
        return True  # unreadable claims are debris, not owners


def try_claim(store: Store, key: str, owner: str, lease_seconds: float, *,
              clock: Clock | None = None) -> Claim | None:
    """Take the claim for `key`, or None while another worker holds a live one. `clock`: the store's
    (`store.now`) unless given."""
    now = clock or store.now
    path = claim_key(key)
    if store.create(path, _body(owner, lease_seconds, now())):
        _, etag = store.get_with_etag(path)
        return Claim(store, key, owner, lease_seconds, etag, clock)
    try:
        data, etag = store.get_with_etag(path)
    except NotFound:
        return try_claim(store, key, owner, lease_seconds, clock=clock)  # released between our two calls
    if not _is_stale(data, now()):
        return None
    try:
        new_etag = store.swap(path, _body(owner, lease_seconds, now()), expected_etag=etag)
    except (PreconditionFailed, NotFound):
        return None  # another waiter took it over first
    return Claim(store, key, owner, lease_seconds, new_etag, clock)


@contextmanager
def renewing(claim: Claim) -> Iterator[Claim]:
    """Renew `claim` in the background every third of its lease until the block ends, then release it."""
    try:
        with heartbeat(claim.lease_seconds / 3, claim.renew, name=f"claim-{claim.key[:12]}"):
            yield claim
    finally:
        claim.release()


def claim_or_wait(store: Store, key: str, owner: str, lease_seconds: float, is_done: Callable[[], bool],
                  *, poll_seconds: float = 1.0, clock: Clock | None = None,
                  sleep: Callable[[float], None] = time.sleep) -> Claim | None:
    """Block until either this worker holds the claim for `key` (returned) or the work is done by
    someone else (`is_done()` true: None returned). Waiting ends at the latest one lease after the
    holder stops renewing."""
    while True:
        if is_done():
            return None
        claim = try_claim(store, key, owner, lease_seconds, clock=clock)
        if claim is not None:
            if is_done():  # finished between our check and our claim: nothing left to do
                claim.release()
                return None
            return claim
        sleep(poll_seconds)
