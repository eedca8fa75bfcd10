"""A local checkpoint is hashed once per run, and not at all by a run after it: the plan in the CLI, the
flow's own plan, validation and publish all take the hash from the first reader (core.files.FileHasher,
keyed by path, size, mtime and inode).

The target is the tiny Qwen3 padded with a 2 GiB `padding.safetensors` (one U8 tensor, a sparse file: no
disk is used). It is part of the checkpoint's content, so it is hashed, but nothing else reads it: the cpu
compile reads only the tensors the decoder needs, and transformers loads model.safetensors alone.

What is counted is every byte `fusedspec run` reads through read(2): `rchar` of /proc/self/io, taken in
the process as it ends. Not a counter in FileHasher: each stage makes its own hasher, so one would need
patching into the code, and it would miss a stage that read the file some other way. rchar
sees every reader but also everything else (modules, the 39 MB model, the artifact being published, a
few hundred MB in all), so the bounds are one and two sizes of the padding: more than one size proves
the count sees the hashing, less than two proves it happened once.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
PADDING = 2 << 30
# Run the CLI, then report what this process read (a child cannot read /proc/<pid>/io once it has ended).
COUNTED_CLI = """
import sys
from fusedspec.flows.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    out.write(open("/proc/self/io").read())
sys.exit(code)
"""


def _pad_with_safetensors(model_dir: Path, size: int) -> None:
    """Add `padding.safetensors`: a valid safetensors file holding one U8 tensor of `size` zero bytes."""
    header = json.dumps({"padding": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(model_dir / "padding.safetensors", "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.truncate(8 + len(header) + size)  # a hole, not 2 GiB written


def _counted_run(config: Path, env: dict[str, str], io_file: Path) -> tuple[dict[str, Any], int]:
    """`fusedspec run CONFIG --json` in a fresh process: its summary and the bytes it read."""
    done = subprocess.run([sys.executable, "-c", COUNTED_CLI, str(io_file), "run", str(config), "--json"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    io = dict(line.split(": ") for line in io_file.read_text().splitlines())
    return json.loads(done.stdout), int(io["rchar"])


def test_a_large_local_checkpoint_is_hashed_once_per_run_and_not_again(
        tmp_path: Path, tiny_target: Path, tiny_drafts: dict[str, Path], prefect_server: Any) -> None:
    target = tmp_path / "padded-target"
    shutil.copytree(tiny_target, target)
    _pad_with_safetensors(target, PADDING)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "target": str(target), "draft": str(tiny_drafts["perturbed"]), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                   "dtype": ["float32"]},
        "validation": {"max_new_tokens": 8, "cost_ratio": 0.1}, "compile": {"aot_inductor": False},
        "publish": {"uri": str(tmp_path / "store")},
    }))  # JSON is YAML
    env = {**prefect_server.env, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}

    first, read_first = _counted_run(config, env, tmp_path / "io-first.txt")
    assert (first["counts"]["compiled"], first["counts"]["published"]) == (1, 1), first["counts"]
    assert PADDING < read_first < 2 * PADDING, f"{read_first:,} bytes read by the first run"

    second, read_second = _counted_run(config, env, tmp_path / "io-second.txt")
    assert second["counts"]["reused"] == 1, second["counts"]
    assert read_second < PADDING, f"{read_second:,} bytes read by the second run"
    print(f"bytes read: first run {read_first:,}, second run {read_second:,} (padding {PADDING:,})")
