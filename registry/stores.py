"""Open the store a URI names: a local directory (the default) or an S3 bucket prefix.

The S3 endpoint and region come from `Settings` (FUSEDSPEC_S3_ENDPOINT_URL / AWS_ENDPOINT_URL[_S3],
AWS_REGION); credentials come from boto3's standard chain and never pass through fusedspec.
"""

from __future__ import annotations

import os
from typing import Any

from fusedspec.core.errors import StoreError
from fusedspec.core.files import FileHasher
from fusedspec.core.settings import Settings
from fusedspec.registry.nesting import nesting_problem
from fusedspec.registry.store import Store
from fusedspec.registry.uri import StoreURI, parse_store_uri


def open_store(uri: str | StoreURI, settings: Settings, *, check: bool = True, **tuning: Any) -> Store:
    """A store rooted at `uri`. With `check`, raise StoreError now if it cannot be used (unreachable
    endpoint, refused credentials, missing bucket) rather than halfway through a publish.
    `tuning` goes to the S3 store (part_size, multipart_threshold, max_concurrency, retry_deadline).
    """
    parsed = parse_store_uri(uri) if isinstance(uri, str) else uri
    store: Store
    if parsed.scheme == "s3":
        from fusedspec.registry.s3_store import S3Store  # boto3 loads only when an S3 URI is used

        store = S3Store(parsed, endpoint_url=settings.s3_endpoint_url, region=settings.aws_region, **tuning)
    else:
        from fusedspec.registry.local_store import LocalStore

        store = LocalStore(parsed, FileHasher(settings.cache_dir))
    if check:
        store.check()
    return store


def open_store_root(uri: str | StoreURI, settings: Settings) -> Store:
    """`open_store(check=True)` for a command that reads a whole store (ls, gc): a directory store's root
    must exist, so a mistyped path is refused (StoreError), not reported as an empty store."""
    store = open_store(uri, settings, check=True)
    root = store.uri.local_root
    if root is not None and not root.is_dir():
        raise StoreError(f"{root}: no such directory; give a directory versions were published to")
    return store


def open_writable_store(uri: str | StoreURI, settings: Settings, **tuning: Any) -> Store:
    """`open_store(check=True)` for a writer: a directory store this user cannot write is refused too, and a
    root inside a store's own layout (registry.nesting), with StoreError, before anything is hashed or
    sent."""
    problem = store_problem(str(uri), settings)
    if problem:
        raise StoreError(problem)
    store = open_store(uri, settings, check=True, **tuning)
    nested = nesting_problem(store)
    if nested:
        raise StoreError(nested)
    return store


def store_problem(uri: str, settings: Settings) -> str | None:
    """Why a store URI cannot be written to, found without writing (None when it can, as far as can be
    told): a directory store whose nearest existing directory this user cannot write. A path under a
    regular file, and every S3 problem, come from `open_store(check=True)`."""
    parsed = parse_store_uri(uri)
    if parsed.scheme == "s3":
        return None
    assert parsed.local_root is not None
    for path in [parsed.local_root, *parsed.local_root.parents]:
        if path.is_dir():
            if not os.access(path, os.W_OK | os.X_OK):
                return f"{parsed.local_root}: {path} is not writable by this user; choose another directory"
            return None
    return None  # nothing of the path is a directory: open_store's check refuses it
