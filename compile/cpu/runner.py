"""Load a cpu artifact and generate greedily with its programs (the Runner contract).

Loading reads build.json, the rank weight files and the saved programs; nothing else (no original
checkpoint, no transformers). Generation runs prompts in batches of the compiled batch size: one
context encoding per batch over the batch's longest prompt (its token is not a step), then fused steps
until every row has hit EOS or max_new_tokens. Rows that finished, and the padding rows of a short last
batch, still ride along (shapes are static) with their outputs ignored. With `speculate=False` the
target-alone programs (compile option target_alone) do the same one token per step: plain greedy
through the same weights, the baseline a speedup is measured against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from compile.backend import Generation, read_build_description
from compile.cpu.export import MIN_CONTEXT, TARGET_ALONE_PROGRAMS, load_program
from compile.cpu.layout import Layout, load_shards
from compile.cpu.model import new_caches
from compile.cpu.sharding import stack_ranks
from compile.errors import ArtifactError, PromptError

SMALL_HIDDEN = 256  # models narrower than this run single-threaded


class CpuRunner:
    """Greedy fused generation from a loaded artifact. Not thread-safe (the KV caches are shared)."""

    def __init__(self, artifact_dir: Path):
        self.artifact_dir = Path(artifact_dir)
        self.description = read_build_description(self.artifact_dir)
        if self.description.cpu is None:
            raise ArtifactError(f"{artifact_dir}: built by backend {self.description.backend!r}, not cpu")
        self.spec = self.description.spec
        self.layout = Layout.from_json(self.description.cpu)
        # rank r's tensors are the tp{r} file's, stacked along a rank dim (see model.py)
        self.weights = stack_ranks(load_shards(self.artifact_dir, self.layout))
        self.programs = {}
        for name, rel in self.layout.programs.items():
            path = self.artifact_dir / rel
            if not path.is_file():
                raise ArtifactError(f"{path}: missing; the artifact is incomplete (rebuild it)")
            self.programs[name] = load_program(path)
        lay, dtype = self.layout, self.layout.torch_dtype
        # allocated once; every batch's context encoding overwrites what later steps read
        self.target_k, self.target_v = new_caches(lay.target.arch, lay.target.plan, lay.batch, lay.cache_len, dtype)
        self.draft_k, self.draft_v = new_caches(lay.draft.arch, lay.draft.plan, lay.batch, lay.cache_len, dtype)

    @property
    def caches(self) -> tuple[list[torch.Tensor], ...]:
        return (self.target_k, self.target_v, self.draft_k, self.draft_v)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_ids: Sequence[int] | None = None, *, speculate: bool = True) -> Generation:
        """New tokens and accepted-per-step for every prompt (see compile.backend.Generation).

        speculate=False: plain greedy with the target alone (every step accepts one token); needs an
        artifact built with the compile option target_alone."""
        self.check_prompts(prompts, max_new_tokens)
        if not speculate and not set(TARGET_ALONE_PROGRAMS) <= set(self.programs):
            raise ArtifactError(
                f"{self.artifact_dir}: this artifact has no target-alone programs, so it cannot run plain "
                "greedy (speculate=False); rebuild it with the compile option target_alone: true")
        eos = self.target_eos() if eos_token_ids is None else frozenset(int(t) for t in eos_token_ids)
        result = Generation(tokens=[], accepted=[], timings={"context_encoding_s": 0.0, "fused_steps_s": 0.0,
                                                             "fused_steps": 0.0})
        size = self.layout.batch
        threads = torch.get_num_threads()
        if self.layout.target.arch.hidden_size < SMALL_HIDDEN:
            # tiny matmuls lose more to thread hand-offs than they gain, badly so on a busy host
            torch.set_num_threads(1)
        try:
            for start in range(0, len(prompts), size):
                self.run_batch(prompts[start:start + size], max_new_tokens, eos, result, speculate=speculate)
        finally:
            torch.set_num_threads(threads)
        return result

    def target_eos(self) -> frozenset[int]:
        return frozenset(self.layout.target.arch.eos_token_id)

    def check_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        lay = self.layout
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise PromptError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
        if not prompts:
            raise PromptError("no prompts given: pass a list of token-id lists")
        vocab = lay.target.arch.vocab_size
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise PromptError(f"prompt {i} is empty: every prompt needs at least one token")
            if len(prompt) > lay.context_len:
                raise PromptError(
                    f"prompt {i} has {len(prompt)} tokens but this artifact was compiled for prompts of at "
                    f"most {lay.context_len} (max_context_length); shorten it or compile with a larger seq_len")
            if len(prompt) + max_new_tokens > lay.seq_len:
                raise PromptError(
                    f"prompt {i} has {len(prompt)} tokens + max_new_tokens={max_new_tokens} = "
                    f"{len(prompt) + max_new_tokens} > seq_len={lay.seq_len} of this artifact; ask for fewer "
                    "new tokens or compile with a larger seq_len")
            bad = [t for t in prompt if not 0 <= int(t) < vocab]
            if bad:
                raise PromptError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab})")

    def run_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos: frozenset[int],
                  result: Generation, *, speculate: bool = True) -> None:
        """One compiled batch: at most `batch_size` prompts; appends their rows to `result`."""
        lay = self.layout
        if len(prompts) > lay.batch:
            raise PromptError(
                f"{len(prompts)} prompts in one batch but this artifact was compiled for batch_size={lay.batch}; "
                "use generate(), which runs successive batches, or compile with a larger batch_size")
        self.check_prompts(prompts, max_new_tokens)
        rows = len(prompts)
        # right-padded to the batch's longest prompt only: the context programs take any length
        width = max(MIN_CONTEXT, max(len(prompt) for prompt in prompts))
        tokens = torch.zeros(lay.batch, width, dtype=torch.int64)  # [B, C]
        lengths = torch.ones(lay.batch, dtype=torch.int64)  # padding rows: one token
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.tensor([int(t) for t in prompt], dtype=torch.int64)
            lengths[i] = len(prompt)

        caches = self.caches if speculate else (self.target_k, self.target_v)
        context, step = ("context_encoding", self.fused_step) if speculate else ("target_context_encoding",
                                                                                 self.target_step)
        started = time.perf_counter()
        with torch.no_grad():
            first = self.programs[context](self.weights, tokens, lengths, *caches)  # [B]
        result.timings["context_encoding_s"] += time.perf_counter() - started

        out = [[int(first[i])] for i in range(rows)]
        steps: list[list[int]] = [[] for _ in range(rows)]
        active = [max_new_tokens > 1 and out[i][0] not in eos for i in range(rows)] + [False] * (lay.batch - rows)
        cur, pos = first.clone(), lengths.clone()  # [B]: last token (not yet cached) and its position
        started = time.perf_counter()
        while any(active):
            mask = torch.tensor(active)
            # finished and padding rows run at position 0: harmless writes into their own caches only
            step_cur, step_pos = torch.where(mask, cur, 0), torch.where(mask, pos, 0)
            with torch.no_grad():
                greedy, accepted = step(step_cur, step_pos)
            result.timings["fused_steps"] += 1
            for i in range(rows):
                if not active[i]:
                    continue
                count = int(accepted[i])
                new = [int(t) for t in greedy[i, :count]][: max_new_tokens - len(out[i])]
                for j, token in enumerate(new):
                    if token in eos:
                        new = new[: j + 1]
                        break
                out[i] += new
                steps[i].append(len(new))
                if len(new) < count or len(out[i]) >= max_new_tokens or new[-1] in eos:
                    active[i] = False
                else:
                    cur[i], pos[i] = greedy[i, count - 1], pos[i] + count
        result.timings["fused_steps_s"] += time.perf_counter() - started
        result.tokens.extend(out)
        result.accepted.extend(steps)

    def fused_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """greedy [B, k] target tokens and accepted [B] in 1..k."""
        return self.programs["fused_step"](self.weights, cur, pos, *self.caches)  # type: ignore[no-any-return]

    def target_step(self, cur: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's next token as a one-token step: greedy [B, 1], accepted [B] all 1."""
        token = self.programs["target_step"](self.weights, cur, pos, self.target_k, self.target_v)
        return token[:, None], torch.ones_like(token)
