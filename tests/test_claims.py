"""Build claims: exactly one of several racing workers holds a key; a dead holder's claim is taken
over after its lease; a renewing holder keeps it; release never drops someone else's claim.
Run on a local directory store and on the real SeaweedFS."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from compile.settings import Settings
from registry.claims import claim_key, claim_or_wait, renewing, try_claim
from registry.store import Store
from registry.stores import open_store


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


def test_stale_claim_is_taken_over_and_the_old_holder_cannot_release_it(store: Store) -> None:
    dead = try_claim(store, "k2", "dead-worker", lease_seconds=0.5)
    assert dead is not None
    assert try_claim(store, "k2", "second", lease_seconds=60) is None  # still live
    time.sleep(0.8)
    second = try_claim(store, "k2", "second", lease_seconds=60)
    assert second is not None
    assert not dead.renew() and dead.lost  # the old holder learns it lost the claim
    dead.release()
    assert store.head(claim_key("k2")) is not None  # the live claim survives the old holder's release
    second.release()
    assert store.head(claim_key("k2")) is None


def test_renewing_holder_keeps_its_claim_past_the_lease(store: Store) -> None:
    claim = try_claim(store, "k3", "busy", lease_seconds=0.6)
    assert claim is not None
    with renewing(claim):
        time.sleep(1.5)
        assert try_claim(store, "k3", "other", lease_seconds=0.6) is None
    assert store.head(claim_key("k3")) is None  # released at the end of the block


def test_waiter_returns_when_the_holder_finishes(store: Store) -> None:
    holder = try_claim(store, "k4", "holder", lease_seconds=30)
    assert holder is not None
    done = threading.Event()

    def finish() -> None:
        time.sleep(0.5)
        done.set()
        holder.release()

    finisher = threading.Thread(target=finish)
    finisher.start()
    started = time.monotonic()
    assert claim_or_wait(store, "k4", "waiter", 30, done.is_set, poll_seconds=0.1) is None
    assert time.monotonic() - started < 10
    finisher.join()
