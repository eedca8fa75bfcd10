"""Open the store a URI names: a local directory (the default) or an S3 bucket prefix.

The S3 endpoint and region come from `Settings` (FUSEDSPEC_S3_ENDPOINT_URL / AWS_ENDPOINT_URL[_S3],
AWS_REGION); credentials come from boto3's standard chain and never pass through fusedspec.
"""

from __future__ import annotations

from typing import Any

from compile.settings import Settings
from registry.store import Store
from registry.uri import StoreURI, parse_store_uri


def open_store(uri: str | StoreURI, settings: Settings, *, check: bool = True, **tuning: Any) -> Store:
    """A store rooted at `uri`. With `check`, raise StoreError now if it cannot be used (unreachable
    endpoint, refused credentials, missing bucket) rather than halfway through a publish.
    `tuning` goes to the S3 store (part_size, multipart_threshold, max_concurrency, retry_deadline).
    """
    parsed = parse_store_uri(uri) if isinstance(uri, str) else uri
    store: Store
    if parsed.scheme == "s3":
        from registry.s3_store import S3Store  # boto3 loads only when an S3 URI is used

        store = S3Store(parsed, endpoint_url=settings.s3_endpoint_url, region=settings.aws_region, **tuning)
    else:
        from registry.local_store import LocalStore

        store = LocalStore(parsed)
    if check:
        store.check()
    return store
