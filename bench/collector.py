"""`fusedspec validate` with CPython's default collector thresholds against fusedspec's (core/memory.py
`tune_collector`, run by the import of fusedspec.flows), alternating, each in a fresh process.

    .venv/bin/python bench/collector.py ARTIFACT_DIR [--rounds 3] [-- VALIDATE_ARGS...]

ARTIFACT_DIR is a cpu build; VALIDATE_ARGS go to `fusedspec validate` before it (default: `--max-new-tokens
8 --cost-ratio 0.1`). Per run: the process's CPU seconds, the seconds spent inside collections and their
count (gc.callbacks); then medians and tuned over default. Nothing is asserted; run it on a quiet host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Runs the CLI as `fusedspec validate` does, timing every collection; "default" keeps CPython's thresholds.
RUN = """
import gc, json, sys, time
import fusedspec.flows.cli as cli
if sys.argv[1] == "default":
    gc.set_threshold(700, 10, 10)
spent, started = [0.0, 0], [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        spent[0] += time.perf_counter() - started[0]
        spent[1] += 1
gc.callbacks.append(timed)
code = cli.main(["validate", *sys.argv[2:]])
print(json.dumps({"code": code, "cpu": time.process_time(), "gc": spent[0], "collections": spent[1]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("validate_args", nargs="*", default=["--max-new-tokens", "8", "--cost-ratio", "0.1"])
    args = parser.parse_intermixed_args()
    runs: dict[str, list[dict[str, float]]] = {"default": [], "tuned": []}
    for round_ in range(args.rounds):
        for way in runs:
            done = subprocess.run([sys.executable, "-c", RUN, way, *args.validate_args, str(args.artifact)],
                                  cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"validate failed ({way}):\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            runs[way].append(figures)
            print(f"round {round_ + 1} {way:7s}: cpu {figures['cpu']:6.2f} s  in collections "
                  f"{figures['gc']:5.2f} s ({figures['collections']} collections)", flush=True)
    medians = {way: {k: statistics.median(r[k] for r in rs) for k in ("cpu", "gc")}
               for way, rs in runs.items()}
    for way, m in medians.items():
        print(f"median {way:7s}: cpu {m['cpu']:.2f} s, in collections {m['gc']:.2f} s")
    print(f"tuned / default: cpu {medians['tuned']['cpu'] / medians['default']['cpu']:.2f}")


if __name__ == "__main__":
    main()
