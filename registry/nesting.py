"""Where a store root may not be: inside a store's own layout.

A store root is where publishes lay out `{target}/{draft}/{spec}/{key}/{attempt}/...` beside `.attempts/`,
`.blobs/` and `.claims/` (registry.publish). A root given inside that layout (an attempt, a version, a
config or a model's directory, or the bookkeeping) nests versions inside another store: a version nested
in a live one's attempt makes the live one fail verify ("in the version but not in its manifest"), and
its repair replaces that attempt. So a writer's root is refused before anything is written (StoreError,
exit 2), found by reading only:
- by the names on its path: a directory named like an attempt, a content key, a spec, or the bookkeeping;
- by what the root and every directory above it hold: a manifest.json (a version), a LATEST (a config),
  a build.json (an attempt), or, above the root, `.attempts/` or `.blobs/` (another store's root).
The error names the store root it is inside, which is where to publish.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from fusedspec.compile.documents.build import BUILD_DESCRIPTION, KEY_PATTERN
from fusedspec.compile.documents.manifest import LATEST, MANIFEST
from fusedspec.registry.attempts import ATTEMPT_NAME, ATTEMPTS
from fusedspec.registry.blobs import BLOBS
from fusedspec.registry.claims import CLAIMS_PREFIX
from fusedspec.registry.store import Store
from fusedspec.registry.versions import SPEC_DIR

IS_KEY = re.compile(KEY_PATTERN)
BOOKKEEPING = (ATTEMPTS, BLOBS, CLAIMS_PREFIX)
# What a directory of the layout holds, and how many levels below a store root that directory is.
MARKS = ((MANIFEST, 4, "a version directory"), (LATEST, 3, "a config directory"),
         (BUILD_DESCRIPTION, 5, "a version's attempt directory"))


def _named(name: str) -> tuple[int, str] | None:
    """(levels below a store root, what it is) of a directory the layout names so, else None."""
    if name in BOOKKEEPING:
        return 1, f"the store's {name} directory"
    if ATTEMPT_NAME.match(name):
        return 5, "a version's attempt directory"
    if IS_KEY.match(name):
        return 4, "a version directory (named by its content key)"
    if SPEC_DIR.match(name):
        return 3, "a config directory (named by its spec)"
    return None


def _upwards(store: Store) -> Iterator[Store]:
    """The store rooted at its root, then at each directory above it, up to the bucket or `/`."""
    place = store
    while True:
        yield place
        above = place.parent()
        if above.uri == place.uri:
            return
        place = above


def _climb(store: Store, levels: int) -> Store:
    for _ in range(levels):
        store = store.parent()
    return store


def nesting_problem(store: Store) -> str | None:
    """Why `store`'s root lies inside a store's layout (the message names the store root to use), or None."""
    parts = (store.uri.prefix.split("/") if store.uri.scheme == "s3"
             else list(store.uri.local_root.parts[1:]))  # type: ignore[union-attr]
    for depth, name in enumerate(parts):
        found = _named(name)
        if found is not None:
            below, what = found
            outer = _climb(store, len(parts) - depth - 1 + below)
            return _refusal(store, f"{name!r} on its path is {what}", outer)
    for level, place in enumerate(_upwards(store)):
        for mark, below, what in MARKS:
            if place.exists(mark):
                where = "it is" if level == 0 else f"{place.describe()} above it is"
                return _refusal(store, f"{where} {what} (it holds {mark})", _climb(place, below))
        if level > 0 and any(place.holds_objects(name) for name in (ATTEMPTS, BLOBS)):
            return _refusal(store, f"{place.describe()} above it is a store root (it holds {ATTEMPTS}/ or "
                                   f"{BLOBS}/)", place)
    return None


def _refusal(store: Store, why: str, outer: Store) -> str:
    return (f"{store.describe()} is inside a store: {why}. A store root is the directory above the models' "
            f"names; publish to {outer.describe()} (the store it is inside) or to a directory outside it. "
            "Nothing was written")
