"""`fusedspec advise --target A --draft B [--draft C ...]`: acceptance per prompt class, predicted speedup
per k, plot; with several drafts, every (draft, k) ranked per class and why the winner wins.

Orchestration only: resolve every model, gate each draft's tokenizer against the target's on their config
and tokenizer files (a draft that differs stops the command by name before any weights are downloaded:
the user asked for that draft, so leaving it out silently would rank fewer drafts than asked), download,
render the prompt set with the target's tokenizer, then `validate.advice.advise_pair` advises k per draft
(see its cost model) and `validate.draft_choice` ranks the drafts.
Exit 0 with advice, 1 when the tokenizers differ, 2 for bad input.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path
from typing import Any

from fusedspec.compile.runconfig import DEFAULT_MAX_NEW_TOKENS, check_option, top_limits_nothing
from fusedspec.compile.spec import canonical_dtype
from fusedspec.core.errors import ConfigError
from fusedspec.core.files import atomic_write
from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True,
                        help="target model: hf://ORG/NAME[@REV] or a local directory")
    parser.add_argument("--draft", required=True, action="append",
                        help="draft model: hf://ORG/NAME[@REV] or a local "
                             "directory; repeat to choose among drafts")
    parser.add_argument("--prompts", default="default", help="prompt file (.jsonl or .yaml) or 'default'")
    parser.add_argument("--variants", default="raw,chat",
                        help="prompt variants to run: raw, chat or raw,chat")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"greedy tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--k-range", default="2..16", help="k values: LO..HI or a comma list (default 2..16)")
    parser.add_argument("--cost-ratio", type=float, action="append", default=None,
                        help="t_draft/t_target per decode step, once per --draft in the same order; default: "
                             "transformers forwards on this host")
    parser.add_argument("--step-times", type=Path, default=None,
                        help="recorded step times (JSON: where, k, target_step_s, fused_step_s[, "
                             "verify_step_s]), e.g. from the device the artifact will serve on; c and b are "
                             "computed from them (one draft only)")
    parser.add_argument("--verify-slope", type=float, default=0.0,
                        help="extra cost per verified position, in target steps (0: memory-bound, as on "
                             "Trainium; use the measured value to model CPU serving)")
    parser.add_argument("--dtype", default="float32", help="dtype for the reference and the forward passes")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write speedup-vs-k curves to this PNG (several "
                             "drafts: one curve per draft per class)")
    parser.add_argument("--top-per-class", type=int, default=None, metavar="N",
                        help="also say which (draft, k) a run config with matrix.top_per_class N would "
                             "build: the first N of each prompt class")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imports here: `fusedspec advise --help` must not pay for torch.
    from fusedspec.flows.planning import same_model
    from fusedspec.registry.download import download_model, fetch_configs
    from fusedspec.registry.hub import resolve_model
    from fusedspec.validate.acceptance import parse_k_range
    from fusedspec.validate.advice import advise_pair, format_table, plot_advice
    from fusedspec.validate.draft_choice import format_ranking, plot_drafts, rank_drafts
    from fusedspec.validate.matrix_limit import first_per_class
    from fusedspec.validate.prompts import VARIANTS, load_prompt_set, load_tokenizer, render_prompts
    from fusedspec.validate.step_costs import read_step_times
    from fusedspec.validate.tokenizers import check_tokenizers

    ks = parse_k_range(args.k_range)
    refs: list[str] = args.draft
    dtype = canonical_dtype(args.dtype)
    check_option("--max-new-tokens", args.max_new_tokens, "max_new_tokens")
    if args.top_per_class is not None:
        check_option("--top-per-class", args.top_per_class, "top_per_class", section="matrix")
        if (problem := top_limits_nothing(args.top_per_class, len(refs), len(ks))) is not None:
            raise ConfigError(f"--top-per-class {problem}")
    check_plot_path(args.plot)
    if args.step_times is not None and len(refs) > 1:
        raise ConfigError("--step-times records one target+draft pair's steps, and they set c: with several "
                          "drafts give --cost-ratio once per --draft instead")
    cost_ratios: list[float | None] = list(args.cost_ratio) if args.cost_ratio else [None] * len(refs)
    if len(cost_ratios) != len(refs):
        raise ConfigError(f"--cost-ratio is given {_times(len(cost_ratios))} for {len(refs)} draft"
                          f"{'s' if len(refs) > 1 else ''}: give one per --draft, in the same order (each "
                          "draft has its own cost), or none to measure them")
    for ratio in cost_ratios:
        check_option("--cost-ratio", ratio, "cost_ratio")
    if args.step_times is not None and args.cost_ratio is not None:
        raise ConfigError("--step-times and --cost-ratio both set c: give one")
    step_times = read_step_times(args.step_times) if args.step_times is not None else None
    if not math.isfinite(args.verify_slope) or args.verify_slope < 0:  # NaN would make every speedup NaN
        raise ConfigError(f"--verify-slope {args.verify_slope} must be a finite number, not negative")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ConfigError(f"--variants {args.variants!r}: variant {unknown[0] if unknown else ''!r} is not "
                          f"one of {', '.join(VARIANTS)}")
    prompt_set = load_prompt_set(args.prompts)

    target = resolve_model(args.target, settings)
    drafts = [resolve_model(ref, settings) for ref in refs]
    seen = {same_model(target): f"the target {args.target}"}
    for ref, draft in zip(refs, drafts, strict=True):
        if (earlier := seen.get(same_model(draft))) is not None:
            raise ConfigError(f"--draft {ref} is {earlier} again (the same model at the same commit): name "
                              "each draft once, and none that is the target itself")
        seen[same_model(draft)] = f"--draft {ref}"
    target_configs = fetch_configs(target, settings)
    for draft in drafts:  # on config and tokenizer files: a draft that differs costs no weight download
        check_tokenizers(target_configs, fetch_configs(draft, settings), b_name=f"draft {draft.ref.text}")
    target_dir = download_model(target, settings)
    rendered = render_prompts(prompt_set, load_tokenizer(target_dir), variants)

    results = {}
    for draft, ratio in zip(drafts, cost_ratios, strict=True):
        results[draft.ref.text] = advise_pair(
            target_dir, download_model(draft, settings), target.identity(), rendered,
            max_new_tokens=args.max_new_tokens, dtype=dtype, cache_dir=settings.cache_dir, ks=ks,
            cost_ratio=ratio, verify_slope=args.verify_slope, step_times=step_times,
            draft_identity=draft.identity())
    records = {ref: result.advice.record() for ref, result in results.items()}
    ranking = rank_drafts(records) if len(drafts) > 1 else None
    kept = (first_per_class(ranking or rank_drafts(records), args.top_per_class) if args.top_per_class
            else None)
    if args.plot is not None:
        if ranking is None:
            plot_advice(results[refs[0]].advice, args.plot,
                        title=f"Predicted speedup vs k: {target.ref.slug} + draft {drafts[0].ref.slug}")
        else:
            buffer = io.BytesIO()
            plot_drafts(records, buffer, title=f"Predicted speedup vs k per draft: {target.ref.slug}")
            atomic_write(args.plot, buffer.getvalue())
    prompts = {"source": prompt_set.source, "hash": prompt_set.hash, "variants": variants,
               "count": len(rendered)}
    if args.json:
        doc: dict[str, Any] = {"ok": True, "target": target.ref.text, "prompts": prompts}
        if ranking is None:
            doc.update({"draft": refs[0], **results[refs[0]].to_json()})
        else:
            doc.update({"drafts": [{"draft": ref, **result.to_json()} for ref, result in results.items()],
                        "ranking": ranking.to_json()})
        if kept is not None:
            doc["top_per_class"] = {"n": args.top_per_class,
                                    "by_class": {cls: [{"draft": o.draft, "k": o.k, "speedup": o.speedup}
                                                       for o in options]
                                                 for cls, options in kept.items()},
                                    "builds": _builds(kept)}
        print(json.dumps({**doc, "plot": str(args.plot) if args.plot else None}, indent=2))
        return 0
    print(f"target {target.ref.text}, draft{'s' if len(refs) > 1 else ''} {', '.join(refs)}; {len(rendered)} "
          f"prompts from {prompt_set.source}, {args.max_new_tokens} tokens each, {dtype}")
    for ref, result in results.items():
        if ranking is not None:
            print(f"\n=== draft {ref}")
        print(format_table(result.advice))
    if ranking is not None:
        print("\n=== drafts and k ranked per class, by predicted decode speedup\n" + format_ranking(ranking))
    if kept is not None:
        print(f"\n=== matrix.top_per_class {args.top_per_class} would "
              f"build the first {args.top_per_class} of each class")
        print("\n".join(f"  [{cls}] " + ", ".join(f"{o.draft} k={o.k} {o.speedup:.2f}x" for o in options)
                        for cls, options in kept.items()))
        print("  builds: " + "; ".join(f"{draft} k={', '.join(map(str, ks))}"
                                       for draft, ks in _builds(kept).items()))
    if args.plot is not None:
        print(f"\nplot: {args.plot}")
    return 0


def _builds(kept: dict[str, list[Any]]) -> dict[str, list[int]]:
    """Each draft's ks that some class keeps, each once."""
    found: dict[str, set[int]] = {}
    for options in kept.values():
        for option in options:
            found.setdefault(option.draft, set()).add(option.k)
    return {draft: sorted(ks) for draft, ks in found.items()}


def check_plot_path(plot: Path | None) -> None:
    """Before any work: a plot that could not be written would fail the command after all of it."""
    if plot is None:
        return
    if plot.suffix.lower() != ".png":
        raise ConfigError(f"--plot {plot}: the plot is a PNG; give a file name ending in .png")
    if plot.is_dir():
        raise ConfigError(f"--plot {plot} is a directory: give a file name in it, e.g. {plot / 'advice.png'}")
    parent = next((p for p in plot.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"--plot {plot}: {parent} is a file, not a directory; write the plot elsewhere")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
