"""Where a fused step's time goes: its parts timed one by one on a built cpu artifact, in one process.

    nice -n 19 .venv/bin/python bench/fused_step_breakdown.py ARTIFACT_DIR [--repeats 10]

The artifact must have the target-alone programs (compile option target_alone), as
bench/decode_real_pair.py builds them. With the artifact's own weights and caches, after a real prompt's
context encoding, each row is the median of `--repeats` calls:

  target step (program)       the exported target_step: one plain greedy token
  fused step (program)        the exported fused_step: k draft runs + one k-token target verify
  draft run, 1 token (eager)  the draft decoder's forward on one token, without and with its lm_head
  target verify, k tokens     the target decoder's forward on k tokens + its lm_head (eager)
  eager parts, summed         k draft runs (k-1 with lm_head) + the verify: what the program should cost
  runner overhead per step    the runner's fused-step loop time per step minus the program's time

Ratios are against the target step, so "fused step / target step" is the cost model's 1 + k*c read
off this host. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedspec.compile.cpu.runner import SMALL_HIDDEN, CpuRunner  # noqa: E402

PROMPT = [9707, 1879, 11, 358, 1079, 264, 1273, 13] * 4  # a 32-token prompt in the Qwen vocabulary


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first calls of a loaded program are slower
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    runner = CpuRunner(args.artifact)
    lay, k, w = runner.layout, runner.layout.k, runner.weights
    target, draft = lay.target, lay.draft
    batch = lay.batch
    if target.arch.hidden_size < SMALL_HIDDEN:
        torch.set_num_threads(1)  # as the runner does for tiny models, so the rows compare
    # prefill a real prompt so the caches hold a context, as in generation
    gen = runner.generate([PROMPT], 2 * k + 2, eos_token_ids=[])
    pos = torch.full((batch,), len(PROMPT) + 1, dtype=torch.int64)
    cur = torch.full((batch,), gen.tokens[0][-1], dtype=torch.int64)
    tk, tv, dk, dv = runner.caches

    def positions(n: int) -> torch.Tensor:
        return pos[:, None] + torch.arange(n)[None, :]

    def draft_run(with_head: bool) -> None:
        hidden = draft.forward(w, cur[:, None], positions(1), dk, dv)
        if with_head:
            draft.logits(w, hidden).argmax(-1)

    def verify() -> None:
        candidates = cur[:, None].expand(batch, k)
        target.logits(w, target.forward(w, candidates, positions(k), tk, tv)).argmax(-1)

    with torch.no_grad():
        rows = {
            "target step (program)": median_ms(lambda: runner.target_step(cur, pos), args.repeats),
            "fused step (program)": median_ms(lambda: runner.fused_step(cur, pos), args.repeats),
            "draft run, 1 token, no lm_head (eager)": median_ms(lambda: draft_run(False), args.repeats),
            "draft run, 1 token, with lm_head (eager)": median_ms(lambda: draft_run(True), args.repeats),
            "target verify, k tokens + lm_head (eager)": median_ms(verify, args.repeats),
        }
    rows["eager parts, summed"] = ((k - 1) * rows["draft run, 1 token, with lm_head (eager)"]
                                   + rows["draft run, 1 token, no lm_head (eager)"]
                                   + rows["target verify, k tokens + lm_head (eager)"])
    timed = runner.generate([PROMPT], 4 * k, eos_token_ids=[])  # no EOS: every step counted
    per_step = 1e3 * timed.timings["decode_steps_s"] / max(1, timed.timings["decode_steps"])
    rows["runner overhead per step"] = per_step - rows["fused step (program)"]

    base = rows["target step (program)"]
    print(f"\n{args.artifact.name}: k={k}, tp={lay.tp}, {lay.dtype}, batch {batch}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}\n")
    print("| part | ms | / target step |")
    print("|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
