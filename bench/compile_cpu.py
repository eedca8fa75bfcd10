"""Compile time and artifact size of the cpu backend, plain torch.export against AOTInductor, side by side.

    .venv/bin/python bench/compile_cpu.py [--models tiny,0.5b] [--packaging export,aoti] [--steps 16]

Per config: compile seconds (checkpoint read + shard + export/package, what `fusedspec compile` pays),
artifact size (weights, programs), load seconds, and the median fused-step time over short greedy
generations, the packagings of one pair timed alternately in one process so a busy host skews them
alike (run time is what AOTInductor is for). Builds go to a fresh directory under the work dir and are
deleted afterwards. Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedspec.compile.backend import get_backend  # noqa: E402
from fusedspec.compile.build import build_artifact  # noqa: E402
from fusedspec.compile.spec import BuildSpec  # noqa: E402
from fusedspec.core.settings import Settings, load_settings  # noqa: E402
from fusedspec.registry.hub import resolve_model  # noqa: E402

PROMPT = [9707, 1879, 11, 358, 1079, 264, 1273, 13]  # "Hello world, I am a test." in the Qwen vocabulary


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    draft: Path
    spec: BuildSpec


def tiny_pair(settings: Settings) -> Pair:
    from fusedspec.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir

    root = settings.work_dir / "test-fixtures"  # the same cache the tests use
    target = make_tiny_qwen3(root / "tiny-target", qwen3_tokenizer_dir(root), seed=1)
    draft = derive_draft(target, root / "tiny-draft-cut", keep_layers=1)
    return Pair("tiny qwen3 2L / 1L", target, draft, BuildSpec(2, 128, 4, 1, "float32"))


def coder_pair(settings: Settings) -> Pair:
    from fusedspec.demo.models import derive_draft
    from tests.support.pypi_models import real_model_dir

    root = settings.work_dir / "real-models"  # the same cache the slow tests use
    target = real_model_dir("qwen2.5-coder-0.5b", root)
    draft = derive_draft(target, root / "qwen2.5-coder-0.5b-cut8", keep_layers=8)
    return Pair("qwen2.5-coder-0.5b / cut8", target, draft, BuildSpec(2, 64, 4, 1, "float32"))


PAIRS = {"tiny": tiny_pair, "0.5b": coder_pair}


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def build(pair: Pair, aot: bool, work: Settings) -> tuple[Path, float]:
    target, draft = resolve_model(str(pair.target), work), resolve_model(str(pair.draft), work)
    started = time.perf_counter()
    artifact = build_artifact(pair.spec, target, draft, work, options={"aot_inductor": aot}).path
    return artifact, time.perf_counter() - started


def measure_pair(pair: Pair, packagings: list[str], settings: Settings, steps: int,
                 rounds: int) -> list[dict[str, str]]:
    """Build each packaging of one pair, then time their generations alternately (same host load)."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-compile-", dir=settings.work_dir))
    try:
        work = Settings(work_dir=scratch)
        built = {p: build(pair, p == "aoti", work) for p in packagings}
        runners, load_s = {}, {}
        for packaging, (artifact, _) in built.items():
            started = time.perf_counter()
            runners[packaging] = get_backend("cpu").load(artifact)
            load_s[packaging] = time.perf_counter() - started
        step_ms: dict[str, list[float]] = {p: [] for p in packagings}
        for _ in range(rounds):
            for packaging, runner in runners.items():
                gen = runner.generate([PROMPT], steps + 1)
                step_ms[packaging].append(1000 * gen.timings["decode_steps_s"]
                                          / max(gen.timings["decode_steps"], 1))
        baseline = statistics.median(step_ms[packagings[0]])
        rows = []
        for packaging, (artifact, compile_s) in built.items():
            median = statistics.median(step_ms[packaging])
            rows.append({
                "pair": pair.name, "spec": pair.spec.slug, "packaging": packaging,
                "compile s": f"{compile_s:.1f}", "artifact MiB": f"{mib(artifact):.1f}",
                "programs MiB": f"{mib(artifact / 'programs'):.2f}", "load s": f"{load_s[packaging]:.1f}",
                "ms/step": f"{median:.1f}", f"vs {packagings[0]}": f"{median / baseline:.2f}x",
            })
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def print_table(rows: list[dict[str, str]]) -> None:
    header = list(rows[0])
    widths = [max(len(h), *(len(r[h]) for r in rows)) for h in header]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(row[h].ljust(w) for h, w in zip(header, widths, strict=True)) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,0.5b", help=f"comma list of {', '.join(PAIRS)}")
    parser.add_argument("--packaging", default="export,aoti", help="comma list of export, aoti")
    parser.add_argument("--steps", type=int, default=16, help="new tokens after the first, for ms/step")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed generations per packaging")
    args = parser.parse_args()
    settings = load_settings()
    rows = []
    for model in args.models.split(","):
        rows += measure_pair(PAIRS[model](settings), args.packaging.split(","), settings, args.steps,
                             args.rounds)
        print(f"done: {model}", file=sys.stderr, flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
