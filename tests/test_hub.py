"""Model references through the real huggingface_hub client against the local Hub endpoint.

What moved is counted at the server (tests/fixtures/hub_server.py): bytes and requests per file. Faults
(a connection cut mid-file, a 500) are injected at that server, which is ours, so no client code is
patched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants as hf_constants
from safetensors.numpy import save_file

from fusedspec.compile.modelref import parse_model_ref
from fusedspec.core.errors import ModelRefError
from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.download import MARKER, DownloadMarker, download_model, fetch_configs
from fusedspec.registry.hub import HubTree, resolve_model

REPO_ROOT = Path(__file__).parents[1]
NEEDED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json"}
EXTRAS = {"README.md": b"# a model card\n", "pytorch_model.bin": b"\x80\x02pickle" * 100,
          "model.onnx": b"onnx" * 1000, "onnx/config.json": b"{}"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def settings_for(work: Path, hub, token: str | None = None) -> Settings:  # noqa: ANN001 - LocalHub
    return Settings(work_dir=work, hf_endpoint=hub.url, hf_token=token)


def files_under(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()) \
        if directory.exists() else []


def model_files(directory: Path) -> set[str]:
    """What a model directory holds besides the client's own bookkeeping (.cache/) and our marker."""
    return {f for f in files_under(directory) if not f.startswith(".cache/") and f != MARKER}


@pytest.fixture(scope="session")
def tiny_repo_dir(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 checkpoint plus files a build must never download (pickle, README, ONNX)."""
    root = tmp_path_factory.mktemp("repo") / "tiny"
    shutil.copytree(tiny_target, root)
    for name, data in EXTRAS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture(scope="session")
def tiny_repo(hub, tiny_repo_dir: Path) -> tuple[str, str]:  # noqa: ANN001 - LocalHub
    return "org/tiny", hub.add_repo("org/tiny", tiny_repo_dir)


def make_sharded_repo(root: Path, tokenizer_dir: Path, shard_bytes: tuple[int, int], seed: int) -> Path:
    """A two-shard safetensors checkpoint (random bytes, real format) with the real tokenizer files."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    weight_map = {}
    for i, nbytes in enumerate(shard_bytes, 1):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({f"w{i}": rng.integers(0, 255, size=nbytes, dtype=np.uint8)}, str(root / name))
        weight_map[f"w{i}"] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 151936}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tokenizer_dir / name, root / name)
    return root


# -- Must show 2: branch -> recorded commit; only needed files; nothing twice; resume --------------


def test_branch_resolves_to_the_commit_and_the_hub_hashes(hub, tiny_repo, tiny_repo_dir: Path,  # noqa: ANN001
                                                         tmp_path: Path) -> None:
    repo, main_commit = tiny_repo
    dev_dir = tmp_path / "dev"
    shutil.copytree(tiny_repo_dir, dev_dir)
    (dev_dir / "generation_config.json").write_text('{"do_sample": false}')
    dev_commit = hub.add_repo(repo, dev_dir, branch="dev")
    settings = settings_for(tmp_path / "work", hub)

    pinned = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    dev = resolve_model(parse_model_ref(f"hf://{repo}@dev"), settings)
    by_sha = resolve_model(parse_model_ref(f"hf://{repo}@{main_commit}"), settings)

    assert pinned.commit == main_commit and dev.commit == dev_commit != main_commit
    assert by_sha.file_hashes == pinned.file_hashes
    assert pinned.local_dir == settings.models_dir / "org--tiny" / main_commit
    assert set(pinned.file_hashes) == NEEDED  # no README, pickle, ONNX, nor onnx/config.json
    # LFS files: the sha256 the Hub's tree states; small files: their git blob id.
    assert pinned.file_hashes["model.safetensors"] == "sha256:" + sha256(tiny_repo_dir / "model.safetensors")
    assert pinned.file_hashes["config.json"] == "gitsha1:" + git_blob_sha1(tiny_repo_dir / "config.json")
    assert dev.file_hashes["generation_config.json"] != pinned.file_hashes["generation_config.json"]
    assert not settings.models_dir.exists()  # resolving downloads nothing


def test_only_needed_files_arrive_and_a_second_download_moves_nothing(hub, tiny_repo,  # noqa: ANN001
                                                                      tiny_repo_dir: Path,
                                                                      tmp_path: Path) -> None:
    repo, commit = tiny_repo
    settings = settings_for(tmp_path / "work", hub, token="hf_test_token_not_to_print")
    model = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    hub.reset_counters()

    configs = fetch_configs(model, settings)
    assert hub.files_served(repo) == NEEDED - {"model.safetensors"}  # configs alone: no weights moved
    assert model_files(configs) == NEEDED - {"model.safetensors"}

    hub.reset_counters()
    out = download_model(model, settings)
    assert out == model.local_dir and out.name == commit
    assert hub.files_served(repo) == {"model.safetensors"}  # the configs fetched before did not move again
    assert model_files(out) == NEEDED
    for name in NEEDED:
        assert sha256(out / name) == sha256(tiny_repo_dir / name)
    assert json.loads((out / MARKER).read_text())["commit"] == commit
    assert files_under(settings.models_dir / "org--tiny") == [f"{commit}/{f}" for f in files_under(out)]
    assert set(hub.auth_headers) == {"Bearer hf_test_token_not_to_print"}  # HF_TOKEN reached the Hub

    # The second download of the same reference: counted at the server, nothing at all.
    hub.reset_counters()
    assert download_model(model, settings) == out
    assert hub.bytes_served() == 0 and hub.request_count() == 0
    # Even re-resolved from scratch (a new process would do this): metadata requests, no file bytes.
    again = resolve_model(parse_model_ref(f"hf://{repo}@main"), settings)
    assert download_model(again, settings) == out and fetch_configs(again, settings) == out
    assert hub.bytes_served() == 0


def test_a_cache_file_that_is_not_its_document_is_a_miss_not_a_crash(hub, tiny_repo,  # noqa: ANN001
                                                                      tmp_path: Path) -> None:
    """A download marker or a cached Hub tree holding `[]` (a damaged disk, a hand edit) is looked up again,
    never indexed as a dict (the marker's AttributeError)."""
    repo, commit = tiny_repo
    settings = settings_for(tmp_path / "work", hub)
    model = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    out = download_model(model, settings)
    tree = settings.cache_dir / "hub-trees" / model.ref.slug / f"{commit}.json"
    assert tree.is_file() and (out / MARKER).is_file()
    for cache in (out / MARKER, tree):
        cache.write_text("[]")
    hub.reset_counters()
    again = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    assert again.file_hashes == model.file_hashes and HubTree.read(tree).names  # asked again, cached again
    assert download_model(again, settings) == out
    assert hub.files_served(repo) == NEEDED  # not downloaded by the marker: downloaded again, and checked
    assert DownloadMarker.read(out / MARKER).commit == commit


def test_a_connection_cut_mid_file_resumes_with_a_range_request(hub, qwen3_tokenizer: Path,  # noqa: ANN001
                                                                tmp_path: Path) -> None:
    repo = "org/cut-once"
    # The client writes what it received in chunks of DOWNLOAD_CHUNK_SIZE (10 MB), so a cut after 1.5
    # chunks keeps one chunk on disk, and the retry must ask for the bytes after it.
    chunk = hf_constants.DOWNLOAD_CHUNK_SIZE
    source = make_sharded_repo(tmp_path / "src", qwen3_tokenizer, shard_bytes=(2 * chunk, 1000), seed=1)
    hub.add_repo(repo, source)
    settings = settings_for(tmp_path / "work", hub)
    model = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    shard = "model-00001-of-00002.safetensors"
    size = (source / shard).stat().st_size
    hub.reset_counters()
    cut = chunk + chunk // 2
    hub.drop_after(repo, shard, after_bytes=cut)  # the server cuts the connection once, mid-file

    out = download_model(model, settings)

    assert hub.ranged_requests(repo, shard) == [f"bytes={chunk}-"]  # the retry asked for the rest only
    # not cut + size: the kept chunk did not move again
    assert hub.bytes_for(repo, shard) == cut + (size - chunk)
    assert sha256(out / shard) == sha256(source / shard)
    assert model.file_hashes[shard] == "sha256:" + sha256(out / shard)


def test_an_interrupted_download_is_completed_by_the_next_call(hub, qwen3_tokenizer: Path,  # noqa: ANN001
                                                               tmp_path: Path) -> None:
    repo = "org/fails-once"
    source = make_sharded_repo(tmp_path / "src", qwen3_tokenizer, shard_bytes=(2_000_000, 2_000_000), seed=2)
    hub.add_repo(repo, source)
    settings = settings_for(tmp_path / "work", hub)
    model = resolve_model(parse_model_ref(f"hf://{repo}"), settings)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    hub.reset_counters()
    hub.fail_with(repo, second, status=500)  # the server fails one file once

    with pytest.raises(ModelRefError, match="run the same command again to resume"):
        download_model(model, settings)
    assert not model.local_dir.exists()  # no half-written model directory
    assert hub.bytes_for(repo, first) == (source / first).stat().st_size

    hub.reset_counters()
    out = download_model(model, settings)
    assert hub.bytes_for(repo, first) == 0  # finished before the failure: kept, not fetched again
    assert hub.bytes_for(repo, second) == (source / second).stat().st_size
    assert {sha256(out / n) for n in (first, second)} == {sha256(source / n) for n in (first, second)}
    assert not out.with_name(out.name + ".partial").exists()


def test_a_local_directory_is_hashed_and_used_in_place(tiny_target: Path, tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work")
    model = resolve_model(parse_model_ref(str(tiny_target)), settings)
    assert model.commit is None and model.local_dir == tiny_target.resolve()
    assert model.file_hashes["model.safetensors"] == "sha256:" + sha256(tiny_target / "model.safetensors")
    assert download_model(model, settings) == fetch_configs(model, settings) == tiny_target.resolve()
    # Nothing is copied: the work dir holds only the remembered hashes (so the next plan reads nothing).
    assert [p.relative_to(settings.work_dir).parts[:2] for p in settings.work_dir.rglob("*") if p.is_file()] \
        == [("cache", "file-hashes")] * len(model.file_hashes)


# -- Must show 5: bad references: one line, exit 2, nothing in the download directory -------------


@pytest.fixture(scope="session")
def pickle_repo(hub, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: ANN001 - LocalHub
    root = tmp_path_factory.mktemp("pickles")
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (root / "pytorch_model.bin").write_bytes(b"\x80\x02" + bytes(1000))
    hub.add_repo("org/pickles-only", root)
    return "org/pickles-only"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("ref, words", [
    ("hf://org/no-such-model", "no repository org/no-such-model"),
    ("hf://org/tiny@no-such-branch", "revision 'no-such-branch' does not exist in org/tiny"),
    ("hf://org/pickles-only", "only in pickle format (pytorch_model.bin)"),
    ("hf://org/../etc", "'..'"),
    ("hf:///etc/passwd", "absolute"),
    ("hf://org/tiny", "cannot reach the Hub at http://127.0.0.1:"),
])
def test_bad_references_fail_in_one_line_and_leave_nothing(hub, tiny_repo, pickle_repo,  # noqa: ANN001
                                                           qwen3_tokenizer: Path,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str],
                                                           ref: str, words: str) -> None:
    work = tmp_path / "work"
    endpoint = f"http://127.0.0.1:{_closed_port()}" if "cannot reach" in words else hub.url
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_printed")

    code = main(["check-tokenizers", ref, str(qwen3_tokenizer)])

    out, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert "hf_secret_never_printed" not in out + err
    assert files_under(work / "models") == []
    with pytest.raises(ModelRefError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolve_model(parse_model_ref(ref), Settings(work_dir=work, hf_endpoint=endpoint))


def test_the_installed_command_reports_a_bad_reference_in_one_line(hub, tiny_repo,  # noqa: ANN001
                                                                   qwen3_tokenizer: Path,
                                                                   tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(work), "HF_ENDPOINT": hub.url,
           "HF_TOKEN": "hf_secret_never_printed"}
    done = subprocess.run([str(Path(sys.executable).parent / "fusedspec"), "check-tokenizers",
                           "hf://org/tiny@v9", str(qwen3_tokenizer)],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fusedspec check-tokenizers: error: hf://org/tiny@v9: revision 'v9' does not exist in org/tiny on "
        f"{hub.url} (give a branch, tag or commit sha of that repo)"
    ]
    assert "hf_secret_never_printed" not in done.stdout + done.stderr
    assert files_under(work / "models") == []


# -- Issue 11, must show 6: bytes that differ from the Hub's listing are refused at download ---------------


def test_tampered_hub_bytes_are_refused_naming_the_file_and_nothing_is_compiled(
        hub, tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    repo, weights = "org/tampered", "model.safetensors"
    source = tmp_path / "repo"
    shutil.copytree(tiny_target, source)
    hub.add_repo(repo, source)  # the listing states the sha256 of these bytes
    good = (source / weights).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    (source / weights).write_bytes(bytes(bad))  # what the endpoint now serves: same size, other bytes
    work = tmp_path / "work"
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({
        "target": f"hf://{repo}", "draft": str(tiny_drafts["perturbed"]), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                   "dtype": ["float32"]}, "compile": {"aot_inductor": False},
        "publish": {"uri": str(tmp_path / "store")}}))

    assert main(["compile", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the download's progress bar
    assert err.startswith("fusedspec compile: error:") and f"{weights} downloaded from {repo}@" in err
    assert "does not match the hash the Hub lists" in err and "nothing was compiled" in err
    assert not (work / "builds").exists() or files_under(work / "builds") == []
    bad_sha = hashlib.sha256(bytes(bad)).hexdigest()
    kept = [p for p in work.rglob("*")
            if p.is_file() and p.stat().st_size == len(bad) and sha256(p) == bad_sha]
    assert kept == []  # neither the model dir, its staging dir nor any cache keeps the bad bytes

    (source / weights).write_bytes(good)  # the endpoint serves the listed bytes again: the next run gets them
    hub.reset_counters()
    model = resolve_model(parse_model_ref(f"hf://{repo}"), settings_for(work, hub))
    out = download_model(model, settings_for(work, hub))
    # the configs that arrived intact were kept, the bad file was not
    assert hub.files_served(repo) == {weights}
    assert sha256(out / weights) == hashlib.sha256(good).hexdigest()
