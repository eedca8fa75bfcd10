"""Store URIs: `s3://bucket/prefix`, `file:///abs/dir`, or a plain local directory path.

Parsing is pure and strict, before anything touches the network or the disk: no bucket, an unknown
scheme, or a `..` path part (which could escape the store root) is a `StoreError` (exit 2).
A parsed URI joins relative object keys with `child`, so every layer below speaks in keys like
`Qwen--Qwen3-32B/Qwen--Qwen3-1.7B/tp32-seq1024-k7-bs4-bfloat16/<key>/manifest.json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from fusedspec.core.errors import StoreError
from fusedspec.core.schemes import split_scheme

S3_SCHEME = "s3://"
FILE_SCHEME = "file://"
# S3 bucket naming rules (lowercase, digits, '.', '-', 3..63 chars, starting and ending alphanumeric).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class StoreURI:
    """Where a store lives. `scheme` is "s3" (with `bucket`) or "file" (with `local_root`).

    `prefix` is the key prefix inside the bucket without leading or trailing '/', "" for the root.
    """

    scheme: str
    prefix: str = ""
    bucket: str | None = None
    local_root: Path | None = None

    def child(self, *parts: str) -> StoreURI:
        """The URI of a sub-path (parts are relative keys, already validated by whoever made them)."""
        joined = join_key(self.prefix, *parts)
        if self.scheme == "s3":
            return StoreURI("s3", prefix=joined, bucket=self.bucket)
        assert self.local_root is not None
        return StoreURI("file", prefix="", local_root=self.local_root.joinpath(*[p for p in parts if p]))

    def parent(self) -> StoreURI:
        """The URI one level up (the root itself at the top)."""
        if self.scheme == "s3":
            return StoreURI("s3", prefix=self.prefix.rsplit("/", 1)[0] if "/" in self.prefix else "",
                            bucket=self.bucket)
        assert self.local_root is not None
        return StoreURI("file", local_root=self.local_root.parent)

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return str(self.local_root)


def join_key(*parts: str) -> str:
    """Join key parts with single slashes, dropping empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _check_parts(text: str, path: str) -> list[str]:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StoreError(
            f"store URI {text!r}: '..' is not allowed in a store path (it could escape the store root); "
            "write the path without '..'"
        )
    return parts


def parse_store_uri(text: str) -> StoreURI:
    """Parse `s3://bucket[/prefix]`, `file:///dir` or a local directory path (which need not exist)."""
    text = text.strip()
    scheme, body = split_scheme(text, (S3_SCHEME, FILE_SCHEME), StoreError, "store URI",
                                "s3://BUCKET/PREFIX, file:///DIR or a local directory")
    if scheme == S3_SCHEME:
        bucket, _, path = body.partition("/")
        if not bucket:
            raise StoreError(f"store URI {text!r} names no bucket: write s3://BUCKET/PREFIX")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise StoreError(
                f"store URI {text!r}: {bucket!r} is not a valid S3 bucket name "
                "(3-63 lowercase letters, digits, '.' or '-')"
            )
        return StoreURI("s3", prefix="/".join(_check_parts(text, path)), bucket=bucket)
    if scheme == FILE_SCHEME:
        path = unquote(body)
        if not path.startswith("/"):
            raise StoreError(f"store URI {text!r}: a file:// URI needs an absolute path (file:///dir)")
        _check_parts(text, path)
        return StoreURI("file", local_root=Path(path))
    _check_parts(text, text.replace("\\", "/"))
    return StoreURI("file", local_root=Path(text).absolute())
