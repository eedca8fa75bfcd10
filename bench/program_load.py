"""Loading an exported program: torch's deserializer as it is, or with the schema's type hints kept alone,
against our loader's way (compile/cpu/export.py: the hints kept and each symbolic size parsed once), side
by side in one process.

    .venv/bin/python bench/program_load.py ARTIFACT_DIR [--rounds 5] [--against plain|hints]

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
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusedspec.compile.cpu.export import (  # noqa: E402
    TORCH_STATE_LOCK,
    _expressions_parsed_once,
    _schema_hints_kept,
)

WAYS = {"plain": (), "hints": (_schema_hints_kept,), "ours": (_schema_hints_kept, _expressions_parsed_once)}


def seconds(data: bytes, way: str) -> float:
    started = time.perf_counter()
    with TORCH_STATE_LOCK, ExitStack() as swaps:
        for swap in WAYS[way]:
            swaps.enter_context(swap())
        torch.export.load(io.BytesIO(data)).module()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", choices=("plain", "hints"), default="plain")
    args = parser.parse_args()
    programs = sorted((args.artifact / "programs").glob("*.pt2"))
    programs = [p for p in programs if not p.name.endswith(".aoti.pt2")]
    if not programs:
        raise SystemExit(f"{args.artifact}/programs holds no exported (.pt2) program")
    print(f"torch {torch.__version__}; {args.rounds} rounds each way, alternating")
    for path in programs:
        data = path.read_bytes()
        seconds(data, "plain")  # torch's imports and first-use caches
        other, ours = [], []
        for _ in range(args.rounds):
            other.append(seconds(data, args.against))
            ours.append(seconds(data, "ours"))
        a, b = statistics.median(other), statistics.median(ours)
        print(f"{path.name:28s} {args.against} {a:6.3f} s   ours {b:6.3f} s   ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
