"""Download a pinned Hub model: configs alone (for plans and the tokenizer gate), or every needed file.

Layout under `settings.models_dir/<slug>/`:

    <commit>/            the complete model (a real directory, no symlinks: Mountpoint has none)
    <commit>.configs/    config.json and tokenizer files only, when weights were not asked for yet
    <commit>.partial/    a download under way, or interrupted (the next call resumes it)

Each finished directory holds a marker (`.fusedspec-download.json`) written before the staging directory
is renamed into place, so a directory without it is never used, and a directory with it is never
downloaded again: the second call makes no request at all. Before the marker is written, every file's
bytes are checked against the hash the Hub states for it (sha256 for LFS files, the git blob sha1 for
small ones): a file that differs is removed and named in the error, never compiled. `snapshot_download` gets
the resolved commit and an explicit list of files, so nothing else arrives (no README, no pickles, no ONNX).
Files that finished before an interruption are kept and skipped on the next call; a connection dropped inside
a file is resumed by the client with an HTTP Range request. A permanent error (repo or revision gone)
removes the staging directory, so nothing half-written is left behind.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import tqdm as hf_tqdm

from fusedspec.compile.documents.base import Document
from fusedspec.compile.model_files import is_config_file
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.core.errors import ModelRefError
from fusedspec.core.files import disk_full, file_lock, free_bytes, sha256_file
from fusedspec.core.settings import Settings
from fusedspec.registry.hub import endpoint_of, hub_errors

MARKER = ".fusedspec-download.json"
MAX_WORKERS = 4  # parallel file downloads; the machines here have 2 cores and one network


class _QuietProgress(hf_tqdm):  # type: ignore[misc]
    """No progress bar for config files: they take a moment, and a plan's output should stay readable."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def fetch_configs(model: ResolvedModel, settings: Settings) -> Path:
    """A directory with the model's config.json and tokenizer files (no weights). For a local model,
    its own directory; for a Hub model, the complete download if there is one, else a configs-only one."""
    if model.commit is None:
        return model.local_dir
    if is_downloaded(model.local_dir, model, _all_files(model)):
        return model.local_dir
    configs_dir = model.local_dir.with_name(model.local_dir.name + ".configs")
    names = _config_files(model)
    if is_downloaded(configs_dir, model, names):
        return configs_dir
    with file_lock(_lock_path(settings, model)):
        if not is_downloaded(configs_dir, model, names):
            _download(model, settings, configs_dir, names, progress=False)
    return configs_dir


def download_model(model: ResolvedModel, settings: Settings) -> Path:
    """The directory with every needed file of the model (weights, configs, tokenizer files).
    A local model is returned as it is; a Hub model is downloaded once, then found."""
    if model.commit is None:
        return model.local_dir
    names = _all_files(model)
    if is_downloaded(model.local_dir, model, names):
        return model.local_dir
    with file_lock(_lock_path(settings, model)):
        if not is_downloaded(model.local_dir, model, names):
            staging = _staging(model.local_dir)
            configs_dir = model.local_dir.with_name(model.local_dir.name + ".configs")
            if not staging.exists() and is_downloaded(configs_dir, model, _config_files(model)):
                # Start from the configs already fetched (with the client's own metadata), so they
                # are not transferred a second time.
                shutil.copytree(configs_dir, staging, symlinks=False)
                (staging / MARKER).unlink()
            _download(model, settings, model.local_dir, names)
            shutil.rmtree(configs_dir, ignore_errors=True)  # superseded by the complete directory
    return model.local_dir


class DownloadMarker(Document):
    """MARKER in a finished download: the files it holds, with the hash each was checked against."""

    repo_id: str
    commit: str
    files: dict[str, str]


def is_downloaded(directory: Path, model: ResolvedModel, names: list[str]) -> bool:
    """True when `directory` holds a finished download of `names` at the model's commit. A marker that is
    not one (damaged, or written by hand) is a directory not downloaded yet: it is downloaded again."""
    done = DownloadMarker.read_cached(directory / MARKER)
    return (done is not None and done.commit == model.commit
            and all(done.files.get(n) == model.file_hashes[n] for n in names))


def _all_files(model: ResolvedModel) -> list[str]:
    return sorted(model.file_hashes)


def _config_files(model: ResolvedModel) -> list[str]:
    names = [n for n in sorted(model.file_hashes) if is_config_file(n)]
    if "config.json" not in names:
        raise ModelRefError(f"{model.ref}: the checkpoint has no config.json at commit {model.commit}")
    return names


def _staging(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def _download(model: ResolvedModel, settings: Settings, final: Path, names: list[str], *,
              progress: bool = True) -> None:
    """Download `names` at the model's commit into a staging sibling of `final`, then rename it."""
    assert model.ref.repo_id is not None and model.commit is not None
    staging = _staging(final)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        with hub_errors(model.ref, settings), _disk_checked(staging, model):
            snapshot_download(
                model.ref.repo_id,
                revision=model.commit,
                local_dir=staging,
                allow_patterns=names,  # exact names: only what a build needs, top level only
                endpoint=endpoint_of(settings),
                token=settings.hf_token or None,
                cache_dir=settings.cache_dir / "hf-hub",
                max_workers=MAX_WORKERS,
                tqdm_class=None if progress else _QuietProgress,
            )
    except ModelRefError as exc:
        permanent = isinstance(exc.__cause__, RepositoryNotFoundError | RevisionNotFoundError)
        if permanent or not any((staging / n).is_file() for n in names):
            shutil.rmtree(staging, ignore_errors=True)
        else:
            raise type(exc)(f"{exc} (finished files are kept in {staging}; run the same command again "
                            "to resume)") from exc.__cause__
        raise
    missing = [n for n in names if not (staging / n).is_file()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelRefError(f"{model.ref}: the Hub did not deliver {', '.join(missing[:3])} at commit "
                            f"{model.commit}; try again")
    _check_bytes(model, staging, names)
    DownloadMarker(repo_id=model.ref.repo_id, commit=model.commit,
                   files={n: model.file_hashes[n] for n in names}).write(staging / MARKER)
    if final.exists():  # an older, incomplete or superseded directory: replaced as a whole
        shutil.rmtree(final)
    staging.replace(final)


def hub_file_hash(path: Path, expected: str) -> str:
    """The file's hash in the form of `expected`: sha256:<hex> or gitsha1:<hex> (git blob id)."""
    if expected.startswith("gitsha1:"):
        digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return "gitsha1:" + digest.hexdigest()
    return "sha256:" + sha256_file(path)


def _check_bytes(model: ResolvedModel, staging: Path, names: list[str]) -> None:
    """Every downloaded file must hash to what the Hub's listing states; a differing one is removed."""
    bad = [n for n in names if hub_file_hash(staging / n, model.file_hashes[n]) != model.file_hashes[n]]
    if bad:
        for name in bad:
            (staging / name).unlink(missing_ok=True)
        raise ModelRefError(f"{model.ref}: {', '.join(bad[:3])} downloaded from "
                            f"{model.ref.repo_id}@{model.commit} does not match the hash the Hub lists for "
                            "it (tampered or corrupted in transit); it was removed, nothing was compiled "
                            "from it. Run the same command again; if it persists, the endpoint serves other "
                            "bytes than its listing (check HF_ENDPOINT)")


@contextmanager
def _disk_checked(staging: Path, model: ResolvedModel) -> Iterator[None]:
    """A full disk during a download becomes DiskFullError naming the staging dir. The half-written file
    is removed; files that finished stay for the next run (the staging dir is never read as a model)."""
    free_at_start = free_bytes(staging)
    try:
        yield
    except OSError as exc:
        full = disk_full(exc, staging, f"downloading {model.ref}", more_than=free_at_start)
        if full is None:
            raise
        for partial in staging.rglob("*.incomplete"):
            partial.unlink(missing_ok=True)
        raise full from None


def _lock_path(settings: Settings, model: ResolvedModel) -> Path:
    """One download of a given model at a time across processes (workers may share a work dir).
    The lock lives in the cache dir, so the models dir holds nothing but models."""
    return settings.cache_dir / "locks" / f"{model.ref.slug}--{model.commit}.lock"
