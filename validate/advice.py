"""k advice: predicted speedup per k from acceptance and a cost model, a recommendation, a table, a plot.

The cost model, in units of one target decode step (t_target = 1):

    one fused step at k   = verify(k) + k * c
    verify(k)             = 1 + b * (k - 1)
    speedup(k)            = tokens / (steps(k) * (verify(k) + k * c))

  tokens    decode tokens after the first (sum of N - 1): what plain greedy decoding spends one target
            step each on. The first token comes from context encoding in both cases, so it is left out.
  steps(k)  predicted fused steps (validate.acceptance), exact for greedy verification.
  c         t_draft / t_target: one draft decode step over one target decode step at batch 1. Measured
            on this host (`measure_costs`: median of timed single-token forwards with a KV cache) or
            given (--cost-ratio), e.g. from Trainium profiles.
  k * c     the draft runs k times per fused step (NxDI computes k draft positions and uses k-1).
  b         the verify slope: how much more verifying k positions costs than decoding one. On
            Trainium decode is memory-bound (weights and KV cache are read once per step whatever the
            few positions), so b = 0 is the default. On a CPU a forward grows with the positions;
            `measure_costs` also reports b measured here, to pass as --verify-slope for CPU serving.
Assumptions: batch 1, per-step overheads (sampling, host round trips) equal in both modes and
folded into t_target, the KV cache of the prompt already built (TTFT unchanged, as in the write-up).
The recommended k is the argmax of speedup(k) over the k range (the smallest k on a tie).
"""

from __future__ import annotations

import inspect
import io
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from compile.documents.validation import (
    AdviceRecord,
    ClassAdviceRecord,
    CostMeasurementRecord,
    CostModelRecord,
)
from compile.errors import ConfigError
from compile.files import atomic_write
from compile.modelconfig import read_arch
from compile.spec import DTYPES, canonical_dtype
from compile.transformers_names import transformers_names
from validate.acceptance import (
    DEFAULT_K_RANGE,
    OVERALL,
    AcceptanceTable,
    KStats,
    predict,
    teacher_forced_agreement,
)
from validate.prompts import RenderedPrompt
from validate.reference import Reference, get_reference


@dataclass(frozen=True)
class CostModel:
    cost_ratio: float  # c = t_draft / t_target
    verify_slope: float = 0.0  # b
    source: str = "given"  # "given" or "measured on this host"

    def __post_init__(self) -> None:
        if not self.cost_ratio > 0:
            raise ConfigError(f"cost ratio {self.cost_ratio} must be positive (t_draft / t_target)")
        if self.verify_slope < 0:
            raise ConfigError(f"verify slope {self.verify_slope} must not be negative")

    def step_cost(self, k: int) -> float:
        """One fused step at k, in target decode steps."""
        return 1.0 + self.verify_slope * (k - 1) + k * self.cost_ratio

    def speedup(self, stats: KStats) -> float | None:
        if not stats.steps:
            return None
        return stats.tokens / (stats.steps * self.step_cost(stats.k))

    def record(self) -> CostModelRecord:
        return CostModelRecord(cost_ratio=self.cost_ratio, verify_slope=self.verify_slope, source=self.source,
                               formula="speedup(k) = tokens / (steps(k) * (1 + b*(k-1) + k*c))")


@dataclass(frozen=True)
class CostMeasurement:
    t_target: float  # seconds per single-token decode step, batch 1
    t_draft: float
    verify_slope: float  # b measured on this host for the target
    verify_k: int

    @property
    def cost_ratio(self) -> float:
        return self.t_draft / self.t_target

    def record(self) -> CostMeasurementRecord:
        return CostMeasurementRecord(t_target_s=self.t_target, t_draft_s=self.t_draft, cost_ratio=self.cost_ratio,
                                     verify_slope_measured=self.verify_slope, verify_k=self.verify_k)


def measure_costs(target_dir: Path, draft_dir: Path, *, dtype: str = "float32", context: int = 64,
                  verify_k: int = 8, repeats: int = 7) -> CostMeasurement:
    """Time one decode step of each model at batch 1 on this host (median of `repeats`), after a prefill
    of `context` tokens; also time a verify of `verify_k` positions on the target to measure b."""
    import torch
    (AutoModelForCausalLM,) = transformers_names("AutoModelForCausalLM")

    dtype = canonical_dtype(dtype)
    times: dict[str, float] = {}
    verify_time = 0.0
    for role, path in (("target", target_dir), ("draft", draft_dir)):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, DTYPES[dtype]),
                                                     local_files_only=True, trust_remote_code=False)
        model.eval()
        gen = torch.Generator().manual_seed(0)
        prefix = torch.randint(0, 1000, (1, context), generator=gen)  # [1, context]; content is irrelevant
        with torch.inference_mode():
            out = model(prefix, use_cache=True)
            # transformers 5 calls the KV cache `cache`; 4.x called it `past_key_values`.
            past = getattr(out, "cache", None) or out.past_key_values
            times[role] = _median_forward(model, past, context, 1, repeats)
            if role == "target":
                verify_time = _median_forward(model, past, context, verify_k, repeats)
        del model
    slope = max(0.0, (verify_time / times["target"] - 1.0) / (verify_k - 1))
    return CostMeasurement(t_target=times["target"], t_draft=times["draft"], verify_slope=slope,
                           verify_k=verify_k)


def _median_forward(model: Any, past: Any, context: int, positions: int, repeats: int) -> float:
    import torch

    ids = torch.full((1, positions), 42, dtype=torch.long)  # [1, positions]
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    samples = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=positions, **{cache_arg: past})
        elapsed = time.perf_counter() - started
        past.crop(-positions)  # back to the prefix, so every sample sees the same cache length
        assert past.get_seq_length() == context
        if i:  # the first call warms up allocators and kernels
            samples.append(elapsed)
    return statistics.median(samples)


# ---- advice -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassAdvice:
    cls: str
    agreement: float | None
    rows: tuple[tuple[KStats, float | None], ...]  # (stats, speedup) per k
    recommended_k: int | None
    best_speedup: float | None

    @property
    def pays_off(self) -> bool:
        """False when even the best k is predicted slower than the target alone."""
        return self.best_speedup is not None and self.best_speedup > 1.0

    def record(self) -> ClassAdviceRecord:
        return ClassAdviceRecord(cls=self.cls, agreement=self.agreement, recommended_k=self.recommended_k,
                                 best_speedup=self.best_speedup, pays_off=self.pays_off,
                                 by_k=[s.record(speedup=sp) for s, sp in self.rows])


@dataclass(frozen=True)
class Advice:
    model: CostModel
    classes: tuple[ClassAdvice, ...]  # the prompt classes in file order, then "overall"
    measurement: CostMeasurement | None = None

    def for_class(self, cls: str) -> ClassAdvice:
        return next(c for c in self.classes if c.cls == cls)

    @property
    def recommended_k(self) -> int | None:
        return self.for_class(OVERALL).recommended_k

    def record(self) -> AdviceRecord:
        return AdviceRecord(cost_model=self.model.record(),
                            measurement=self.measurement.record() if self.measurement else None,
                            recommended_k={c.cls: c.recommended_k for c in self.classes},
                            classes=[c.record() for c in self.classes])


def advise(table: AcceptanceTable, model: CostModel, measurement: CostMeasurement | None = None) -> Advice:
    """Speedup per class and k under `model`, and the k that maximises it per class and overall."""
    classes = []
    for cls, by_k in table.per_class.items():
        rows = tuple((stats, model.speedup(stats)) for stats in by_k.values())
        scored = [(sp, stats.k) for stats, sp in rows if sp is not None]
        # Highest speedup wins; on a tie the smaller k (less draft work, less KV cache).
        best = max(scored, key=lambda t: (t[0], -t[1])) if scored else None
        classes.append(ClassAdvice(cls=cls, agreement=table.agreement(cls), rows=rows,
                                   recommended_k=best[1] if best else None,
                                   best_speedup=best[0] if best else None))
    return Advice(model=model, classes=tuple(classes), measurement=measurement)


def format_table(advice: Advice) -> str:
    """A plain-text table per class: k, steps, tokens/step, acceptance rate, speedup; '*' marks the pick."""
    lines = [f"cost model: {advice.model.record().formula}, c={advice.model.cost_ratio:.3f} "
             f"({advice.model.source}), b={advice.model.verify_slope:.3f}"]
    for c in advice.classes:
        agreement = "n/a" if c.agreement is None else f"{c.agreement:.2f}"
        lines.append("")
        verdict = "" if c.pays_off else " (no k beats the target alone: do not speculate on this class)"
        lines.append(f"[{c.cls}] agreement {agreement}, recommended k = {c.recommended_k}{verdict}")
        lines.append(f"  {'k':>3} {'steps':>6} {'tok/step':>8} {'accept':>7} {'speedup':>8}")
        for stats, sp in c.rows:
            mark = "*" if stats.k == c.recommended_k else " "
            lines.append(f"{mark} {stats.k:>3} {stats.steps:>6} {_fmt(stats.tokens_per_step):>8} "
                         f"{_fmt(stats.acceptance_rate):>7} {_fmt(sp):>8}")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def plot_advice(advice: Advice, path: Path, *, title: str, mark_k: int | None = None) -> Path:
    """Speedup-vs-k curves per class (PNG), the recommended k of each marked; written atomically."""
    buffer = io.BytesIO()
    plot_record(advice.record(), buffer, title=title, mark_ks=[mark_k] if mark_k is not None else [])
    atomic_write(Path(path), buffer.getvalue())
    return Path(path)


def plot_record(advice: AdviceRecord, out: BinaryIO, *, title: str, mark_ks: Sequence[int] = ()) -> None:
    """The plot of an advice record (as validation.json holds it) as PNG bytes written to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for c in advice.classes:
        points = [(row.k, row.speedup) for row in c.by_k if row.speedup is not None]
        if not points:
            continue
        ks, speedups = zip(*points, strict=True)
        style = {"color": "black", "linewidth": 2.5} if c.cls == OVERALL else {"linewidth": 1.6}
        verdict = f"k={c.recommended_k}" if c.pays_off else "do not speculate"  # never a k that slows down
        (line,) = ax.plot(ks, speedups, marker="o", markersize=3, label=f"{c.cls} ({verdict})", **style)
        if c.pays_off and c.recommended_k is not None and c.best_speedup is not None:
            ax.plot([c.recommended_k], [c.best_speedup], marker="*", markersize=14, color=line.get_color(),
                    markeredgecolor="black", zorder=5)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no speedup")
    for i, k in enumerate(mark_ks):
        ax.axvline(k, color="tab:red", linestyle=":", linewidth=1.2,
                   label="built k" + ("" if len(mark_ks) > 1 else f" (k={k})") if i == 0 else None)
    ax.set_xlabel("speculation length k (tokens per fused step at most)")
    ax.set_ylabel("predicted speedup over target-only decoding")
    ax.set_title(title, fontsize=11)
    model = advice.cost_model
    ax.text(0.01, 0.01, f"c = t_draft/t_target = {model.cost_ratio:.3f} ({model.source}), "
            f"verify slope b = {model.verify_slope:.2f}", transform=ax.transAxes, fontsize=8,
            color="dimgray", va="bottom")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", title="class (best k, marked *)", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


# ---- the whole advice for a pair ----------------------------------------------------------------


@dataclass(frozen=True)
class PairAdvice:
    reference: Reference
    table: AcceptanceTable
    advice: Advice

    def to_json(self) -> dict[str, Any]:
        return {"reference": {"key": self.reference.key, "from_cache": self.reference.from_cache,
                              "dtype": self.reference.dtype, "max_new_tokens": self.reference.max_new_tokens,
                              "implementation": self.reference.implementation},
                "acceptance": self.table.to_json(), "advice": self.advice.record().model_dump(mode="json")}


def advise_pair(target_dir: Path, draft_dir: Path, target_identity: dict[str, Any],
                rendered: Sequence[RenderedPrompt], *, max_new_tokens: int, dtype: str, cache_dir: Path,
                ks: Iterable[int] = DEFAULT_K_RANGE, cost_ratio: float | None = None,
                verify_slope: float = 0.0, eos_token_ids: Sequence[int] | None = None) -> PairAdvice:
    """Reference (cached), teacher-forced agreement, predicted steps for every k, and advice.

    The cost ratio is measured on this host unless `cost_ratio` is given.
    """
    eos = list(eos_token_ids) if eos_token_ids is not None else list(read_arch(target_dir).eos_token_id)
    reference = get_reference(target_dir, target_identity, rendered, max_new_tokens=max_new_tokens, dtype=dtype,
                              eos_token_ids=eos, cache_dir=cache_dir)
    table = predict(teacher_forced_agreement(target_dir, draft_dir, reference, dtype=dtype), ks)
    measurement = None
    if cost_ratio is None:
        measurement = measure_costs(target_dir, draft_dir, dtype=dtype)
        model = CostModel(measurement.cost_ratio, verify_slope, source="measured on this host")
    else:
        model = CostModel(cost_ratio, verify_slope, source="given")
    return PairAdvice(reference=reference, table=table, advice=advise(table, model, measurement))
