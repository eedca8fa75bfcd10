"""Staggered arrivals: the schedule that shows whether a batch-B artifact serves requests correctly
while others decode, as a server runs it (continuous batching).

Requests arrive at different steps, each takes whichever cache line is free, and lines are reused by
later requests; every request's tokens must still equal the target's greedy tokens for its prompt. The
bug class this catches is a context encoding that writes more than its own line (NxDI without
`is_continuous_batching`): it overwrites the caches of the requests already decoding. Running one
prompt at a time, or a batch whose prompts are all prefilled before the first step, cannot show it.

    schedule = staggered_schedule(len(prompts), requests=12, lines=4, seed=0)
    run = run_staggered(runner.batcher(), prompts, schedule, max_new_tokens=32)
    problems = mismatches(run, expected)     # expected[p]: the target's greedy tokens for prompt p
    gaps = coverage_gaps(run)                # why the run did not exercise the bug class, if it did not

Everything is deterministic for a seed: the arrival steps, which prompt each request carries, and so
(with a deterministic runner) which line each request gets.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from fusedspec.compile.backend import Batcher, Generation
from fusedspec.core.errors import PromptError


@dataclass(frozen=True)
class Arrival:
    """Request `request` (numbered in arrival order) is submitted at the start of schedule step `step`
    and carries prompt `prompt` (an index into the prompt list)."""

    request: int
    step: int
    prompt: int


def staggered_schedule(n_prompts: int, *, requests: int, lines: int, seed: int,
                       spread: int | None = None) -> list[Arrival]:
    """`requests` arrivals at seeded random steps in 0..spread-1 (default 2 x requests, so with more
    requests than lines some arrive while every line is busy and wait, and lines are reused).

    The first request arrives alone at step 0 and every other one later, so their context encodings
    can run while earlier requests decode (`coverage_gaps` says whether they did). Prompts are dealt in
    seeded shuffled rounds: every prompt is used before any is used twice."""
    if n_prompts < 1 or requests < 1 or lines < 1:
        raise PromptError(f"a staggered schedule needs at least one prompt, request and line "
                          f"(got {n_prompts} prompts, {requests} requests, {lines} lines)")
    spread = 2 * requests if spread is None else spread
    if spread < 2:
        raise PromptError(f"spread={spread} leaves no room to stagger arrivals; use at least 2 steps")
    rng = random.Random(seed)
    steps = [0] + sorted(rng.randrange(1, spread) for _ in range(requests - 1))
    prompts: list[int] = []
    while len(prompts) < requests:
        round_ = list(range(n_prompts))
        rng.shuffle(round_)
        prompts += round_
    return [Arrival(request=r, step=step, prompt=prompts[r]) for r, step in enumerate(steps)]


@dataclass(frozen=True)
class StaggeredResult:
    """One request of the run: where and when it ran, and what it produced."""

    request: int
    prompt: int
    arrival_step: int
    admitted_step: int
    line: int
    tokens: list[int]
    accepted: list[int]  # tokens each step gave it (the first token, from context encoding, excluded)
    reason: str  # "eos" | "length"
    reused_line: bool  # its line had served an earlier request
    others_decoding: int  # other requests in lines when its context encoding ran


@dataclass
class StaggeredRun:
    lines: int
    max_new_tokens: int
    steps: int  # schedule steps run (a step with nothing to decode still counts)
    results: list[StaggeredResult] = field(default_factory=list)  # by request number

    @property
    def admitted_while_decoding(self) -> int:
        """Context encodings that ran while another request held a line: the moments the bug shows."""
        return sum(r.others_decoding > 0 for r in self.results)

    @property
    def reused_lines(self) -> int:
        return sum(r.reused_line for r in self.results)

    def generation(self) -> Generation:
        """The requests' tokens and accepted-per-step in request order (compile.backend.Generation)."""
        return Generation(tokens=[list(r.tokens) for r in self.results],
                          accepted=[list(r.accepted) for r in self.results])


def run_staggered(batcher: Batcher, prompts: Sequence[Sequence[int]], schedule: Sequence[Arrival],
                  max_new_tokens: int, eos_token_ids: Sequence[int] | None = None) -> StaggeredRun:
    """Drive `batcher` through the schedule: at each step, submit what arrives, then one batcher step
    (admissions into free lines, then one step over all lines). Returns every request's tokens."""
    if not schedule:
        raise PromptError("the schedule has no arrivals")
    bad = sorted({a.prompt for a in schedule if not 0 <= a.prompt < len(prompts)})
    if bad:
        raise PromptError(f"the schedule uses prompt index {bad[0]} "
                          f"but only {len(prompts)} prompts were given")
    if not batcher.idle:
        raise PromptError("the batcher is already decoding or holding requests; start from an idle one")
    pending = deque(sorted(schedule, key=lambda a: (a.step, a.request)))
    arrivals: dict[Hashable, Arrival] = {a.request: a for a in schedule}
    admitted: dict[Hashable, tuple[int, int, bool, int]] = {}  # request -> step, line, reused, others
    used: set[int] = set()
    run = StaggeredRun(lines=batcher.lines, max_new_tokens=max_new_tokens, steps=0)
    done: dict[int, StaggeredResult] = {}
    while pending or not batcher.idle:
        while pending and pending[0].step <= run.steps:
            arrival = pending.popleft()
            batcher.submit(prompts[arrival.prompt], max_new_tokens, eos_token_ids, request_id=arrival.request)
        busy = set(batcher.active_lines)
        report = batcher.step()
        for event in report.admitted:
            admitted[event.request_id] = (run.steps, event.line, event.line in used, len(busy))
            used.add(event.line)
            if event.completion is None:  # the next admission of this call runs while this one holds its line
                busy.add(event.line)
        for completion in report.completions:
            step, line, reused, others = admitted[completion.request_id]
            arrival = arrivals[completion.request_id]
            done[arrival.request] = StaggeredResult(
                request=arrival.request, prompt=arrival.prompt, arrival_step=arrival.step, admitted_step=step,
                line=line, tokens=list(completion.tokens), accepted=list(completion.accepted),
                reason=completion.reason, reused_line=reused, others_decoding=others)
        run.steps += 1
    run.results = [done[r] for r in sorted(done)]
    return run


@dataclass(frozen=True)
class StaggeredMismatch:
    """The first difference between one request's tokens and the expected tokens of its prompt."""

    request: int
    prompt: int
    line: int
    admitted_step: int
    position: int  # 0-based among the new tokens
    expected: int | None  # None: the expected output had ended
    got: int | None  # None: the request's output had ended

    def describe(self) -> str:
        def token(tid: int | None) -> str:
            return "(output ended)" if tid is None else str(tid)

        return (f"request {self.request} (prompt {self.prompt}, line {self.line}, admitted at step "
                f"{self.admitted_step}) differs at new token {self.position}: expected "
                f"{token(self.expected)}, got {token(self.got)}")


def mismatches(run: StaggeredRun, expected: Sequence[Sequence[int]]) -> list[StaggeredMismatch]:
    """Every request whose tokens differ from expected[its prompt] (same max_new_tokens and EOS ids).

    expected may be the target's greedy reference or the artifact's own output for each prompt run
    alone; where the reference and the artifact part at a tolerated near-tie, compare with the latter."""
    found = []
    for result in run.results:
        want, got = list(expected[result.prompt]), result.tokens
        if want == got:
            continue
        position = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                        min(len(want), len(got)))
        found.append(StaggeredMismatch(
            request=result.request, prompt=result.prompt, line=result.line,
            admitted_step=result.admitted_step, position=position,
            expected=want[position] if position < len(want) else None,
            got=got[position] if position < len(got) else None))
    return found


def coverage_gaps(run: StaggeredRun) -> list[str]:
    """Why this run could not catch a context encoding that writes other lines (empty when it could)."""
    if run.lines < 2:
        return [f"the artifact has {run.lines} cache line: there is no other line to overwrite"]
    gaps = []
    if not run.admitted_while_decoding:
        gaps.append("no context encoding ran while another request was decoding")
    if not run.reused_lines:
        gaps.append("no line was reused by a later request")
    return gaps
