"""Loading an exported program: torch's deserializer as it is, against the same load with the schema's type
hints kept (compile/cpu/export.py `_SchemaHints`), side by side in one process.

    .venv/bin/python bench/program_load.py ARTIFACT_DIR [--rounds 5]

ARTIFACT_DIR is a cpu build with exported programs (`.pt2`, not AOTInductor). Every program of it is loaded
`--rounds` times each way, alternating, from bytes already in memory (no disk read, no hashing): the
`load_program` path minus the trust checks. Medians per program and their ratio are printed; nothing is
asserted. The first load of each program is left out of the figures (it pays torch's imports).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusedspec.compile.cpu.export import TORCH_STATE_LOCK, _schema_hints_kept  # noqa: E402


def seconds(data: bytes, kept: bool) -> float:
    started = time.perf_counter()
    with TORCH_STATE_LOCK:
        if kept:
            with _schema_hints_kept():
                torch.export.load(io.BytesIO(data)).module()
        else:
            torch.export.load(io.BytesIO(data)).module()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    programs = sorted((args.artifact / "programs").glob("*.pt2"))
    programs = [p for p in programs if not p.name.endswith(".aoti.pt2")]
    if not programs:
        raise SystemExit(f"{args.artifact}/programs holds no exported (.pt2) program")
    print(f"torch {torch.__version__}; {args.rounds} rounds each way, alternating")
    for path in programs:
        data = path.read_bytes()
        seconds(data, False)  # torch's imports and first-use caches
        plain, kept = [], []
        for _ in range(args.rounds):
            plain.append(seconds(data, False))
            kept.append(seconds(data, True))
        a, b = statistics.median(plain), statistics.median(kept)
        print(f"{path.name:28s} as torch loads it {a:6.3f} s   hints kept {b:6.3f} s   ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
