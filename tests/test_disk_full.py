"""A disk that fills up is a clear error, exit 2, and nothing half-written is left (issue 12, must show 5).

The filesystems are real: a size-limited tmpfs mounted under the test's directory (mount needs root or
CAP_SYS_ADMIN; without it these tests are skipped, saying so). Each fills during the real write: a
compile's weights or its programs (torch's own serializer), a publish into a directory store, and a
download from the local Hub endpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from fusedspec.flows.cli import main

MiB = 1 << 20


@contextmanager
def small_filesystem(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` for the block, unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size >> 20} MiB tmpfs here ({done.stderr.strip() or 'mount failed'}); "
                    "a full disk needs a real small filesystem (run as root, as CI does)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in out + err, out + err
    return code, out, err


def run_config(path: Path, target: Path, draft: Path, store: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "target": str(target), "draft": str(draft), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                   "dtype": ["float32"]}, "compile": {"aot_inductor": False},
        "publish": {"uri": str(store)}}))
    return path


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# What the work dir's filesystem leaves room for: half the weights, or the weights and not the programs
# (the program write goes through torch's serializer, which once turned ENOSPC into a RuntimeError).
ROOM: dict[str, Callable[[int], int]] = {"weights": lambda weights: weights // 2,
                                         "programs": lambda weights: weights + MiB}


@pytest.mark.parametrize("fills_at", list(ROOM))
def test_a_compile_that_fills_the_work_dir_says_so_and_leaves_no_build(
        fills_at: str, tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    config = run_config(tmp_path / "run.yaml", tiny_target, tiny_drafts["cut"], tmp_path / "store")
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "sizing"))
    code, out, _ = cli(["compile", str(config), "--dry-run", "--json"], capsys)
    assert code == 0
    [build] = json.loads(out)["builds"]
    work = tmp_path / "work"
    with small_filesystem(work, ROOM[fills_at](build["weights_bytes"])):
        monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
        for argv in (["compile", str(config)], ["compile", str(config), "--json"]):
            code, out, err = cli(argv, capsys)
            assert code == 2, err
            message = err.strip().splitlines()[-1]
            assert message.startswith("fusedspec compile: error: no space left in "), message
            assert f"{work / 'builds'} while compiling {build['slug']}" in message  # the directory, what
            assert "MiB were free when it began; it needed more" in message  # the space it needed
            if argv[-1] == "--json":
                assert json.loads(out)["exit_code"] == 2
            assert files_under(work / "builds") == [], "a partial build was left"
            assert not (work / "logs").exists()  # an input error, not an internal one
        shutil.rmtree(work / "cache", ignore_errors=True)


def test_a_publish_that_fills_a_directory_store_says_so_and_leaves_no_file(
        tmp_path: Path, artifact_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    artifact = artifact_factory(k=4, tp=2, weight_mib=3)  # two 3 MiB shards
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    store = tmp_path / "store"
    with small_filesystem(store, 4 * MiB):
        code, _, err = cli(["publish", str(artifact), str(store)], capsys)
        assert code == 2, err
        assert "no space left in " in err and f"{store}/" in err and "while publishing " in err, err
        assert "it needed about 3.0 MiB" in err, err  # one shard
        # Of the attempt, nothing is left. What stays is content pointers (.blobs/<sha256>) for the files
        # stored before the disk filled: hints a publish never trusts (it checks the store's checksum of
        # the object named before copying it), so one naming a removed object costs an upload, no more.
        assert [p for p in files_under(store) if not p.startswith(".blobs/")] == []
        code, out, _ = cli(["ls", str(store), "--json"], capsys)
        assert code == 0 and json.loads(out)["configs"] == []


@pytest.mark.slow
def test_a_download_that_fills_the_work_dir_says_so_and_keeps_no_partial_file(
        hub, tmp_path: Path, tiny_target: Path,  # noqa: ANN001 - the hub
        tiny_drafts: dict[str, Path]) -> None:
    hub.add_repo("diskfull/target", tiny_target)
    hub.add_repo("diskfull/draft", tiny_drafts["cut"])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "target": "hf://diskfull/target", "draft": "hf://diskfull/draft", "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "dtype": ["float32"]},
        "compile": {"aot_inductor": False}, "publish": {"uri": str(tmp_path / "store")}}))
    sizes = {p.name: p.stat().st_size for p in tiny_target.iterdir() if p.is_file()}
    configs = sum(size for name, size in sizes.items() if not name.endswith(".safetensors"))
    work = tmp_path / "work"
    # room for both models' configs and tokenizers (a plan's fetch), and half the target's weights
    with small_filesystem(work, 2 * configs + sizes["model.safetensors"] // 2 + MiB):
        # a process of its own: the local Hub serves from this one, and its connection errors are its own
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(work), "HF_ENDPOINT": hub.url,
               "HF_HUB_DISABLE_XET": "1"}
        env.pop("HF_TOKEN", None)
        done = subprocess.run([sys.executable, "-m", "fusedspec.flows.cli", "compile", str(config)],
                              capture_output=True, text=True, env=env, timeout=300,
                              cwd=Path(__file__).parents[1])
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        message = done.stderr.strip().splitlines()[-1]
        assert message.startswith("fusedspec compile: error: no space left in "), message
        assert "while downloading hf://diskfull/target" in message and "it needed more" in message, message
        assert [p for p in files_under(work / "models") if p.endswith(".incomplete")] == []
        assert files_under(work / "builds") == []
