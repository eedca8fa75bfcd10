"""Continuous batching over a loaded cpu artifact, with NxDI's semantics: a batch-B artifact holds B
cache lines; a request is admitted into a free line by a context encoding at batch 1 that writes only
that line; each step then runs over all B lines at once, every line accepting its own number of
tokens; a finished (or cancelled) request frees its line for the next one.

One object drives one runner from one thread (a server's engine loop, `CpuRunner.generate`, the
staggered schedule of validate/staggered.py); it is compile.backend.Batcher, reporting in that
module's StepReport, LineEvent and Completion:

    batcher = runner.batcher()                              # speculate=False: the target alone
    batcher.submit(prompt_ids, 64, request_id="a")          # checked now, queued (bounded by max_waiting)
    report = batcher.step()    # admits queued requests into free lines, then one step over every line
    for event in report.events:                             # first tokens, then the step's tokens
        send(event.request_id, event.tokens)                # event.completion: set when the request ended
    batcher.cancel("a")                                     # a client went away: its line is free again

The caches belong to the batcher that last claimed them: a second batcher (or `generate()`) on the same
runner takes them over, and the first one refuses every later call instead of decoding from caches
another one rewrote.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fusedspec.compile.backend import Completion, FinishReason, LineEvent, StepReport
from fusedspec.core.errors import PromptError


class CacheLines(Protocol):
    """What a batcher drives: the cpu runner's calls over its cache lines (runner.py)."""

    @property
    def lines(self) -> int: ...

    def require_programs(self, *, speculate: bool) -> None: ...

    def claim_caches(self, owner: object) -> None: ...

    def owns_caches(self, owner: object) -> bool: ...

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None: ...

    def target_eos(self) -> frozenset[int]: ...

    def compute_threads(self) -> AbstractContextManager[None]: ...

    def prefill(self, line: int, prompt: Sequence[int], *, speculate: bool = True) -> int: ...

    def fused_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def target_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class CapacityError(PromptError):
    """The batcher cannot take the request now (a server answers 429 and the client retries later)."""


class NoFreeLineError(CapacityError):
    """admit(): every cache line is decoding a request."""


class QueueFullError(CapacityError):
    """submit(): max_waiting requests are already queued."""


@dataclass(frozen=True)
class Request:
    """A checked request: its prompt fits the artifact and max_new_tokens fits its seq_len."""

    id: Hashable
    prompt: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: frozenset[int]


@dataclass
class _Line:
    """A request decoding in a cache line: `cur` is its last token (not yet in the caches) at `pos`."""

    request: Request
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    cur: int = 0
    pos: int = 0

    def complete(self, line: int, reason: FinishReason) -> Completion:
        return Completion(self.request.id, line, tuple(self.tokens), tuple(self.accepted), reason)


class ContinuousBatcher:
    """The cache lines of one runner, the requests in them and the queue waiting for them. One thread.

    speculate=False runs the target-alone programs (the artifact needs compile option target_alone):
    every step gives each line one token. max_waiting bounds the queue (None: unbounded)."""

    def __init__(self, runner: CacheLines, *, speculate: bool = True, max_waiting: int | None = None):
        runner.require_programs(speculate=speculate)
        if max_waiting is not None and (isinstance(max_waiting, bool) or not isinstance(max_waiting, int)
                                        or max_waiting < 0):
            raise PromptError(f"max_waiting={max_waiting!r} must be a non-negative integer or None "
                              "(unbounded)")
        self.runner, self.speculate, self.max_waiting = runner, speculate, max_waiting
        self.lines = runner.lines
        self._slots: list[_Line | None] = [None] * self.lines
        self._waiting: deque[Request] = deque()
        self._next_id = 0
        runner.claim_caches(self)

    # ---- what is in flight --------------------------------------------------------------------

    @property
    def free_lines(self) -> list[int]:
        return [line for line, slot in enumerate(self._slots) if slot is None]

    @property
    def active_lines(self) -> list[int]:
        return [line for line, slot in enumerate(self._slots) if slot is not None]

    @property
    def waiting(self) -> int:
        """Queue depth: requests submitted and not yet admitted."""
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing decoding and nothing queued."""
        return not self._waiting and not self.active_lines

    def line_of(self, request_id: Hashable) -> int | None:
        """The line decoding this request; None when it is waiting, finished or unknown."""
        return next((line for line, slot in enumerate(self._slots)
                     if slot is not None and slot.request.id == request_id), None)

    # ---- requests in ----------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int,
               eos_token_ids: Sequence[int] | None = None, *, request_id: Hashable | None = None) -> Hashable:
        """Check a request and queue it; the next `step()` admits it when a line is free (FIFO).

        eos_token_ids None: the target's own EOS ids; [] : none (only max_new_tokens ends it).
        request_id None: a fresh integer. Returns the id. Raises PromptError for a request the artifact
        cannot run or an id already in flight, QueueFullError when max_waiting requests wait."""
        self._check_owner()
        request = self._request(prompt_ids, max_new_tokens, eos_token_ids, request_id)
        if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
            raise QueueFullError(f"the queue is full ({len(self._waiting)} waiting, "
                                 f"max_waiting={self.max_waiting}); retry when a line frees up")
        self._waiting.append(request)
        return request.id

    def admit(self, prompt_ids: Sequence[int], max_new_tokens: int,
              eos_token_ids: Sequence[int] | None = None, *, request_id: Hashable | None = None) -> LineEvent:
        """Check a request and run its context encoding now, into the lowest free line (ahead of any
        queued request); returns its first token. Raises NoFreeLineError when every line is busy."""
        self._check_owner()
        request = self._request(prompt_ids, max_new_tokens, eos_token_ids, request_id)
        free = self.free_lines
        if not free:
            raise NoFreeLineError(f"all {self.lines} cache lines of this batch-{self.lines} artifact are "
                                  "decoding; submit() the request to queue it, or release a line first")
        with self.runner.compute_threads():
            return self._prefill(free[0], request)

    def cancel(self, request_id: Hashable) -> Completion:
        """End a request wherever it is (a client went away): a waiting one leaves the queue, a decoding
        one frees its line. Returns what it had produced, reason 'cancelled'."""
        self._check_owner()
        line = self.line_of(request_id)
        if line is not None:
            return self.release(line)
        for request in self._waiting:
            if request.id == request_id:
                self._waiting.remove(request)
                return Completion(request.id, None, (), (), "cancelled")
        raise PromptError(f"request {request_id!r} is neither waiting nor decoding (finished, cancelled or "
                          "never submitted); nothing to cancel")

    def release(self, line: int) -> Completion:
        """Free a decoding line now (its request is cancelled); the next admission may reuse it."""
        self._check_owner()
        if isinstance(line, bool) or not isinstance(line, int) or not 0 <= line < self.lines:
            raise PromptError(f"line {line!r} is not a cache line of this artifact (0..{self.lines - 1})")
        slot = self._slots[line]
        if slot is None:
            raise PromptError(f"line {line} is not decoding a request (it is free); nothing to release")
        self._slots[line] = None
        return slot.complete(line, "cancelled")

    # ---- the engine -----------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Admit queued requests into free lines (one batch-1 context encoding each), then run one step
        over all B lines if any is decoding. Free lines ride along at position 0, writing only their own
        line, which the next admission rewrites."""
        self._check_owner()
        admitted: list[LineEvent] = []
        prefill_s = step_s = 0.0
        decoded: list[LineEvent] = []
        with self.runner.compute_threads():
            started = time.perf_counter()
            while self._waiting and self.free_lines:
                admitted.append(self._prefill(self.free_lines[0], self._waiting.popleft()))
            prefill_s = time.perf_counter() - started
            if self.active_lines:
                started = time.perf_counter()
                greedy, accepted = self._run_step()
                step_s = time.perf_counter() - started
                decoded = [self._advance(line, greedy[line], accepted[line]) for line in self.active_lines]
        return StepReport(admitted=tuple(admitted), decoded=tuple(decoded), prefill_s=prefill_s,
                          step_s=step_s, active=len(self.active_lines), waiting=len(self._waiting))

    def _prefill(self, line: int, request: Request) -> LineEvent:
        first = self.runner.prefill(line, request.prompt, speculate=self.speculate)
        slot = _Line(request, [first], cur=first, pos=len(request.prompt))
        reason = self._finished(slot)
        if reason is not None:  # ended at its first token: the line never decodes
            return LineEvent(request.id, line, (first,), prefill=True, completion=slot.complete(line, reason))
        self._slots[line] = slot
        return LineEvent(request.id, line, (first,), prefill=True)

    def _run_step(self) -> tuple[list[list[int]], list[int]]:
        """One step over every line: per line the greedy tokens [k] (1 for the target alone) and how
        many of them the line accepts."""
        cur = torch.zeros(self.lines, dtype=torch.int64)  # [B]
        pos = torch.zeros(self.lines, dtype=torch.int64)  # [B]; free lines at 0
        for line, slot in enumerate(self._slots):
            if slot is not None:
                cur[line], pos[line] = slot.cur, slot.pos
        step = self.runner.fused_step if self.speculate else self.runner.target_step
        with torch.no_grad():
            greedy, accepted = step(cur, pos)  # [B, k], [B]
        return greedy.tolist(), accepted.tolist()

    def _advance(self, line: int, greedy: list[int], accepted: int) -> LineEvent:
        slot = self._slots[line]
        assert slot is not None
        request = slot.request
        new = greedy[:accepted][: request.max_new_tokens - len(slot.tokens)]
        for j, token in enumerate(new):
            if token in request.eos_token_ids:
                new = new[: j + 1]
                break
        slot.tokens += new
        slot.accepted.append(len(new))
        slot.cur, slot.pos = greedy[accepted - 1], slot.pos + accepted
        reason = self._finished(slot)
        if reason is None:
            return LineEvent(request.id, line, tuple(new), prefill=False)
        self._slots[line] = None
        return LineEvent(request.id, line, tuple(new), prefill=False, completion=slot.complete(line, reason))

    @staticmethod
    def _finished(slot: _Line) -> FinishReason | None:
        if slot.tokens[-1] in slot.request.eos_token_ids:
            return "eos"
        if len(slot.tokens) >= slot.request.max_new_tokens:
            return "length"
        return None

    # ---- checks ---------------------------------------------------------------------------------

    def _request(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] | None,
                 request_id: Hashable | None) -> Request:
        self.runner.check_prompt(prompt_ids, max_new_tokens)
        in_flight = ({r.id for r in self._waiting}
                     | {slot.request.id for slot in self._slots if slot is not None})
        if request_id in in_flight:
            raise PromptError(f"request id {request_id!r} is already in flight; ids must be unique among "
                              "waiting and decoding requests")
        while request_id is None or request_id in in_flight:  # a fresh id, never one a caller chose
            request_id, self._next_id = f"request-{self._next_id}", self._next_id + 1
        eos = self.runner.target_eos() if eos_token_ids is None else frozenset(int(t) for t in eos_token_ids)
        return Request(request_id, tuple(int(t) for t in prompt_ids), max_new_tokens, eos)

    def _check_owner(self) -> None:
        if not self.runner.owns_caches(self):
            raise PromptError("this batcher's cache lines were taken over by another batcher or generate() "
                              "on the same runner, so what it was decoding is gone; use one batcher per "
                              "runner")
