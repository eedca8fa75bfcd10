"""`fusedspec advise --target A --draft B`: acceptance per prompt class, predicted speedup per k, plot.

Orchestration only: resolve and download both models, gate their tokenizers, render the prompt set
with the target's tokenizer, then `validate.advice.advise_pair` does the work (see its cost model).
Exit 0 with advice, 1 when the tokenizers differ, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fusedspec.compile.runconfig import DEFAULT_MAX_NEW_TOKENS, check_option
from fusedspec.compile.spec import canonical_dtype
from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model: hf://ORG/NAME[@REV] or a local directory")
    parser.add_argument("--draft", required=True, help="draft model: hf://ORG/NAME[@REV] or a local directory")
    parser.add_argument("--prompts", default="default", help="prompt file (.jsonl or .yaml) or 'default'")
    parser.add_argument("--variants", default="raw,chat", help="prompt variants to run: raw, chat or raw,chat")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"greedy tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--k-range", default="2..16", help="k values: LO..HI or a comma list (default 2..16)")
    parser.add_argument("--cost-ratio", type=float, default=None,
                        help="t_draft/t_target per decode step; default: transformers forwards on this host")
    parser.add_argument("--step-times", type=Path, default=None,
                        help="recorded step times (JSON: where, k, target_step_s, fused_step_s[, verify_step_s]), "
                             "e.g. from the device the artifact will serve on; c and b are computed from them")
    parser.add_argument("--verify-slope", type=float, default=0.0,
                        help="extra cost per verified position, in target steps (0: memory-bound, as on "
                             "Trainium; use the measured value to model CPU serving)")
    parser.add_argument("--dtype", default="float32", help="dtype for the reference and the forward passes")
    parser.add_argument("--plot", type=Path, default=None, help="write speedup-vs-k curves to this PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imports here: `fusedspec advise --help` must not pay for torch.
    from fusedspec.registry.download import download_model
    from fusedspec.registry.hub import resolve_model
    from fusedspec.validate.acceptance import parse_k_range
    from fusedspec.validate.advice import advise_pair, format_table, plot_advice
    from fusedspec.validate.prompts import VARIANTS, load_prompt_set, load_tokenizer, render_prompts
    from fusedspec.validate.step_costs import read_step_times
    from fusedspec.validate.tokenizers import check_tokenizers

    ks = parse_k_range(args.k_range)
    dtype = canonical_dtype(args.dtype)
    check_option("--max-new-tokens", args.max_new_tokens, "max_new_tokens")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise ConfigError(f"--plot {args.plot}: the plot is a PNG; give a file name ending in .png")
    check_option("--cost-ratio", args.cost_ratio, "cost_ratio")
    if args.step_times is not None and args.cost_ratio is not None:
        raise ConfigError("--step-times and --cost-ratio both set c: give one")
    step_times = read_step_times(args.step_times) if args.step_times is not None else None
    if args.verify_slope < 0:
        raise ConfigError(f"--verify-slope {args.verify_slope} must not be negative")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ConfigError(f"--variants {args.variants!r}: variant {unknown[0] if unknown else ''!r} is not one "
                          f"of {', '.join(VARIANTS)}")
    prompt_set = load_prompt_set(args.prompts)

    target = resolve_model(args.target, settings)
    draft = resolve_model(args.draft, settings)
    target_dir, draft_dir = download_model(target, settings), download_model(draft, settings)
    check_tokenizers(target_dir, draft_dir)
    rendered = render_prompts(prompt_set, load_tokenizer(target_dir), variants)

    result = advise_pair(target_dir, draft_dir, target.identity(), rendered, max_new_tokens=args.max_new_tokens,
                         dtype=dtype, cache_dir=settings.cache_dir, ks=ks, cost_ratio=args.cost_ratio,
                         verify_slope=args.verify_slope, step_times=step_times)
    if args.plot is not None:
        plot_advice(result.advice, args.plot,
                    title=f"Predicted speedup vs k: {target.ref.slug} + draft {draft.ref.slug}")
    if args.json:
        doc: dict[str, Any] = {"ok": True, "target": target.ref.text, "draft": draft.ref.text,
                               "prompts": {"source": prompt_set.source, "hash": prompt_set.hash,
                                           "variants": variants, "count": len(rendered)},
                               **result.to_json(), "plot": str(args.plot) if args.plot else None}
        print(json.dumps(doc, indent=2))
    else:
        print(f"target {target.ref.text}, draft {draft.ref.text}; {len(rendered)} prompts from "
              f"{prompt_set.source}, {args.max_new_tokens} tokens each, {dtype}")
        print(format_table(result.advice))
        if args.plot is not None:
            print(f"\nplot: {args.plot}")
    return 0
