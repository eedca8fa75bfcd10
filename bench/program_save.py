"""Saving an exported program: torch.export.save as it is, against the same save without the canonical
form torch makes and discards (compile/cpu/export.py `_unused_canonical_form_skipped`), side by side in one
process.

    .venv/bin/python bench/program_save.py ARTIFACT_DIR [--rounds 5]

ARTIFACT_DIR is a cpu build with exported programs (`.pt2`, not AOTInductor). Each program is loaded once,
then saved into memory `--rounds` times each way, alternating; the bytes of both ways are compared. Medians
per program and their ratio are printed; nothing is asserted.
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

from fusedspec.compile.cpu.export import TORCH_STATE_LOCK, _unused_canonical_form_skipped  # noqa: E402


def saved(program: torch.export.ExportedProgram, skip: bool) -> tuple[float, bytes]:
    buffer = io.BytesIO()
    started = time.perf_counter()
    with TORCH_STATE_LOCK:
        if skip:
            with _unused_canonical_form_skipped():
                torch.export.save(program, buffer)
        else:
            torch.export.save(program, buffer)
    return time.perf_counter() - started, buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    found = (args.artifact / "programs").glob("*.pt2")
    programs = sorted(p for p in found if not p.name.endswith(".aoti.pt2"))
    if not programs:
        raise SystemExit(f"{args.artifact}/programs holds no exported (.pt2) program")
    print(f"torch {torch.__version__}; {args.rounds} rounds each way, alternating")
    for path in programs:
        program = torch.export.load(io.BytesIO(path.read_bytes()))
        saved(program, False)  # first-use caches
        plain, skipped, same = [], [], True
        for _ in range(args.rounds):
            seconds, plain_bytes = saved(program, False)
            plain.append(seconds)
            seconds, skipped_bytes = saved(program, True)
            skipped.append(seconds)
            same = same and plain_bytes == skipped_bytes
        a, b = statistics.median(plain), statistics.median(skipped)
        print(f"{path.name:28s} as torch saves it {a:6.3f} s   check skipped {b:6.3f} s   ratio {b / a:.2f}"
              f"   same bytes: {same}")


if __name__ == "__main__":
    main()
