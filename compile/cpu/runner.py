"""Load a cpu artifact and generate greedily with its programs (compile.backend.Runner).

Loading reads build.json, the rank weight files and the saved programs; nothing else (no original
checkpoint, no transformers). The runner owns the B cache lines of a batch-B artifact and exposes the
three calls continuous batching is made of (batching.py drives them): `prefill` one prompt into one
line, then `fused_step` (or `target_step`, plain greedy through the same weights) over all lines.
`generate` runs a list of prompts through a ContinuousBatcher: each prompt takes a line as soon as one
is free, so the output of a prompt never depends on which others share the batch. `step_times` times
the artifact's own steps for the k advice's cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fusedspec.compile.backend import DECODE_STEPS, DECODE_STEPS_S, Generation, read_build_description
from fusedspec.compile.cpu.batching import ContinuousBatcher
from fusedspec.compile.cpu.export import MIN_CONTEXT, TARGET_ALONE_PROGRAMS, load_program
from fusedspec.compile.cpu.layout import Layout, load_shards
from fusedspec.compile.cpu.model import new_caches
from fusedspec.compile.cpu.sharding import stack_ranks
from fusedspec.compile.documents.build import BUILD_DESCRIPTION, BuildDescription
from fusedspec.compile.documents.validation import ARTIFACT_PROGRAMS, StepTimesRecord
from fusedspec.compile.fused_step import max_model_len
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, PromptError
from fusedspec.core.settings import load_settings

SMALL_HIDDEN = 256  # models narrower than this run single-threaded
TIMED_PROGRAMS = ("target_step", "target_verify", "fused_step")
TIMING_REPEATS = 9
CALLS_PER_SAMPLE = 3  # a tiny model's step is ~0.1 ms: one sample averages a few calls
TIMED_POSITION = 64  # where in the cache the timed steps write (clamped to the artifact's seq_len)


class CpuRunner:
    """Greedy fused generation from a loaded artifact. One thread at a time: the KV caches are shared
    (a server drives it from one engine loop, through one ContinuousBatcher)."""

    def __init__(self, artifact_dir: Path, trust: LoadTrust | None = None):
        """`trust` (compile.trust): what the loader may believe about the files; None: this work dir's
        build when the directory is under its builds/, else a directory nothing vouches for (its exported
        programs load after their check; AOTInductor packages are refused)."""
        self.artifact_dir = Path(artifact_dir)
        if trust is None:
            trust = LoadTrust.for_directory(self.artifact_dir, load_settings().builds_dir)
        self.trust = trust
        if not (self.artifact_dir / BUILD_DESCRIPTION).is_file():
            read_build_description(self.artifact_dir)  # the error that says what the directory lacks
        self.description = BuildDescription.parse_bytes(
            trust.read_bytes(self.artifact_dir, BUILD_DESCRIPTION), str(self.artifact_dir / BUILD_DESCRIPTION)
        )
        if self.description.cpu is None:
            raise ArtifactError(f"{artifact_dir}: built by backend {self.description.backend!r}, not cpu")
        self.spec = self.description.spec
        self.layout = Layout.from_json(self.description.cpu)
        # rank r's tensors are the tp{r} file's, stacked along a rank dim (see model.py)
        self.weights = stack_ranks(load_shards(self.artifact_dir, self.layout, trust))
        self.programs = {}
        isa = self.description.options.get("cpu_isa")
        for name, rel in self.layout.programs.items():
            self.programs[name] = load_program(self.artifact_dir, rel, trust, isa)
        lay, dtype = self.layout, self.layout.torch_dtype
        # allocated once: B lines, each rewritten by the context encoding that admits a request into it
        self._cache_owner: object | None = None
        self.target_k, self.target_v = new_caches(lay.target.arch, lay.target.plan, lay.batch, lay.cache_len,
                                                  dtype)
        self.draft_k, self.draft_v = new_caches(lay.draft.arch, lay.draft.plan, lay.batch, lay.cache_len,
                                                dtype)

    @property
    def caches(self) -> tuple[list[torch.Tensor], ...]:
        return (self.target_k, self.target_v, self.draft_k, self.draft_v)

    @property
    def lines(self) -> int:
        """Cache lines: requests that decode at once (the compiled batch size)."""
        return self.layout.batch

    @property
    def target_alone(self) -> bool:
        """Built with the compile option target_alone: plain greedy and step timing work."""
        return set(TARGET_ALONE_PROGRAMS) <= set(self.programs)

    continuous_batching = True

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None, *, speculate: bool = True) -> Generation:
        """New tokens and accepted-per-step for every prompt (see compile.backend.Generation).

        speculate=False: plain greedy with the target alone (every step accepts one token); needs an
        artifact built with the compile option target_alone. Takes the caches over from any batcher."""
        self.check_prompts(prompts, max_new_tokens)
        batcher = self.batcher(speculate=speculate)
        order = {batcher.submit(prompt, max_new_tokens, eos_token_ids): i for i, prompt in enumerate(prompts)}
        tokens: list[list[int]] = [[] for _ in prompts]
        accepted: list[list[int]] = [[] for _ in prompts]
        timings = {"context_encoding_s": 0.0, DECODE_STEPS_S: 0.0, DECODE_STEPS: 0.0}
        with self.compute_threads():
            while not batcher.idle:
                report = batcher.step()
                timings["context_encoding_s"] += report.prefill_s
                timings[DECODE_STEPS_S] += report.step_s
                timings[DECODE_STEPS] += 1.0 if report.decoded else 0.0
                for done in report.completions:
                    i = order[done.request_id]
                    tokens[i], accepted[i] = list(done.tokens), list(done.accepted)
        return Generation(tokens=tokens, accepted=accepted, timings=timings)

    def batcher(self, *, speculate: bool = True, max_waiting: int | None = None) -> ContinuousBatcher:
        """A ContinuousBatcher over this runner's lines (see batching.py); it takes the caches over."""
        return ContinuousBatcher(self, speculate=speculate, max_waiting=max_waiting)

    def claim_caches(self, owner: object) -> None:
        """From now on `owner` alone decodes from the caches (an earlier owner's calls are refused)."""
        self._cache_owner = owner

    def owns_caches(self, owner: object) -> bool:
        return self._cache_owner is owner

    def require_programs(self, *, speculate: bool) -> None:
        if not speculate and not self.target_alone:
            raise ArtifactError(
                f"{self.artifact_dir}: this artifact has no target-alone programs, so it cannot run plain "
                "greedy (speculate=False); rebuild it with the compile option target_alone: true")

    def target_eos(self) -> frozenset[int]:
        return frozenset(self.layout.target.arch.eos_token_id)

    def check_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        if not prompts:
            raise PromptError("no prompts given: pass a list of token-id lists")
        for i, prompt in enumerate(prompts):
            self.check_prompt(prompt, max_new_tokens, name=f"prompt {i}")

    @property
    def max_model_len(self) -> int:
        """The longest prompt + generated tokens this artifact serves (compile.fused_step.max_model_len)."""
        return max_model_len(self.layout.cache_len, self.layout.k)

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int, *, name: str = "the prompt") -> None:
        """PromptError unless the artifact can generate max_new_tokens after this prompt."""
        lay = self.layout
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise PromptError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
        if len(prompt) == 0:
            raise PromptError(f"{name} is empty: every prompt needs at least one token")
        if len(prompt) > lay.context_len:
            raise PromptError(
                f"{name} has {len(prompt)} tokens but this artifact was compiled for prompts of at "
                f"most {lay.context_len} (max_context_length); shorten it or compile with a larger seq_len")
        # prompt + new tokens within the one bound every server applies (compile.fused_step): this cache holds
        # seq_len + k positions, so that is seq_len.
        if len(prompt) + max_new_tokens > self.max_model_len:
            raise PromptError(
                f"{name} has {len(prompt)} tokens + max_new_tokens={max_new_tokens} = "
                f"{len(prompt) + max_new_tokens} > seq_len={lay.seq_len} of this artifact; ask for fewer "
                "new tokens or compile with a larger seq_len")
        vocab = lay.target.arch.vocab_size
        bad = [t for t in prompt if not 0 <= int(t) < vocab]
        if bad:
            raise PromptError(f"{name} has token id {bad[0]} outside the vocabulary [0, {vocab})")

    @contextmanager
    def compute_threads(self) -> Iterator[None]:
        """Run tiny models single-threaded for the duration: their matmuls lose more to thread hand-offs
        than they gain, badly so on a busy host. Nested use (generate over a batcher) changes nothing."""
        previous = torch.get_num_threads()
        if self.layout.target.arch.hidden_size >= SMALL_HIDDEN or previous == 1:
            yield
            return
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    # ---- the programs, one call each --------------------------------------------------------------

    def prefill(self, line: int, prompt: Sequence[int], *, speculate: bool = True) -> int:
        """Context encoding of one prompt (checked by check_prompt) into cache line `line`, at batch 1:
        writes that line of both models' caches (the target's alone when speculate=False) and no other
        line; returns the prompt's first new token."""
        if isinstance(line, bool) or not isinstance(line, int) or not 0 <= line < self.lines:
            raise PromptError(f"line {line!r} is not a cache line of this artifact (0..{self.lines - 1})")
        # right-padded to the floor torch.export allows; the context programs take any longer length
        tokens = torch.zeros(1, max(MIN_CONTEXT, len(prompt)), dtype=torch.int64)  # [1, C]
        tokens[0, : len(prompt)] = torch.tensor([int(t) for t in prompt], dtype=torch.int64)
        length = torch.tensor([len(prompt)], dtype=torch.int64)  # [1]
        index = torch.tensor([line], dtype=torch.int64)  # [1]
        name, caches = (("context_encoding", self.caches) if speculate
                        else ("target_context_encoding", (self.target_k, self.target_v)))
        with torch.no_grad():
            first = self.programs[name](self.weights, tokens, length, index, *caches)  # [1]
        return int(first[0])

    def fused_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cur [B], pos [B] -> greedy [B, k] target tokens and accepted [B] in 1..k, for every line."""
        return self.programs["fused_step"](self.weights, cur, pos,  # type: ignore[no-any-return]
                                           *self.caches)

    def target_verify(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, k] at pos [B] -> the target's greedy [B, k]: a fused step's verify alone (for timing;
        it writes the target cache at pos..pos+k-1 like the fused step does)."""
        return self.programs["target_verify"](self.weights, tokens, pos,  # type: ignore[no-any-return]
                                              self.target_k, self.target_v)

    def target_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's next token for every line as a one-token step: greedy [B, 1], accepted [B] all 1."""
        token = self.programs["target_step"](self.weights, cur, pos, self.target_k, self.target_v)
        return token[:, None], torch.ones_like(token)

    # ---- the k advice's cost model, timed on the artifact's own programs ----------------------------

    def step_times(self, *, repeats: int = TIMING_REPEATS) -> StepTimesRecord | None:
        """Seconds per call of target_step, target_verify (k positions) and fused_step over all lines;
        None when the artifact has no target-alone programs (built without target_alone).

        The three are interleaved (one sample of each per repeat, the order rotating) so a host getting
        busier halfway through slows all three alike. The caches are taken over: whatever the timed steps
        write is overwritten by the next prefill."""
        if not set(TIMED_PROGRAMS) <= set(self.programs):
            return None
        lay = self.layout
        self.claim_caches(object())  # a batcher made earlier must not decode from what the timing wrote
        pos = torch.full((lay.batch,), min(TIMED_POSITION, lay.seq_len - 1), dtype=torch.int64)  # [B]
        cur = torch.full((lay.batch,), 1, dtype=torch.int64)  # [B]; token values do not change the work
        window = torch.ones(lay.batch, lay.k, dtype=torch.int64)  # [B, k]
        steps: dict[str, Callable[[], Any]] = {
            "target_step": lambda: self.target_step(cur, pos),
            "target_verify": lambda: self.target_verify(window, pos),
            "fused_step": lambda: self.fused_step(cur, pos),
        }
        samples: dict[str, list[float]] = {name: [] for name in steps}
        names = list(steps)
        with self.compute_threads(), torch.no_grad():
            for repeat in range(repeats + 1):
                for name in names[repeat % len(names):] + names[: repeat % len(names)]:
                    started = time.perf_counter()
                    for _ in range(CALLS_PER_SAMPLE):
                        steps[name]()
                    elapsed = (time.perf_counter() - started) / CALLS_PER_SAMPLE
                    if repeat:  # the first round warms allocators and caches up
                        samples[name].append(elapsed)
        return StepTimesRecord(where=ARTIFACT_PROGRAMS, k=lay.k, target_step_s=samples["target_step"],
                               fused_step_s=samples["fused_step"], verify_step_s=samples["target_verify"])
