"""The greedy gate's continuous-batching check: a batch-B artifact serves requests that arrive while
others decode, lines reused, as a server runs it, and every request must still get the target's greedy
tokens. The gate's own run goes through the batcher too, but all its prompts arrive at step 0, so a
request is admitted only when another finishes; here requests arrive at arbitrary steps of the others'
decoding, as on a server, which is where a context encoding that writes more than its own cache line
shows (`validate.staggered` says how).

    section = check_staggered(runner, reference, tolerance=0.5, alone=report.tokens)

The schedule: max(prompts, 3 x B) requests (every validation prompt at least once, and at least three
per line so lines are reused), arriving at seeded random steps (seed STAGGER_SEED: the same lines and
arrivals on every run). Each request's tokens are judged against the reference by the gate's rule
(`validate.divergence`); "tokens compared" counts the requests' tokens so checked, out of all they got:

    exact      equal to the reference's tokens
    near-tie   they first differ at a near-tie: counted and reported, not a failure. After it the request
               is on the artifact's own path, so its remaining tokens must equal the artifact's own output
               for that prompt run alone (the gate's first run) when that run took the same side of the
               tie; a difference there is a mismatch (batching changed the output). When the lone run
               took the other side, the tokens after the tie are counted as not compared.
    mismatch   any other difference: the check fails, and with it the gate.

A scheduled request the batcher never completed counts as a mismatch (a dropped request is not a pass
by omission). A run whose requests decoded but which has a coverage gap (`coverage_gaps`: no context
encoding while another request decoded, no line reused) fails too: it did not exercise what this check
exists for, so it cannot vouch for the artifact's batching.

Skipped, with the reason in the section, for batch 1 (no other line to overwrite) and for a runner
without a continuous batcher to drive (`Runner.continuous_batching`; the neuron runner's lines are
scheduled by NxDI in another process).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from fusedspec.compile.backend import Runner
from fusedspec.compile.documents.validation import StaggeredSection
from fusedspec.validate.divergence import first_divergence
from fusedspec.validate.reference import Reference
from fusedspec.validate.staggered import StaggeredResult, coverage_gaps, run_staggered, staggered_schedule

STAGGER_SEED = 14
REQUESTS_PER_LINE = 3


def check_staggered(runner: Runner, reference: Reference, *, tolerance: float,
                    alone: Mapping[str, Sequence[int]]) -> StaggeredSection:
    """Run the staggered schedule on `runner` and judge every request; `alone[prompt id]` is the
    artifact's output for that prompt run alone. The section's `passed` is False on any mismatch."""
    lines = runner.lines
    if lines < 2:
        return _skipped(f"batch {lines}: one cache line, so no request can overwrite another's")
    if not runner.continuous_batching:
        return _skipped(f"the {runner.description.backend} runner exposes no continuous batcher (batcher()), "
                        "so staggered arrivals cannot be driven from here; "
                        "check continuous batching on the serving stack")
    started = time.perf_counter()
    prompts = reference.prompts
    schedule = staggered_schedule(len(prompts), requests=max(len(prompts), REQUESTS_PER_LINE * lines),
                                  lines=lines, seed=STAGGER_SEED)
    run = run_staggered(runner.batcher(), [list(p.prompt_ids) for p in prompts], schedule,
                        reference.max_new_tokens, list(reference.eos_token_ids))
    counts = {"exact": 0, "near-tie": 0, "mismatch": 0}
    compared = generated = 0
    details: list[str] = []
    for result in run.results:
        verdict, n_compared, detail = _judge(result, reference, tolerance, alone)
        counts[verdict] += 1
        compared += n_compared
        generated += len(result.tokens)
        if detail:
            details.append(detail)
    finished = {r.request for r in run.results}
    for arrival in schedule:  # a request the batcher dropped got no tokens: never a pass by omission
        if arrival.request not in finished:
            counts["mismatch"] += 1
            details.append(f"request {arrival.request} ({prompts[arrival.prompt].id}, arriving at step "
                           f"{arrival.step}) never completed: the batcher dropped it")
    gaps = coverage_gaps(run)
    decoded = any(len(r.tokens) > 1 for r in run.results)
    if gaps and decoded:  # requests decoded, yet the run never showed what it exists to show
        details.append("the run did not exercise continuous batching (" + "; ".join(gaps) + "), so it cannot "
                       "vouch for the artifact's batching: a failure")
    passed = counts["mismatch"] == 0 and not (gaps and decoded)
    summary = (f"staggered batching {'passed' if passed else 'FAILED'}: {len(run.results)} of "
               f"{len(schedule)} requests completed over {lines} "
               f"lines (seed {STAGGER_SEED}, {run.steps} steps, {run.reused_lines} on reused lines, "
               f"{run.admitted_while_decoding} admitted while others decoded), {counts['exact']} exact, "
               f"{counts['near-tie']} near-tie(s), {counts['mismatch']} mismatch(es); tokens compared "
               f"{compared} of {generated}" + (f"; coverage gaps: {'; '.join(gaps)}" if gaps else ""))
    return StaggeredSection(
        ran=True, passed=passed, summary=summary, requests=len(schedule), lines=lines, seed=STAGGER_SEED,
        steps=run.steps, admitted_while_decoding=run.admitted_while_decoding, reused_lines=run.reused_lines,
        exact=counts["exact"], near_ties=counts["near-tie"], mismatches=counts["mismatch"],
        tokens_generated=generated, tokens_compared=compared, coverage_gaps=gaps, details=details,
        seconds=round(time.perf_counter() - started, 3))


def _judge(result: StaggeredResult, reference: Reference, tolerance: float,
           alone: Mapping[str, Sequence[int]]) -> tuple[str, int, str]:
    """(verdict, tokens compared, one line for the report or '') for one request."""
    ref = reference.prompts[result.prompt]
    got = result.tokens
    where = (f"request {result.request} ({ref.id}, line {result.line}, admitted at step "
             f"{result.admitted_step}, {result.others_decoding} other(s) decoding)")
    divergence = first_divergence(ref, got, tolerance=tolerance)
    if divergence is None:
        return "exact", len(got), ""
    p = divergence.position
    if not divergence.tie:
        return "mismatch", min(p + 1, len(got)), (
            f"{where} mismatch at new token {p}: reference {_token(divergence.expected)}, "
            f"got {_token(divergence.got)}")
    tie = (f"{where} near-tie at new token {p}: reference {_token(divergence.expected)}, got "
           f"{_token(divergence.got)} (gap {divergence.gap:.3g})")
    lone = list(alone.get(ref.id, ()))
    if lone[: p + 1] != list(got[: p + 1]):  # the lone run took the other side: nothing to hold the rest to
        return "near-tie", p + 1, f"{tie}; the {len(got) - p - 1} tokens after it not compared"
    if lone == list(got):
        return "near-tie", len(got), f"{tie}; after it equal to the artifact's own output run alone"
    after = next((i for i, (a, b) in enumerate(zip(lone, got, strict=False)) if a != b),
                 min(len(lone), len(got)))
    return "mismatch", min(after + 1, len(got)), (
        f"{tie}, then differs from the artifact's own output run alone at new token {after}: alone "
        f"{_token(lone[after] if after < len(lone) else None)}, got "
        f"{_token(got[after] if after < len(got) else None)}")


def _token(token: int | None) -> str:
    return "(output ended)" if token is None else str(token)


def _skipped(reason: str) -> StaggeredSection:
    return StaggeredSection(ran=False, passed=True, skipped=reason,
                            summary=f"staggered batching skipped: {reason}")
