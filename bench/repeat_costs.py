"""What a process pays again for what it has opened or parsed before, each way side by side in one process:

- opening an S3 store (three botocore clients): a new botocore data loader per store, as every store had,
  against the process's one loader (registry/s3_store.py `_new_session`); no request is sent;
- reading a tokenizer's content from a second directory holding the same files: parsed again, against
  found by the files' digests (compile/tokenizer_content.py);
- loading an exported program whose bytes were loaded before: deserialized again, against the kept
  deserialized program (compile/cpu/export.py `_deserialized`), `.module()` made each time either way.

    .venv/bin/python bench/repeat_costs.py ARTIFACT_DIR [--rounds 5]

ARTIFACT_DIR is a cpu build with exported programs and a tokenizer (any build of the tiny pair). Medians of
`--rounds` alternating rounds and their ratios are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import torch  # noqa: E402

from fusedspec.compile import tokenizer_content  # noqa: E402
from fusedspec.compile.cpu.export import TORCH_STATE_LOCK, _deserialized, _schema_hints_kept  # noqa: E402
from fusedspec.registry.s3_store import S3Store  # noqa: E402
from fusedspec.registry.uri import parse_store_uri  # noqa: E402


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def compare(name: str, again: Callable[[], object], kept: Callable[[], object], rounds: int) -> None:
    again(), kept()  # imports and first-use caches on both sides
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(again))
        b.append(timed(kept))
    first, second = statistics.median(a), statistics.median(b)
    print(f"{name:48s} again {first:7.3f} s   kept {second:7.3f} s   ratio {second / first:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, boto3 {boto3.__version__}; {args.rounds} alternating rounds")

    uri = parse_store_uri("s3://bench-bucket/repeat")
    endpoint = "http://127.0.0.1:9"  # never contacted: opening a store sends nothing
    compare("open an S3 store",
            lambda: S3Store(uri, endpoint_url=endpoint, region="us-east-1",
                            session=boto3.session.Session(region_name="us-east-1")),
            lambda: S3Store(uri, endpoint_url=endpoint, region="us-east-1"), args.rounds)

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "tokenizer"
        copy.mkdir()
        for name in tokenizer_content.SOURCE_FILES:
            if (args.artifact / name).is_file():
                shutil.copy2(args.artifact / name, copy / name)
        files = {name: tokenizer_content._read_if_present(copy / name)
                 for name in tokenizer_content.SOURCE_FILES}
        tokenizer_content.read_tokenizer_content(args.artifact)  # the first directory's read
        compare("read the same tokenizer from another directory",
                lambda: tokenizer_content._parse_tokenizer_content(copy, files).content_hash(),
                lambda: tokenizer_content.read_tokenizer_content(copy).content_hash(), args.rounds)

    for path in sorted((args.artifact / "programs").glob("*.pt2")):
        if path.name.endswith(".aoti.pt2"):
            continue
        data = path.read_bytes()

        def deserialize(data: bytes = data) -> object:
            with TORCH_STATE_LOCK, _schema_hints_kept():
                return torch.export.load(io.BytesIO(data)).module()

        def kept(data: bytes = data) -> object:
            with TORCH_STATE_LOCK, _schema_hints_kept():
                return _deserialized(data).module()

        compare(f"load {path.name} again", deserialize, kept, args.rounds)


if __name__ == "__main__":
    main()
