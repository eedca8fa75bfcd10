"""Pin a model reference to immutable content: a Hub commit and the hash of every file a build reads.

    resolve_model(ref, settings)   -> ResolvedModel   revision -> commit, file hashes; nothing downloaded
    (registry.download fetches the files and checks their bytes against these hashes)

Hub models go through the real `huggingface_hub` client, with the endpoint and token from `Settings`
(never from the import-time environment, never printed). The Hub's tree listing states the sha256 of
every LFS file, so weights are not re-hashed; small files are identified by their git blob sha1. The
listing of a commit never changes, so it is kept in the work dir's cache and asked for once.
Local directories are hashed (sha256) once per unchanged file (core.files.FileHasher), after their
config.json and weight file headers are checked.
Weights must be safetensors: pickled checkpoints are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from huggingface_hub import HfApi
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from fusedspec.compile.documents.base import Document
from fusedspec.compile.model_files import PICKLE_SUFFIXES, is_needed, is_weight_file
from fusedspec.compile.modelconfig import ModelConfig, read_model_config
from fusedspec.compile.safetensors_header import check_safetensors_file
from fusedspec.core.errors import HubUnavailable, ModelRefError
from fusedspec.core.files import FileHasher

try:  # huggingface_hub 2.x talks through httpx2, 1.x through httpx: catch the one in use
    import httpx2 as http_client
except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
    import httpx as http_client  # type: ignore[no-redef]
from fusedspec.compile.modelref import COMMIT_SHA, ModelRef, ResolvedModel, parse_model_ref
from fusedspec.core.settings import Settings

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"


def endpoint_of(settings: Settings) -> str:
    return (settings.hf_endpoint or DEFAULT_ENDPOINT).rstrip("/")


def resolve_model(ref: ModelRef | str, settings: Settings, *,
                  config: ModelConfig | None = None) -> ResolvedModel:
    """Pin `ref`: for the Hub, the commit its revision points at now and the hash of each needed file;
    for a local directory, the sha256 of each needed file, and its parsed config.json (`config` when the
    caller parsed it already). Raises ModelRefError with one clear line for an unknown repo or revision,
    an unreachable endpoint, or a checkpoint without safetensors."""
    if isinstance(ref, str):
        ref = parse_model_ref(ref)
    if ref.local_dir is not None:
        return resolve_local(ref, FileHasher(settings.cache_dir), config=config)
    return _resolve_hub(ref, settings)


def resolve_local(ref: ModelRef, hasher: FileHasher, *, config: ModelConfig | None = None) -> ResolvedModel:
    """A local directory pinned by the sha256 of each needed file (`hasher` remembers unchanged ones),
    carrying its parsed config.json.

    Its config.json (unless the caller hands it parsed) and every weight file's header are checked first:
    a broken config or a truncated file is refused in milliseconds, where hashing a 64 GB checkpoint takes
    minutes (and would remember the hashes of files no build can use)."""
    parsed = check_local(ref, config=config)
    assert ref.local_dir is not None
    root = ref.local_dir
    hashes = {p.name: "sha256:" + hasher.sha256(p) for p in sorted(root.iterdir())
              if p.is_file() and is_needed(p.name)}
    return ResolvedModel(ref=ref, commit=None, local_dir=root, file_hashes=hashes, config=parsed)


def check_local(ref: ModelRef, *, config: ModelConfig | None = None) -> ModelConfig:
    """A local directory's parsed config.json (`config` when the caller parsed it already), once its weight
    files are known to be safetensors with sound headers: what can be refused without hashing a byte."""
    assert ref.local_dir is not None
    root = ref.local_dir
    names = sorted(p.name for p in root.iterdir() if p.is_file())
    _check_weight_format(ref, names)
    parsed = config if config is not None else read_model_config(root)
    for name in names:
        if is_weight_file(name):
            check_safetensors_file(root / name)
    return parsed


def _resolve_hub(ref: ModelRef, settings: Settings) -> ResolvedModel:
    assert ref.repo_id is not None
    api = HfApi(endpoint=endpoint_of(settings), token=settings.hf_token or None)
    revision = ref.revision or DEFAULT_REVISION
    with hub_errors(ref, settings):
        if COMMIT_SHA.match(revision):
            commit = revision
        else:
            info = api.model_info(ref.repo_id, revision=revision)
            if not info.sha or not COMMIT_SHA.match(info.sha):
                raise ModelRefError(f"{ref}: the Hub at {endpoint_of(settings)} gave no commit for "
                                    f"{revision!r}")
            commit = info.sha
        names, hashes = _tree(api, ref, commit, settings)
    _check_weight_format(ref, names)
    local = settings.models_dir / ref.slug / commit
    return ResolvedModel(ref=ref, commit=commit, local_dir=local, file_hashes=hashes)


class HubTree(Document):
    """A commit's top-level file names and the hash of each needed one, cached (a commit never changes)."""

    names: list[str]
    hashes: dict[str, str]


def _tree(api: HfApi, ref: ModelRef, commit: str, settings: Settings) -> tuple[list[str], dict[str, str]]:
    """Top-level file names at `commit` and the hash of each needed one (cached: a commit never changes)."""
    assert ref.repo_id is not None
    path = settings.cache_dir / "hub-trees" / ref.slug / f"{commit}.json"
    cached = HubTree.read_cached(path)  # not cached yet, or a damaged entry: ask the Hub
    if cached is not None:
        return list(cached.names), dict(cached.hashes)
    entries = [e for e in api.list_repo_tree(ref.repo_id, revision=commit, recursive=True)
               if isinstance(e, RepoFile)]
    names = sorted(e.path for e in entries if "/" not in e.path)
    hashes: dict[str, str] = {}
    for entry in entries:
        if is_needed(entry.path):
            # The Hub states the sha256 of LFS files (every weight file); small files have their git blob id.
            hashes[entry.path] = (f"sha256:{entry.lfs.sha256}" if entry.lfs is not None
                                  else f"gitsha1:{entry.blob_id}")
    try:
        HubTree(names=names, hashes=hashes).write(path)
    except OSError:
        pass  # the cache only saves a request next time
    return names, hashes


def _check_weight_format(ref: ModelRef, names: Iterable[str]) -> None:
    names = list(names)
    if any(n.endswith(".safetensors") for n in names):
        return
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise ModelRefError(
            f"{ref}: weights are only in pickle format ({', '.join(pickles[:3])}); fusedspec loads "
            "safetensors only (pickles can run code). Convert them with transformers "
            "(`AutoModelForCausalLM.from_pretrained(...).save_pretrained(dir, safe_serialization=True)`) "
            "and point at that directory or a repo revision that has *.safetensors"
        )
    raise ModelRefError(f"{ref}: no *.safetensors weight files at the top level of the checkpoint; "
                        "is this a model repository or directory?")


TRANSIENT_STATUSES = (429, 500, 502, 503, 504)


@contextmanager
def hub_errors(ref: ModelRef, settings: Settings) -> Iterator[None]:
    """Turn the Hub client's HTTP and transport errors into one-line ModelRefErrors that say what to do
    (HubUnavailable for a failure a later try may not meet: 429, 5xx, a connection that failed or timed
    out). Anything else propagates unchanged."""
    try:
        yield
    except (HfHubHTTPError, http_client.TransportError) as exc:
        error = HubUnavailable if _transient(exc) else ModelRefError
        raise error(f"{ref}: {_hub_message(exc, ref, settings)}") from exc


def _transient(exc: Exception) -> bool:
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        return status in TRANSIENT_STATUSES and not isinstance(exc, RemoteEntryNotFoundError)
    return True  # a transport error: the connection failed, timed out or was dropped


def _hub_message(exc: Exception, ref: ModelRef, settings: Settings) -> str:
    where = endpoint_of(settings)
    if isinstance(exc, RevisionNotFoundError):
        return (f"revision {ref.revision or DEFAULT_REVISION!r} does not exist in {ref.repo_id} on {where} "
                "(give a branch, tag or commit sha of that repo)")
    if isinstance(exc, GatedRepoError):
        return f"{ref.repo_id} on {where} is gated: accept its terms on the Hub and set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        hint = "check the name" + ("" if settings.hf_token else "; a private repo needs HF_TOKEN")
        return f"no repository {ref.repo_id} on {where} ({hint})"
    if isinstance(exc, RemoteEntryNotFoundError):
        return f"a file listed by {where} for {ref.repo_id} is missing there; try again or pin another commit"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            return (f"{where} refused access (HTTP {status}); set HF_TOKEN to a token that can read "
                    f"{ref.repo_id}")
        return f"the Hub at {where} answered HTTP {status}; try again later or check HF_ENDPOINT"
    if isinstance(exc, http_client.ConnectError | http_client.TimeoutException):
        return f"cannot reach the Hub at {where} ({type(exc).__name__}); check HF_ENDPOINT and the network"
    return f"the connection to {where} failed ({type(exc).__name__}); try again, downloads resume"
