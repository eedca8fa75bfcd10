"""The S3 store on boto3: AWS (standard credential chain and region) or any endpoint URL (SeaweedFS, MinIO).

What it promises beyond the interface:
- Every object is written with its SHA256 checksum, which the server checks against the bytes it
  receives (400 BadDigest otherwise) and keeps: a single PUT carries the file's sha256, a multipart
  upload (boto3's managed transfer, parts in parallel) each part's, and the object then holds the
  composite `b64(sha256(part digests))-N`. HEAD with ChecksumMode returns the server's value
  (`ObjectInfo.checksum`): it describes the stored bytes, unlike user metadata, which any writer can set
  to anything. Seen on SeaweedFS 4.48: a wrong checksum is refused, CopyObject carries the source's
  checksum over (AWS recomputes it), and CopySourceIfMatch refuses a source whose etag changed (412).
- Which failures are transient is botocore's own classification (its standard retry mode's checkers:
  throttling, 500/502/503/504, connection failures and timeouts); 501 and everything else (403
  AccessDenied / SignatureDoesNotMatch, NoSuchBucket, BadDigest, ...) becomes one `StoreError` line at
  once. Requests are retried here, with backoff and full jitter until a deadline (tenacity, stopping
  before the deadline is passed), not by botocore's retry loop: that one bounds retries by count and
  stops for good once a per-client quota is spent, and a publish must ride out an outage of minutes.
  Inside a managed transfer botocore's standard mode retries each part, so one failed part of a 65 GB
  file is sent again, not the file.
- An object the store cannot return is named within seconds (`UnreadableObject`, exit 1), not retried
  for the whole deadline as if the endpoint were down: a GET that sends nothing within
  OBJECT_READ_TIMEOUT, or a read answered with a 5xx UNREADABLE_AFTER times, while the server answers a
  HEAD of that very object. (SeaweedFS retries a damaged chunk for 13 s inside one GET, then answers 500;
  a CopyObject from it answers 500 at once.)
- `now()` is the server's clock (the Date of a HeadBucket answer), which leases are judged by.
- `bytes_sent` counts every request body handed to the HTTP layer (a botocore `before-send` hook), so
  retries and re-sends are counted too. Request checksums are computed by us or at our explicit request
  (`request_checksum_calculation="when_required"`): otherwise botocore would add checksums of its own
  choosing to every request.
Messages name the bucket and endpoint, never a credential.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar

import boto3
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    InvalidRegionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
    SSLError,
)
from botocore.loaders import Loader
from botocore.retries.standard import (
    OrRetryChecker,
    RetryContext,
    ThrottledRetryableChecker,
    ThrottlingStatusCodeChecker,
    TransientRetryableChecker,
)
from s3transfer.utils import ChunksizeAdjuster
from tenacity import RetryError, Retrying, retry_if_exception, stop_before_delay, wait_random_exponential

from fusedspec.core.errors import ArtifactError, StoreError, StoreUnavailable, UnreadableObject
from fusedspec.core.files import sha256_file
from fusedspec.core.settings import redact_url
from fusedspec.registry import store
from fusedspec.registry.store import NotFound, ObjectInfo, PreconditionFailed, Progress, Upload
from fusedspec.registry.uri import StoreURI, join_key

MiB = 1 << 20
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_MULTIPART_THRESHOLD = 32 * MiB
MIN_PART_SIZE = 5 * MiB  # S3's floor for every part but the last
MAX_SINGLE_COPY = 5 * 1024 * MiB  # CopyObject's limit; larger objects are copied part by part
# A healthy S3 starts sending an object within a second; one that sends nothing for this long, while it
# answers a HEAD of the object, cannot return it.
OBJECT_READ_TIMEOUT = 5.0
# reads of one object answered with a 5xx before it is named as one the store cannot return
UNREADABLE_AFTER = 3
TRANSFER_PART_ATTEMPTS = 8  # botocore's standard mode, per part of a managed transfer
PROBE_DEADLINE = 3.0  # how long a HEAD that tells a damaged object from a dead endpoint may take

_THROTTLED = (ThrottledRetryableChecker(), ThrottlingStatusCodeChecker())
# botocore's standard-mode checkers that apply to S3 (its others are for STS and DynamoDB); no count limit:
# our deadline bounds the retries.
_RETRYABLE = OrRetryChecker([TransientRetryableChecker(), *_THROTTLED])
AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden",
              "InvalidToken", "ExpiredToken", "AllAccessDisabled", "AuthorizationHeaderMalformed"}
T = TypeVar("T")
MAX_REMEMBERED_COMPOSITES = 4096
# (sha256, size, part size) -> composite checksum, this process
_COMPOSITES: dict[tuple[str, int, int], str] = {}
_COMPOSITES_LOCK = threading.Lock()


def _retry_context(exc: BaseException) -> RetryContext:
    """The failure as botocore's retry checkers see one (an answer, or an exception instead of one)."""
    if isinstance(exc, ClientError):
        return RetryContext(attempt_number=1, parsed_response=exc.response,
                            http_response=AWSResponse("", http_status(exc), {}, None))
    return RetryContext(attempt_number=1, caught_exception=exc)


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying, as botocore's standard retry mode classifies them."""
    if isinstance(exc, SSLError):
        return False  # botocore retries it; a certificate problem does not heal by waiting
    if isinstance(exc, ClientError) and error_code(exc) == "ConditionalRequestConflict":
        return True  # 409 on concurrent conditional writes: AWS says to retry; botocore does not list it
    if isinstance(exc, IncompleteReadError):
        return True  # a body cut short: botocore retries it only inside its own reads of a response
    return bool(_RETRYABLE.is_retryable(_retry_context(exc)))


def is_throttled(exc: BaseException) -> bool:
    context = _retry_context(exc)
    return any(checker.is_retryable(context) for checker in _THROTTLED)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def b64_digest(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def composite_checksum(part_digests: list[bytes]) -> str:
    """S3's COMPOSITE SHA256 of a multipart object: b64(sha256(d1 + d2 + ...)) + "-N"."""
    return (base64.b64encode(hashlib.sha256(b"".join(part_digests)).digest()).decode()
            + f"-{len(part_digests)}")


def safe_endpoint(url: str | None) -> str:
    """The endpoint for messages, with any user:password@ removed."""
    return redact_url(url) if url else "AWS S3"


_DATA_LOADER_LOCK = threading.Lock()
_data_loader: Loader | None = None


def _new_session(region: str | None) -> boto3.session.Session:
    """A boto3 session of its own (profile and credentials read afresh) on the process's one botocore data
    loader, which parses the S3 service model and the endpoint rules once: a new loader per store parsed
    them for every store opened, most of the CPU of opening one (bench/repeat_costs.py)."""
    global _data_loader
    core = botocore.session.Session()
    with _DATA_LOADER_LOCK:
        if _data_loader is None:
            _data_loader = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _data_loader)
        session = boto3.session.Session(botocore_session=core, region_name=region)
        # each boto3 session appends boto3's data directory to its loader's search path
        _data_loader.search_paths[:] = dict.fromkeys(_data_loader.search_paths)
    core.get_scoped_config()  # the profile, read where a loader of its own read it: a missing one raises here
    return session


class S3Store(store.Store):
    def __init__(
        self,
        uri: StoreURI,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        max_concurrency: int = 4,
        retry_deadline: float = 120.0,
        session: boto3.session.Session | None = None,
    ) -> None:
        super().__init__(uri)
        assert uri.bucket is not None
        self.bucket = uri.bucket
        self.endpoint = safe_endpoint(endpoint_url)
        self.part_size = max(part_size, MIN_PART_SIZE)
        self.multipart_threshold = max(multipart_threshold, self.part_size)
        self.max_concurrency = max_concurrency
        self.retry_deadline = retry_deadline
        # transient failures retried so far, here and by botocore in transfers (reports, tests)
        self.retries = 0
        self._retries_lock = threading.Lock()
        try:
            session = session or _new_session(region)
            region = region or session.region_name or ("us-east-1" if endpoint_url else None)
        except ProfileNotFound as exc:
            raise StoreError(f"{exc}: set AWS_PROFILE to a profile of your AWS config, or unset it") from None

        def client(read_timeout: float, attempts: int = 1) -> Any:
            config = Config(
                retries={"total_max_attempts": attempts, "mode": "standard"},  # 1: we retry, in _call
                # SHA256 checksums only where we ask (see above)
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                connect_timeout=5,
                read_timeout=read_timeout,
                max_pool_connections=max(10, 2 * max_concurrency),
                # Custom endpoints (SeaweedFS, MinIO) want path-style addressing; AWS takes either.
                s3={"addressing_style": "path"} if endpoint_url else {},
            )
            made = session.client("s3", endpoint_url=endpoint_url, config=config, region_name=region)
            made.meta.events.register("before-send.s3", self._on_send)
            return made

        try:
            self.client = client(read_timeout=60)
        except InvalidRegionError:
            raise StoreError(f"AWS_REGION (or AWS_DEFAULT_REGION) {region!r} is not a region name; write "
                             "e.g. us-east-1") from None
        self.reader = client(read_timeout=OBJECT_READ_TIMEOUT)  # GetObject: see OBJECT_READ_TIMEOUT
        self.transfer_client = client(read_timeout=60, attempts=TRANSFER_PART_ATTEMPTS)

    # Transport seams ---------------------------------------------------------------------------------
    def _on_send(self, request: Any, **_: Any) -> None:
        body = request.headers.get("X-Amz-Decoded-Content-Length") or request.headers.get("Content-Length")
        if isinstance(request.body, bytes | bytearray):
            self._count_sent(len(request.body))
        elif request.body is not None:
            self._count_sent(int(body or 0))  # aws-chunked (a trailing checksum): the decoded length
        attempt = re.search(rb"attempt=(\d+)", _as_bytes(request.headers.get("amz-sdk-request", b"")))
        if attempt is not None and int(attempt.group(1)) > 1:  # botocore's own retry (inside a transfer)
            with self._retries_lock:
                self.retries += 1

    def _key(self, key: str) -> str:
        return join_key(self.uri.prefix, key)

    def _where(self, key: str = "") -> str:
        return f"{self.describe(key)} at {self.endpoint}"

    def _store_error(self, exc: BaseException, what: str, key: str = "") -> StoreError:
        """One clear line for a failure a user must fix. Server messages are left out on auth errors."""
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return StoreError(
                f"no usable AWS credentials for {self._where(key)}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance/pod role"
            )
        if isinstance(exc, ClientError):
            code, status = error_code(exc), http_status(exc)
            if code in AUTH_CODES or status == 403:
                return StoreError(
                    f"S3 refused {what} on {self._where(key)} ({code or status}): check the credentials "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the bucket policy"
                )
            if code == "NoSuchBucket" or (what == "HeadBucket" and status == 404):
                return StoreError(
                    f"bucket {self.bucket!r} does not exist at {self.endpoint}: create it or fix the URI"
                )
            message = str(exc.response.get("Error", {}).get("Message", ""))[:200]
            return StoreError(f"S3 {what} on {self._where(key)} failed: {code or status} {message}".rstrip())
        return StoreError(f"S3 {what} on {self._where(key)} failed: {type(exc).__name__}")

    def _gave_up(self, exc: BaseException, what: str, key: str, attempts: int, seconds: float,
                 limit: float) -> StoreError:
        return StoreUnavailable(
            f"S3 endpoint {self.endpoint} did not answer {what} on {self.describe(key)}: {attempts} "
            f"attempt(s) over {seconds:.1f} s (retried for up to {limit:g} s; last error "
            f"{type(exc).__name__}); check the endpoint URL (FUSEDSPEC_S3_ENDPOINT_URL) and that the server "
            "is up, then re-run")

    def _call(self, what: str, fn: Callable[..., T], key: str = "", *, deadline: float | None = None,
              reads: str | None = None, **kwargs: Any) -> T:
        """Call `fn(**kwargs)`, retrying transient failures with backoff and full jitter until `deadline`
        seconds would be passed (retry_deadline by default).

        `reads`: the key of the object whose bytes this call reads (GET, or the source of a copy). Its
        failures are told apart: no answer at all is the endpoint (retried until the deadline); no byte
        within the read timeout, or UNREADABLE_AFTER 5xx answers, while a HEAD of that object answers, is
        the object (UnreadableObject at once).

        Raises ClientError for non-transient S3 answers (the caller maps 404/412), StoreError when the
        retries run out (naming the real elapsed time and the limit) or the failure is not an S3 answer.
        """
        budget = self.retry_deadline if deadline is None else deadline
        answered: list[str] = []  # 5xx answers to a read of `reads`
        unreadable: list[str] = []

        def worth_retrying(exc: BaseException) -> bool:
            if not is_transient(exc):
                return False
            if reads is None or is_throttled(exc):
                return True
            if isinstance(exc, ClientError):
                answered.append(f"{error_code(exc) or http_status(exc)}")
                if len(answered) < UNREADABLE_AFTER:
                    return True
                why = f"{what} answered {answered[-1]} {len(answered)} times"
            elif isinstance(exc, ReadTimeoutError):
                why = f"{what} sent nothing within {OBJECT_READ_TIMEOUT:g} s"
            else:
                return True
            if not self._answers_head(reads):
                return True  # the endpoint itself is failing: retried as for any request
            unreadable.append(why)
            return False

        def count(_state: Any) -> None:
            with self._retries_lock:
                self.retries += 1

        retrying = Retrying(retry=retry_if_exception(worth_retrying), stop=stop_before_delay(budget),
                            wait=wait_random_exponential(multiplier=0.1, max=5.0), before_sleep=count,
                            reraise=False)
        started = time.monotonic()
        try:
            return retrying(fn, **kwargs)
        except RetryError as exc:
            failure = exc.last_attempt.exception()
            assert failure is not None
            # the whole time spent, the last attempt included (tenacity's statistics stop at its start)
            seconds = time.monotonic() - started
            raise self._gave_up(failure, what, key, exc.last_attempt.attempt_number, seconds,
                                budget) from None
        except (ClientError, BotoCoreError) as exc:
            if unreadable and reads is not None:
                raise UnreadableObject(self._where(reads),
                                       f"{unreadable[0]}, while it answers a HEAD of it") from None
            if isinstance(exc, ClientError):
                raise
            raise self._store_error(exc, what, key) from None

    def _answers_head(self, key: str) -> bool:
        """Whether the server answers a HEAD of `key` at once (found or not): it is up and knows the
        object."""
        try:
            self._call("HeadObject", self.client.head_object, key, deadline=PROBE_DEADLINE,
                       Bucket=self.bucket, Key=self._key(key))
        except ClientError:
            return True  # an answer (404, 403, ...): the server is up
        except StoreError:
            return False
        return True

    # Interface ---------------------------------------------------------------------------------------
    def check(self) -> None:
        try:
            # Fail fast on an unreachable endpoint: a few quick retries, not the long upload deadline.
            self._call("HeadBucket", self.client.head_bucket, deadline=3.0, Bucket=self.bucket)
        except ClientError as exc:
            raise self._store_error(exc, "HeadBucket") from None

    def now(self) -> float:
        try:
            answer = self._call("HeadBucket", self.client.head_bucket, Bucket=self.bucket)
        except ClientError as exc:
            raise self._store_error(exc, "HeadBucket") from None
        date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if not date:
            raise StoreError(f"S3 endpoint {self.endpoint} sends no Date header: its clock cannot be read, "
                             "and leases are judged by the store's clock, never by this host's; use an S3 "
                             "endpoint that sends one (every HTTP origin server with a clock must)")
        return parsedate_to_datetime(date).timestamp()

    def _put(self, key: str, data: bytes, **extra: Any) -> str:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            answer = self._call("PutObject", self.client.put_object, key, Bucket=self.bucket,
                                Key=self._key(key), Body=data, ChecksumSHA256=checksum, **extra)
        except ClientError as exc:
            if http_status(exc) == 412 or error_code(exc) == "PreconditionFailed":
                raise PreconditionFailed(f"{self.describe(key)}: precondition failed") from None
            raise self._store_error(exc, "PutObject", key) from None
        return str(answer.get("ETag", "")).strip('"')

    def _part_size(self, size: int) -> int:
        """The part size of a managed upload of `size` bytes: the configured one as boto3 adjusts it to S3's
        limits (at most 10,000 parts), so the composite checksum expected is the upload's."""
        return int(ChunksizeAdjuster().adjust_chunksize(self.part_size, size))

    def put_file(self, key: str, path: Path, *, sha256: str, progress: Progress | None = None) -> None:
        size = path.stat().st_size
        if size < self.multipart_threshold:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != sha256:
                raise _changed(path)
            self._put(key, data)
            if progress is not None:
                progress(size)
            return
        self._put_multipart(key, path, size, sha256, progress)

    def expected_checksum(self, path: Path, sha256: str) -> str:
        size = path.stat().st_size
        if size < self.multipart_threshold:
            return b64_digest(sha256)
        part_size = self._part_size(size)
        # The composite is a function of the bytes, which their sha256 names: a k-sweep's artifacts hold the
        # same weights in files of their own, and each would otherwise be read again to compute it (65 GB
        # per sibling for Qwen3-32B). A file whose bytes are not what its sha256 says is still caught: its
        # upload's composite, computed by the server from what was sent, differs (the after-write check).
        remembered = _COMPOSITES.get((sha256, size, part_size))
        if remembered is not None:
            return remembered
        digests = []
        with open(path, "rb") as handle:
            while data := handle.read(part_size):
                digests.append(hashlib.sha256(data).digest())
        composite = composite_checksum(digests)
        with _COMPOSITES_LOCK:
            if len(_COMPOSITES) >= MAX_REMEMBERED_COMPOSITES:
                _COMPOSITES.clear()
            _COMPOSITES[(sha256, size, part_size)] = composite
        return composite

    def _put_multipart(self, key: str, path: Path, size: int, sha256: str, progress: Progress | None) -> None:
        # The server checks each part against its checksum, never the file against `sha256` (which may come
        # from a hash cache keyed by size and mtime): checked first, as a single PUT does, so a manifest never
        # records a sha256 that the uploaded bytes do not have. boto3 reads the parts in parallel, out of
        # order, so this is a pass of its own; below, the file must not change between it and the parts.
        before = path.stat()
        if sha256_file(path) != sha256:
            raise _changed(path)
        config = TransferConfig(multipart_threshold=self.multipart_threshold,
                                multipart_chunksize=self._part_size(size),
                                max_concurrency=self.max_concurrency)
        try:
            # boto3 aborts its multipart upload when a part fails; a killed publisher's is gc's.
            self._call("UploadPart", self.transfer_client.upload_file, key, Filename=str(path),
                       Bucket=self.bucket, Key=self._key(key), ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                       Callback=progress, Config=config)
        except ClientError as exc:
            raise self._store_error(exc, "UploadPart", key) from None
        after = path.stat()
        # The server checked every part against its checksum; what is left to rule out is the file changing
        # between being hashed for the manifest and being read by the transfer (the object is in an attempt
        # no manifest names yet: the publisher discards it).
        if ((after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns)
                or after.st_size != size):
            raise _changed(path)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(key, data)

    def create(self, key: str, data: bytes) -> bool:
        try:
            self._put(key, data, IfNoneMatch="*")
        except PreconditionFailed:
            return False
        return True

    def swap(self, key: str, data: bytes, *, expected_etag: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if expected_etag is None else {"IfMatch": f'"{expected_etag}"'}
        return self._put(key, data, **condition)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        try:
            answer = self._call("GetObject", self.reader.get_object, key, reads=key, Bucket=self.bucket,
                                Key=self._key(key))
            return answer["Body"].read(), str(answer["ETag"]).strip('"')
        except ClientError as exc:
            if error_code(exc) in ("NoSuchKey", "404") or http_status(exc) == 404:
                raise NotFound(self.describe(key)) from None
            raise self._store_error(exc, "GetObject", key) from None
        except (HTTPClientError, IncompleteReadError) as exc:
            raise self._store_error(exc, "GetObject", key) from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            answer = self._call("HeadObject", self.client.head_object, key, Bucket=self.bucket,
                                Key=self._key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if http_status(exc) == 404 or error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._store_error(exc, "HeadObject", key) from None
        return ObjectInfo(key=key, size=int(answer["ContentLength"]),
                          etag=str(answer.get("ETag", "")).strip('"'), checksum=answer.get("ChecksumSHA256"))

    def _pages(self, what: str, operation: Callable[..., dict[str, Any]], prefix: str, token_in: str,
               token_out: str) -> Iterator[dict[str, Any]]:
        """Every page of a listing. Not a botocore paginator: its generator ends for good on an error
        inside it, so a page could not be retried; here each page is one retried call."""
        full = self._key(prefix)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{full}/" if full else ""}
        while True:
            try:
                page = self._call(what, operation, prefix, **kwargs)
            except ClientError as exc:
                raise self._store_error(exc, what, prefix) from None
            yield page
            if not page.get("IsTruncated"):
                return
            kwargs.update({name: page[name_out]
                           for name, name_out in zip(token_in.split(","), token_out.split(","), strict=True)
                           if page.get(name_out)})

    def _relative(self, full_key: str) -> str:
        root = f"{self.uri.prefix}/" if self.uri.prefix else ""
        return full_key[len(root):]

    def list(self, prefix: str = "") -> store.ObjectInfos:
        found = [ObjectInfo(key=self._relative(item["Key"]), size=int(item["Size"]),
                            etag=str(item.get("ETag", "")).strip('"'))
                 for page in self._pages("ListObjectsV2", self.client.list_objects_v2, prefix,
                                         "ContinuationToken", "NextContinuationToken")
                 for item in page.get("Contents", [])]
        return sorted(found, key=lambda info: info.key)

    def holds_objects(self, prefix: str) -> bool:
        full = self._key(prefix)
        try:
            page = self._call("ListObjectsV2", self.client.list_objects_v2, prefix, Bucket=self.bucket,
                              Prefix=f"{full}/" if full else "", MaxKeys=1)
        except ClientError as exc:
            raise self._store_error(exc, "ListObjectsV2", prefix) from None
        return bool(page.get("Contents"))

    def list_uploads(self, prefix: str = "") -> store.Uploads:
        found = [Upload(key=self._relative(item["Key"]), upload_id=item["UploadId"],
                        initiated=item["Initiated"].timestamp())
                 for page in self._pages("ListMultipartUploads", self.client.list_multipart_uploads, prefix,
                                         "KeyMarker,UploadIdMarker", "NextKeyMarker,NextUploadIdMarker")
                 for item in page.get("Uploads", [])]
        return sorted(found, key=lambda upload: upload.key)

    def abort_upload(self, upload: Upload) -> None:
        full_key = self._key(upload.key)
        try:
            self._call("AbortMultipartUpload", self.client.abort_multipart_upload, upload.key,
                       Bucket=self.bucket, Key=full_key, UploadId=upload.upload_id)
        except ClientError as exc:
            if http_status(exc) != 404:  # NoSuchUpload: already gone
                raise self._store_error(exc, "AbortMultipartUpload", upload.key) from None

    def copy(self, src_key: str, dst_key: str, *, if_match: str) -> None:
        source = {"Bucket": self.bucket, "Key": self._key(src_key)}
        info = self.head(src_key)
        if info is None:
            raise NotFound(self.describe(src_key))
        extra: dict[str, Any] = {"CopySourceIfMatch": f'"{if_match}"', "ChecksumAlgorithm": "SHA256"}
        try:
            if info.size <= MAX_SINGLE_COPY:
                self._call("CopyObject", self.client.copy_object, dst_key, reads=src_key, Bucket=self.bucket,
                           Key=self._key(dst_key), CopySource=source, **extra)
            else:
                config = TransferConfig(multipart_threshold=MAX_SINGLE_COPY,
                                        multipart_chunksize=self.part_size * 8,
                                        max_concurrency=self.max_concurrency)
                self._call("CopyObject", self.transfer_client.copy, dst_key, reads=src_key, CopySource=source,
                           Bucket=self.bucket, Key=self._key(dst_key), ExtraArgs=extra, Config=config)
        except ClientError as exc:
            if http_status(exc) == 412 or error_code(exc) == "PreconditionFailed":
                raise PreconditionFailed(f"{self.describe(src_key)} changed since it was checked") from None
            raise self._store_error(exc, "CopyObject", dst_key) from None

    def delete(self, key: str) -> None:
        try:
            self._call("DeleteObject", self.client.delete_object, key, Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            raise self._store_error(exc, "DeleteObject", key) from None

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        try:
            answer = self._call("GetObject", self.reader.get_object, key, reads=key, Bucket=self.bucket,
                                Key=self._key(key))
        except ClientError as exc:
            if http_status(exc) == 404 or error_code(exc) in ("NoSuchKey", "404"):
                raise NotFound(self.describe(key)) from None
            raise self._store_error(exc, "GetObject", key) from None
        try:
            yield from answer["Body"].iter_chunks(store.HASH_CHUNK)
        except (HTTPClientError, IncompleteReadError) as exc:
            raise self._store_error(exc, "GetObject", key) from None


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _changed(path: Path) -> ArtifactError:
    return ArtifactError(f"{path} changed while it was being published (its bytes no longer hash to what was "
                         "recorded); publish again when the artifact is complete (nothing was made visible)")
