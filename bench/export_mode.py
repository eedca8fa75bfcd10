"""Export time of the cpu programs: what compile does (non-strict, no stack traces recorded) against
torch.export strict (dynamo), or against non-strict recording a stack trace per node (`--against traces`).

    .venv/bin/python bench/export_mode.py [--against strict|traces] [--models tiny,0.5b] [--rounds 3]

Per pair, tp and program: the median seconds of `torch.export.export` over --rounds, the two ways
alternating in one process so a busy host skews both alike, their ratio, and whether the two exported
graphs are the same (their printed code, with node names as export gives them). The tiny pair is the
tests' (2-layer target, its perturbed copy as draft); 0.5b is the real Qwen2.5-Coder-0.5B cut to 4 layers
with its 2-layer cut as draft (tests/fixtures/real_models.py), when the work dir has them. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fusedspec.compile.cpu import export  # noqa: E402
from fusedspec.compile.cpu.checkpoint import load_checkpoint  # noqa: E402
from fusedspec.compile.cpu.layout import ROLES  # noqa: E402
from fusedspec.compile.cpu.model import Decoder, Weights  # noqa: E402
from fusedspec.compile.cpu.sharding import ShardPlan, shard_model  # noqa: E402
from fusedspec.compile.modelconfig import read_model_config  # noqa: E402
from fusedspec.core.settings import load_settings  # noqa: E402

K, SEQ_LEN = 4, 64


def pairs(names: list[str]) -> list[tuple[str, Path, Path]]:
    work = load_settings().work_dir
    known = {"tiny": (work / "test-fixtures" / "tiny-target",
                      work / "test-fixtures" / "tiny-draft-perturbed"),
             "0.5b": (work / "real-models" / "qwen2.5-coder-0.5b-cut4",
                      work / "real-models" / "qwen2.5-coder-0.5b-cut2")}
    found = []
    for name in names:
        target, draft = known[name]
        if not (target / "config.json").is_file() or not (draft / "config.json").is_file():
            print(f"{name}: {target} or {draft} is not made yet (run the tests once); skipped")
            continue
        found.append((name, target, draft))
    return found


def decoders(target_dir: Path, draft_dir: Path, tp: int) -> tuple[Decoder, Decoder, Weights]:
    weights: Weights = {}
    made = []
    for path, role in ((target_dir, "target"), (draft_dir, "draft")):
        arch = read_model_config(path).arch
        decoder = Decoder(arch, ShardPlan.for_arch(arch, tp), ROLES[role])
        full = load_checkpoint(path, torch.float32, arch)
        weights |= {decoder.prefix + n: w for n, w in shard_model(full, decoder.plan).items()}
        made.append(decoder)
    return made[0], made[1], weights


def timed_export(name: str, target: Decoder, draft: Decoder, weights: Weights,
                 way: str) -> tuple[float, str]:
    module = export.program_module(name, target, draft, K)
    args = export.example_inputs(name, target, draft, weights, batch=1, context_len=SEQ_LEN,
                                 cache_len=SEQ_LEN + K, dtype=torch.float32, k=K)
    shapes = export.dynamic_shapes(name, args, SEQ_LEN)
    traces = contextlib.nullcontext() if way in ("strict", "traces") else export._no_stack_traces()
    started = time.perf_counter()
    with torch.no_grad(), traces:
        torch._dynamo.reset()
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=way == "strict")
    seconds = time.perf_counter() - started
    # the graph's code without comments: recorded stack traces are printed as comments above the nodes
    return seconds, "\n".join(line for line in program.graph_module.code.splitlines()
                              if not line.lstrip().startswith("#"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", choices=("strict", "traces"), default="strict")
    parser.add_argument("--models", default="tiny,0.5b")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, k {K}, seq_len {SEQ_LEN}, float32, median of {args.rounds} rounds\n")
    other = args.against
    print(f"| pair | tp | program | {other} s | compile's s | compile's / {other} | same graph |")
    print("|---|---|---|---|---|---|---|")
    for pair, target_dir, draft_dir in pairs(args.models.split(",")):
        for tp in (int(t) for t in args.tp.split(",")):
            target, draft, weights = decoders(target_dir, draft_dir, tp)
            for name in export.PROGRAMS:
                times: dict[str, list[float]] = {other: [], "compile": []}
                code: dict[str, str] = {}
                for _ in range(args.rounds):
                    for way in times:
                        seconds, code[way] = timed_export(name, target, draft, weights, way)
                        times[way].append(seconds)
                other_s, ours_s = statistics.median(times[other]), statistics.median(times["compile"])
                print(f"| {pair} | {tp} | {name} | {other_s:.2f} | {ours_s:.2f} | {ours_s / other_s:.2f} "
                      f"| {'yes' if code[other] == code['compile'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
