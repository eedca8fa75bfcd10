"""`fusedspec validate ARTIFACT`: greedy equivalence of one artifact against its target alone.

Orchestration only (`validate.greedy.validate_artifact` does the work). Prints tokens compared out of
tokens generated and, for batch > 1, the staggered (continuous batching) check or why it was skipped.
Exit 0 when the gate passed (near-ties are printed as warnings), 1 when it failed (a greedy mismatch,
or a staggered request that did not get the target's tokens; the report says where), 2 for bad input:
no artifact, an artifact without its tokenizer, a bad prompt file, a prompt longer than the artifact's
context. validation.json (and advice.png) are written into the artifact directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from fusedspec.compile.documents.validation import AdviceRecord
from fusedspec.compile.runconfig import DEFAULT_MAX_NEW_TOKENS, check_option
from fusedspec.core.errors import ConfigError, GreedyMismatchError
from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, metavar="ARTIFACT",
                        help="an artifact directory (with build.json)")
    parser.add_argument("--prompts", default="default", help="prompt file (.jsonl or .yaml) or 'default'")
    parser.add_argument("--variants", default="raw,chat",
                        help="prompt variants to run: raw, chat or raw,chat")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"greedy tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="near-tie tolerance on the reference's top-2 logit margin (default per dtype: "
                             "float32 1e-4, float16 0.03, bfloat16 0.5; inclusive: a gap of exactly the "
                             "tolerance is a tie)")
    parser.add_argument("--cost-ratio", type=float, default=None,
                        help="t_draft/t_target for the advice; default: measured on the artifact's own "
                             "programs (built with target_alone), else transformers forwards on this host "
                             "(the advice says which)")
    parser.add_argument("--step-times", type=Path, default=None,
                        help="step times recorded on the hardware this artifact serves on (JSON: where, k, "
                             "target_step_s, fused_step_s[, verify_step_s]; e.g. a Trainium host's); c and b "
                             "come from them")
    parser.add_argument("--no-advice", action="store_true",
                        help="skip the acceptance check and advice.png (greedy equivalence only)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def advice_text(advice: AdviceRecord) -> str:
    """The cost model and where it came from, then per class the k advised and, when the validation run
    measured it, the decode speedup at the built k: predicted, measured, their ratio."""
    from fusedspec.compile.documents.validation import ARTIFACT_PROGRAMS
    from fusedspec.validate.advice import format_decode

    model = advice.cost_model
    lines = [f"k advice cost model: c = {model.cost_ratio:.3f}, b = {model.verify_slope:.3f}: {model.source}"]
    decode = {row.cls: row for row in advice.decode}
    recorded = advice.step_times is not None and advice.step_times.where != ARTIFACT_PROGRAMS
    if not decode and recorded:
        lines.append("  decode speedup not measured: the step times were recorded on other hardware, which "
                     "this host's decode says nothing about")
    elif not decode:
        lines.append("  decode speedup not measured (the artifact "
                     "has no target-alone programs to compare with)")
    for cls in advice.classes:
        k = "do not speculate" if cls.recommended_k is None or not cls.pays_off else f"k={cls.recommended_k}"
        row = decode.get(cls.cls)
        lines.append(f"  {cls.cls:<10} {k:<16}"
                     + (f" at built k={row.k}: {format_decode(row)}" if row else ""))
    return "\n".join(lines)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from fusedspec.compile.backend import read_build_description
    from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
    from fusedspec.compile.workdir import in_use, validating
    from fusedspec.flows.artifact_models import artifact_model_dirs
    from fusedspec.registry.trust import directory_trust
    from fusedspec.validate.greedy import (
        CoverageWarning,
        NearTieWarning,
        StepsMismatchWarning,
        validate_artifact,
    )
    from fusedspec.validate.prompts import VARIANTS, load_prompt_set
    from fusedspec.validate.request import ValidationRequest
    from fusedspec.validate.step_costs import read_step_times

    check_option("--tolerance", args.tolerance, "near_tie_tolerance")
    check_option("--cost-ratio", args.cost_ratio, "cost_ratio")
    check_option("--max-new-tokens", args.max_new_tokens, "max_new_tokens")
    if args.step_times is not None and args.cost_ratio is not None:
        raise ConfigError("--step-times and --cost-ratio both set c: give one")
    if args.step_times is not None and args.no_advice:
        raise ConfigError("--step-times is for the k advice, which --no-advice skips: give one")
    step_times = read_step_times(args.step_times) if args.step_times is not None else None
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ConfigError(f"--variants {args.variants!r}: give raw, chat or raw,chat")
    prompt_set = load_prompt_set(args.prompts)
    description = read_build_description(args.artifact)
    artifact_tokenizer_hash(args.artifact)  # a tokenizer file that does not parse: exit 2 now, not mid-run
    # a build of this work dir, or a version's attempt directory under its (signed) manifest: native code
    # in anything else is refused before it loads (compile.trust)
    trust = directory_trust(args.artifact, settings)
    target_dir, draft_dir = artifact_model_dirs(description, settings)
    failure: GreedyMismatchError | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NearTieWarning)
        warnings.simplefilter("always", StepsMismatchWarning)
        warnings.simplefilter("always", CoverageWarning)
        try:
            # `gc --work-dir` leaves a build alone while it is validated
            with in_use(settings, args.artifact), validating(settings, args.artifact):
                result = validate_artifact(ValidationRequest(
                    args.artifact, description, target_dir, draft_dir, prompt_set,
                    max_new_tokens=args.max_new_tokens, near_tie_tolerance=args.tolerance,
                    cost_ratio=args.cost_ratio, variants=tuple(variants), advice=not args.no_advice,
                    step_times=step_times, trust=trust), settings)
        except GreedyMismatchError as exc:  # a failed check is reported below, then exit 1
            failure = exc
    for w in caught:
        if issubclass(w.category, NearTieWarning | StepsMismatchWarning | CoverageWarning):  # never silent
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if failure is not None:
        print(f"fusedspec validate: {failure}", file=sys.stderr)
        if args.json:
            report = failure.report.model_dump(mode="json") if hasattr(failure.report, "model_dump") else None
            print(json.dumps({"ok": False, "passed": False, "error": str(failure).splitlines()[0],
                              "report": report, "exit_code": failure.exit_code}, indent=2))
        return failure.exit_code
    if args.json:
        print(json.dumps({"ok": True, **result.document.model_dump(mode="json")}, indent=2))
    else:
        print(result.greedy.summary())
        print("tokens compared of generated, per prompt: " + ", ".join(
            f"{row.id} {row.tokens_compared}/{row.tokens_generated}"
            for row in result.document.greedy.prompts))
        if result.document.staggered is not None:
            print(result.document.staggered.summary)
            for detail in result.document.staggered.details:
                print(f"  - {detail}")
        steps = result.document.acceptance
        if steps:
            print(f"fused steps at k={steps.k}: measured == predicted for {steps.compared} prompts: "
                  f"{'yes' if steps.steps_match else 'NO (' + ', '.join(steps.differing) + ')'}")
        if result.document.advice is not None:
            print(advice_text(result.document.advice))
        print(f"wrote {args.artifact / 'validation.json'}")
    return 0
