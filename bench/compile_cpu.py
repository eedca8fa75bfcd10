"""Compile time and artifact size of the cpu backend, plain torch.export against AOTInductor, side by side.

    .venv/bin/python bench/compile_cpu.py [--models tiny,0.5b] [--packaging export,aoti] [--steps 16]

Per config: compile seconds (checkpoint read + shard + export/package, what `fusedspec compile` pays),
artifact size (weights, programs), load seconds in a fresh runner, and the mean fused-step time over a
short greedy generation (run time is what AOTInductor buys). Every build goes to a fresh directory
under the work dir and is deleted afterwards. Prints a table; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compile.backend import get_backend  # noqa: E402
from compile.build import build_artifact  # noqa: E402
from compile.settings import Settings, load_settings  # noqa: E402
from compile.spec import BuildSpec  # noqa: E402
from registry.hub import resolve_model  # noqa: E402

PROMPT = [9707, 1879, 11, 358, 1079, 264, 1273, 13]  # "Hello world, I am a test." in the Qwen vocabulary


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    draft: Path
    spec: BuildSpec


def tiny_pair(settings: Settings) -> Pair:
    from registry.demo_models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir

    root = settings.work_dir / "test-fixtures"  # the same cache the tests use
    target = make_tiny_qwen3(root / "tiny-target", qwen3_tokenizer_dir(root), seed=1)
    draft = derive_draft(target, root / "tiny-draft-cut", keep_layers=1)
    return Pair("tiny qwen3 2L / 1L", target, draft, BuildSpec(2, 128, 4, 1, "float32"))


def coder_pair(settings: Settings) -> Pair:
    from registry.demo_models import derive_draft
    from registry.pypi_models import real_model_dir

    root = settings.work_dir / "real-models"  # the same cache the slow tests use
    target = real_model_dir("qwen2.5-coder-0.5b", root)
    draft = derive_draft(target, root / "qwen2.5-coder-0.5b-cut8", keep_layers=8)
    return Pair("qwen2.5-coder-0.5b / cut8", target, draft, BuildSpec(2, 64, 4, 1, "float32"))


PAIRS = {"tiny": tiny_pair, "0.5b": coder_pair}


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def measure(pair: Pair, aot: bool, settings: Settings, steps: int) -> dict[str, str]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-compile-", dir=settings.work_dir))
    try:
        work = Settings(work_dir=scratch)
        target, draft = resolve_model(str(pair.target), work), resolve_model(str(pair.draft), work)
        started = time.perf_counter()
        artifact = build_artifact(pair.spec, target, draft, work, options={"aot_inductor": aot})
        compile_s = time.perf_counter() - started
        started = time.perf_counter()
        runner = get_backend("cpu").load(artifact)
        load_s = time.perf_counter() - started
        gen = runner.generate([PROMPT], steps + 1)
        step_ms = 1000 * gen.timings["fused_steps_s"] / max(gen.timings["fused_steps"], 1)
        return {
            "pair": pair.name, "spec": pair.spec.slug, "packaging": "aoti" if aot else "export",
            "compile s": f"{compile_s:.1f}", "artifact MiB": f"{mib(artifact):.1f}",
            "programs MiB": f"{mib(artifact / 'programs'):.2f}", "load s": f"{load_s:.1f}",
            "ms/step": f"{step_ms:.1f}", "steps": str(int(gen.timings["fused_steps"])),
        }
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
    args = parser.parse_args()
    settings = load_settings()
    rows = []
    for model in args.models.split(","):
        pair = PAIRS[model](settings)
        for packaging in args.packaging.split(","):
            rows.append(measure(pair, packaging == "aoti", settings, args.steps))
            print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
