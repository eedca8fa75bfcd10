"""Build claims: exactly one of several racing workers holds a key; a dead holder's claim is taken
over after its lease and not a moment before; a renewing holder keeps it; release never drops someone
else's claim; a waiter returns when the work is done elsewhere. Run on a local directory store and on
the real SeaweedFS.

Time is a `ManualClock` handed to registry.claims (`clock`, `sleep`), so a lease runs out when a test
moves the clock, never by waiting for it: the results do not depend on how busy the machine is.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fusedspec.core.settings import Settings
from fusedspec.registry.claims import claim_key, claim_or_wait, renewing, try_claim
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store


class ManualClock:
    """Seconds since the epoch that move only when told to (`advance`, or `sleep` as a waiter would)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"), Settings(work_dir=tmp_path), check=False)
    seaweed, bucket = request.getfixturevalue("seaweed"), request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/fusedspec", seaweed.settings())


def test_racing_workers_one_claim(store: Store) -> None:
    won: list[str] = []
    barrier = threading.Barrier(6)

    def worker(name: str) -> None:
        barrier.wait()
        if try_claim(store, "k1", name, lease_seconds=60) is not None:
            won.append(name)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_a_claim_is_live_until_its_lease_has_passed(store: Store) -> None:
    clock = ManualClock()
    assert try_claim(store, "k2", "holder", lease_seconds=30, clock=clock) is not None
    clock.advance(30)  # exactly one lease: not yet stale
    assert try_claim(store, "k2", "other", lease_seconds=30, clock=clock) is None


def test_a_stale_claim_is_taken_over_and_the_old_holder_cannot_release_it(store: Store) -> None:
    clock = ManualClock()
    dead = try_claim(store, "k3", "dead-worker", lease_seconds=30, clock=clock)
    assert dead is not None
    clock.advance(30.001)
    second = try_claim(store, "k3", "second", lease_seconds=30, clock=clock)
    assert second is not None
    assert not dead.renew() and dead.lost  # the old holder learns it lost the claim
    dead.release()
    assert store.head(claim_key("k3")) is not None  # the live claim survives the old holder's release
    second.release()
    assert store.head(claim_key("k3")) is None


def test_a_renewed_claim_outlives_its_first_lease(store: Store) -> None:
    clock = ManualClock()
    claim = try_claim(store, "k4", "busy", lease_seconds=30, clock=clock)
    assert claim is not None
    clock.advance(20)
    assert claim.renew()
    clock.advance(20)  # 40 s after the claim, 20 s after the renewal
    assert try_claim(store, "k4", "other", lease_seconds=30, clock=clock) is None


def test_renewing_renews_in_the_background_and_releases_at_the_end(store: Store) -> None:
    clock = ManualClock()
    claim = try_claim(store, "k5", "busy", lease_seconds=0.03, clock=clock)  # a beat every 10 ms
    assert claim is not None
    _, first_etag = store.get_with_etag(claim_key("k5"))
    with renewing(claim):
        clock.advance(3600)  # long past the lease: only a renewal at the new time keeps the claim
        deadline = time.monotonic() + 60
        while claim.etag == first_etag:  # until the heartbeat (which beats in real time) renewed once
            assert time.monotonic() < deadline, "the claim was not renewed in the background"
            time.sleep(0.01)
        assert try_claim(store, "k5", "other", lease_seconds=30, clock=clock) is None
    assert store.head(claim_key("k5")) is None


def test_a_waiter_returns_when_the_holder_finishes_the_work(store: Store) -> None:
    clock = ManualClock()
    holder = try_claim(store, "k6", "holder", lease_seconds=30, clock=clock)
    assert holder is not None
    finished = threading.Event()

    def sleep(seconds: float) -> None:  # the holder finishes during the waiter's third poll
        clock.sleep(seconds)
        if len(clock.slept) == 3:
            finished.set()
            holder.release()

    assert claim_or_wait(store, "k6", "waiter", 30, finished.is_set, poll_seconds=1, clock=clock,
                         sleep=sleep) is None
    assert clock.slept == [1, 1, 1]


def test_a_waiter_takes_over_from_a_holder_that_died(store: Store) -> None:
    clock = ManualClock()
    assert try_claim(store, "k7", "dead-worker", lease_seconds=30, clock=clock) is not None
    claim = claim_or_wait(store, "k7", "waiter", 30, lambda: False, poll_seconds=4, clock=clock,
                          sleep=clock.sleep)
    assert claim is not None and claim.owner == "waiter"
    assert clock.slept == [4] * 8  # the first poll after the lease ran out (32 s > 30 s)


# --- issue 27: leases judged by the store's clock, never by comparing two hosts' clocks --------------------

TRY_CLAIM = r"""
import sys
from fusedspec.core.settings import load_settings
from fusedspec.registry.claims import try_claim
from fusedspec.registry.stores import open_store
uri, key, owner = sys.argv[1:4]
claim = try_claim(open_store(uri, load_settings()), key, owner, lease_seconds=120)
print("took it" if claim is not None else "refused")
"""


@pytest.fixture
def child_env(store: Store, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment of a fusedspec process on another host that uses `store`."""
    import os

    if store.uri.scheme == "s3":
        return {**os.environ, **request.getfixturevalue("seaweed").env()}
    return {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "other-host")}


def test_a_waiter_whose_clock_is_ahead_takes_no_live_claim(store: Store, child_env: dict[str, str]) -> None:
    """With 150 s of skew a live build claim (lease 120 s) was taken over: the waiter compared the holder's
    renewed_at with its own clock."""
    from tests.support.skewed_clock import run_skewed

    holder = try_claim(store, "skew-ahead", "holder", lease_seconds=120)
    assert holder is not None
    assert run_skewed(150, TRY_CLAIM, store.describe(), "skew-ahead", "waiter",
                      env=child_env).stdout.strip() == "refused"
    assert holder.renew() and not holder.lost  # still the holder's


def test_a_holder_whose_clock_is_behind_keeps_its_claim(store: Store, child_env: dict[str, str]) -> None:
    from tests.support.skewed_clock import run_skewed

    taken = run_skewed(-150, TRY_CLAIM, store.describe(), "skew-behind", "holder-behind", env=child_env)
    assert taken.stdout.strip() == "took it"
    assert try_claim(store, "skew-behind", "waiter", lease_seconds=120) is None  # renewed a moment ago
