"""A Neuron-shaped artifact goes through publish, verify and the serving pod's init check unchanged (issue 7,
must-show 4; issue 13: the init step's quick check of what the pod mounts).

LAYOUT FIXTURE, NOT A COMPILE: no Neuron SDK here, so the directory is made by
tests/fixtures/fake_artifacts.make_neuron_artifact from the neuron backend's own translation, file list and
build.json record, with NxDI's outputs stood in for (placeholder model.pt, safetensors shards with NxDI's
`draft_model.` / `target_model.` prefixes), the real Qwen3 tokenizer files and a toolchain as a Neuron host
would record it. What is tested is the path through the registry.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fusedspec.core.settings import Settings, load_settings
from tests.fixtures.fake_artifacts import NEURON_HOST_TOOLCHAIN

SHARD = "weights/tp3_sharded_checkpoint.safetensors"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def neuron_layout(neuron_artifact_factory: Any) -> Path:
    return neuron_artifact_factory(tp=32, k=7, batch=4, seq_len=1024)


def test_the_layout_carries_nxdi_files_and_what_the_vllm_fork_reads(neuron_layout: Path) -> None:
    files = set(_tree(neuron_layout))
    assert {"neuron_config.json", "model.pt", "build.json"} <= files
    assert {f"weights/tp{r}_sharded_checkpoint.safetensors" for r in range(32)} <= files
    # The root is the target's model directory for vLLM (config, generation config, tokenizer), draft/ the
    # draft's.
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "draft/config.json", "draft/generation_config.json"} <= files
    described = json.loads((neuron_layout / "build.json").read_text())
    serving = described["neuron"]["serving"]
    assert serving["model_files"]["draft"] == ["draft/config.json", "draft/generation_config.json"]
    assert set(serving["model_files"]["target"]) == {"config.json", "generation_config.json",
                                                     "tokenizer.json", "tokenizer_config.json"}
    # What the build does that its reader should know (static greedy sampling) travels with it.
    assert any("temperature, top_k and top_p are ignored" in note for note in described["neuron"]["notes"])
    target_config = json.loads((neuron_layout / "config.json").read_text())
    draft_config = json.loads((neuron_layout / "draft" / "config.json").read_text())
    assert (target_config["hidden_size"], draft_config["hidden_size"]) == (5120, 2048)


def test_neuron_layout_through_publish_and_verify(neuron_layout: Path, tmp_path: Path) -> None:
    from fusedspec.registry.publish import publish_artifact
    from fusedspec.registry.verify import verify_version

    settings = load_settings()
    before = _tree(neuron_layout)
    store_root = tmp_path / "store"
    result = publish_artifact(neuron_layout, str(store_root), settings)
    assert result.created
    assert result.config_path == "Qwen--Qwen3-32B/Qwen--Qwen3-1.7B/tp32-seq1024-k7-bs4-bfloat16"
    version_dir = store_root / result.config_path / result.key
    manifest = json.loads((version_dir / "manifest.json").read_text())
    published = _tree(version_dir / result.attempt)
    assert published == before  # every file, byte for byte, no more, no less
    assert manifest["backend"] == "neuron" and manifest["toolchain"] == NEURON_HOST_TOOLCHAIN
    assert set(manifest["files"]) == set(before)

    report = verify_version(str(version_dir), settings)
    assert report.ok, report.problems
    assert report.files_checked == len(before) == 2 + 32 + 4 + 2 + 1 + 1  # + validation.json
    # This host has no Neuron SDK: the runtime check refuses the version and says why.
    checked = verify_version(str(store_root / result.config_path), settings, runtime_check=True)
    assert not checked.ok and checked.via_latest
    assert any(p.startswith("runtime: neuronx-cc: the artifact was built with 2.21.33363.0+82129205, this "
                            "host has absent") for p in checked.problems)
    assert _tree(neuron_layout) == before  # publishing did not touch the artifact


def _mounted(version_dir: Path, mount_root: Path, key: str) -> Path:
    """The version as the pod sees it: its files under <mount root>/<key> (Mountpoint shows the version
    prefix)."""
    mount = mount_root / key
    shutil.copytree(version_dir, mount)
    return mount


def _bytes_read(call: Callable[[], Any]) -> int:
    """Bytes this process read through read() calls while `call` ran (Linux /proc/self/io rchar, page cache
    included): how the quick check is shown to read no weights."""
    def rchar() -> int:
        return int(next(line for line in Path("/proc/self/io").read_text().splitlines()
                        if line.startswith("rchar:")).split()[1])

    before = rchar()
    call()
    return rchar() - before


def test_the_init_check_reads_sizes_not_bytes_and_runs_the_runtime_check(
        neuron_artifact_factory: Any, s3_bucket: str, s3_settings: Settings, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the init container runs (`fusedspec verify <mount> --runtime-check --quick --json`), on the
    version downloaded from SeaweedFS into a directory laid out like the pod's mount."""
    from fusedspec.flows.cli import main
    from fusedspec.registry.publish import publish_artifact
    from fusedspec.registry.stores import open_store
    from fusedspec.registry.verify import verify_version

    neuron_layout = neuron_artifact_factory(tp=32, k=7, batch=4, seq_len=1024, shard_bytes=1 << 20)  # 32 MiB
    result = publish_artifact(neuron_layout, f"s3://{s3_bucket}/fusedspec", s3_settings)
    store = open_store(result.version_uri, s3_settings)
    downloaded = tmp_path / "downloaded"
    for info in store.list(""):
        target = downloaded / info.key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get(info.key))
    mount = _mounted(downloaded, tmp_path / "var-mdl", result.key)
    settings = load_settings()

    quick = verify_version(str(mount), settings, quick=True)
    assert quick.ok and quick.bytes_checked == 0 and quick.quick
    assert quick.files_checked == len(_tree(neuron_layout))
    # Through a mount, reading a file is fetching it from S3: the quick check reads the manifest, not the
    # weights.
    assert _bytes_read(lambda: verify_version(str(mount), settings, quick=True)) < 1 << 20
    assert _bytes_read(lambda: verify_version(str(mount), settings)) > 32 << 20
    # The init container's command line: the manifest and sizes pass; the runtime check fails on this host
    # (no Neuron SDK), which is what stops the pod before vLLM would try to recompile.
    assert main(["verify", str(mount), "--runtime-check", "--quick", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["sha256_checked"] is False and out["bytes_checked"] == 0
    assert out["problems"] and all(p.startswith("runtime: ") for p in out["problems"])
    assert main(["verify", str(mount), "--quick"]) == 0
    assert "sizes, etags and store checksums match the manifest" in capsys.readouterr().out

    # The mount directory is named by the key: a pod that mounted another version fails the check.
    elsewhere = _mounted(downloaded, tmp_path / "wrong", "other-version")
    assert any("differs from the version directory 'other-version'" in p
               for p in verify_version(str(elsewhere), settings, quick=True).problems)

    # Quick: a truncated or missing file is caught (what makes vLLM recompile) ...
    shard = mount / result.attempt / SHARD
    original = shard.read_bytes()
    shard.write_bytes(original[:-1])
    assert verify_version(str(mount), settings, quick=True).problems == [
        f"{SHARD}: size {len(original) - 1} bytes, the manifest says {len(original)}"]
    shard.unlink()
    assert verify_version(str(mount), settings, quick=True).problems == [f"{SHARD}: missing from the store"]
    # ... a changed byte of the same size is not: that takes the full check, which reads every byte.
    changed = bytearray(original)
    changed[-1] ^= 0xFF
    shard.write_bytes(bytes(changed))
    assert verify_version(str(mount), settings, quick=True).ok
    full = verify_version(str(mount), settings)
    assert full.problems[0].startswith(f"{SHARD}: sha256 ") and full.bytes_checked > 0
