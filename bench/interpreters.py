"""A part of the test suite under two builds of Python 3.11, alternating: what the Makefile's choice of the
venv's interpreter is worth.

    .venv/bin/python bench/interpreters.py VENV_A VENV_B [--rounds 3] [TEST ...]

VENV_A and VENV_B are two venvs holding this project (`PY -m venv V; V/bin/pip install -e '.[cpu,dev]'`,
one per interpreter). Each round runs the tests (default: the gate, the equivalence builds, two in-process
flow runs, publish and verify; about 5 minutes) under A, then under B, each in a fresh work dir with its own
servers and caches (torch's inductor cache, HF_HOME, PREFECT_HOME, TMPDIR under it, so no run finds what an
earlier one made), with `make test`'s pytest options. Printed: per run the wall time and the CPU the run
and the processes it waited for spent, then medians and B's over A's. Nothing is asserted; run it on a
quiet host.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_greedy.py", "tests/test_cpu_equivalence.py", "tests/test_staggered.py",
         "tests/test_flow.py::test_inprocess_run_publishes_verifiable_versions_and_reruns_do_nothing",
         "tests/test_flow.py::test_two_runs_started_together_compile_each_config_once",
         "tests/test_publish.py", "tests/test_verify.py"]


def run(venv: Path, tests: list[str], work: Path) -> tuple[float, float]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(work), "OMP_NUM_THREADS": "1", "TMPDIR": str(work / "tmp"),
           "HF_HOME": str(work / "hf-home"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
           "PREFECT_HOME": str(work / "prefect-home"), "MPLCONFIGDIR": str(work / "mpl")}
    (work / "tmp").mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
               "--dist", "loadfile", "--no-loadscope-reorder", *tests]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"{venv}: the tests failed\n{done.stdout[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv_a", type=Path)
    parser.add_argument("venv_b", type=Path)
    parser.add_argument("tests", nargs="*", default=TESTS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_intermixed_args()
    work = Path(os.environ.get("FUSEDSPEC_WORK_DIR", ROOT / ".work")) / "bench-interpreters"
    figures: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for round_ in range(args.rounds):
        for name, venv in (("A", args.venv_a), ("B", args.venv_b)):
            wall, cpu = run(venv, args.tests, work / name)
            figures[name].append((wall, cpu))
            print(f"round {round_ + 1} {name}: wall {wall:7.1f} s  cpu {cpu:7.1f} s", flush=True)
    wall_a, cpu_a = (statistics.median(f[i] for f in figures["A"]) for i in (0, 1))
    wall_b, cpu_b = (statistics.median(f[i] for f in figures["B"]) for i in (0, 1))
    print(f"medians  A: wall {wall_a:.1f} s cpu {cpu_a:.1f} s   B: wall {wall_b:.1f} s cpu {cpu_b:.1f} s")
    print(f"B / A    wall {wall_b / wall_a:.2f}  cpu {cpu_b / cpu_a:.2f}")


if __name__ == "__main__":
    main()
