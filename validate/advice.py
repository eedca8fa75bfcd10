"""k advice: predicted speedup per k from acceptance and a cost model, a recommendation, a table, a plot.

The cost model, in units of one target decode step (t_target = 1):

    one fused step at k   = verify(k) + k * c
    verify(k)             = 1 + b * (k - 1)
    speedup(k)            = tokens / (steps(k) * (verify(k) + k * c))

  tokens    decode tokens after the first (sum of N - 1): what plain greedy decoding spends one target
            step each on. The first token comes from context encoding in both cases, so it is left out.
  steps(k)  predicted fused steps (validate.acceptance), exact for greedy verification.
  c         t_draft / t_target: one draft decode step over one target decode step, and
  b         the verify slope: how much more verifying k positions costs than decoding one.
            Where both come from (validate.step_costs), and the advice says which:
              - given (--cost-ratio, --verify-slope);
              - recorded step times (--step-times, e.g. from a Trainium host);
              - in validation, this artifact's own programs: target step, target verify at k and
                fused step, timed in the validation run (needs the target-alone programs);
              - otherwise transformers forwards of the checkpoints on this host (`measure_costs`),
                named as such: they run differently from any artifact, so treat them as a first guess.
            A Neuron host without the device states a bytes-read model instead (step_costs).
  k * c     the draft runs k times per fused step (NxDI computes k draft positions and uses k-1).
Assumptions: batch 1, per-step overheads (sampling, host round trips) equal in both modes and
folded into t_target, the KV cache of the prompt already built (TTFT unchanged, as in the write-up).
The recommended k is the argmax of speedup(k) over the k range (the smallest k on a tie), except that a
class whose built k measured slower than the target alone in the validation run gets no k: do not
speculate on it (validate.decode_speed measures; the prediction's error is reported next to it).
"""

from __future__ import annotations

import inspect
import io
import statistics
import textwrap
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from fusedspec.compile.backend import Runner
from fusedspec.compile.documents.validation import (
    AdviceRecord,
    ClassAdviceRecord,
    CostMeasurementRecord,
    DecodeSpeedRecord,
    StepTimesRecord,
)
from fusedspec.compile.modelconfig import ModelArch, read_arch
from fusedspec.core.files import atomic_write
from fusedspec.validate.acceptance import (
    DEFAULT_K_RANGE,
    OVERALL,
    AcceptanceTable,
    KStats,
    PromptAgreement,
    get_agreement,
    predict,
)
from fusedspec.validate.cost_model import CostModel
from fusedspec.validate.decode_speed import DecodeSpeed, measure_decode
from fusedspec.validate.hf_models import HfModels
from fusedspec.validate.prompts import RenderedPrompt
from fusedspec.validate.reference import Reference, get_reference
from fusedspec.validate.step_costs import TARGET_ALONE_HINT, cost_model_from_times, stated_bytes_model

__all__ = ["Advice", "ClassAdvice", "CostMeasurement", "CostModel", "PairAdvice", "advise", "advise_pair",
           "format_table", "measure_costs", "plot_advice", "plot_record", "rescore"]
# What transformers forwards of the checkpoints on this host say, when no artifact's programs can be timed:
# named as such, because the artifact's programs (or another host's hardware) run differently.
HOST_FORWARDS = ("measured with transformers forwards of the two checkpoints on this host, not an artifact's "
                 "programs")


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
        return CostMeasurementRecord(t_target_s=self.t_target, t_draft_s=self.t_draft,
                                     cost_ratio=self.cost_ratio, verify_slope_measured=self.verify_slope,
                                     verify_k=self.verify_k)


def measure_costs(target_dir: Path, draft_dir: Path, *, dtype: str = "float32", context: int = 64,
                  verify_k: int = 8, repeats: int = 7, models: HfModels | None = None) -> CostMeasurement:
    """Time one decode step of each model (from `models`, or loaded for this call) at batch 1 on this host
    (median of `repeats`), after a prefill of `context` tokens; also time a verify of `verify_k` positions on
    the target to measure b.

    The three forwards take turns within each repeat rather than one model's repeats after the other's: on a
    shared host a burst of other work then slows both sides of the ratio alike, where one model's repeats
    after the other's skewed c several-fold on a busy host (bench/RESULTS.md, choosing the draft)."""
    import torch

    models = models or HfModels()
    steps = []  # (name, model, cache, positions)
    for role, path in (("target", target_dir), ("draft", draft_dir)):
        model = models.causal_lm(path, dtype)
        gen = torch.Generator().manual_seed(0)
        prefix = torch.randint(0, 1000, (1, context), generator=gen)  # [1, context]; content is irrelevant
        with torch.inference_mode():
            out = model(prefix, use_cache=True)
        # transformers 5 calls the KV cache `cache`; 4.x called it `past_key_values`.
        past = getattr(out, "cache", None) or out.past_key_values
        steps.append((role, model, past, 1))
        if role == "target":
            steps.append(("verify", model, past, verify_k))
    samples: dict[str, list[float]] = {name: [] for name, *_ in steps}
    with torch.inference_mode():
        for i in range(repeats + 1):
            for name, model, past, positions in steps:
                elapsed = _timed_forward(model, past, context, positions)
                if i:  # the first round warms up allocators and kernels
                    samples[name].append(elapsed)
    times = {name: statistics.median(taken) for name, taken in samples.items()}
    slope = max(0.0, (times["verify"] / times["target"] - 1.0) / (verify_k - 1))
    return CostMeasurement(t_target=times["target"], t_draft=times["draft"], verify_slope=slope,
                           verify_k=verify_k)


def _timed_forward(model: Any, past: Any, context: int, positions: int) -> float:
    """Seconds of one forward of `positions` tokens after the cached prefix; the cache is cropped back to the
    prefix after it, so every sample sees the same cache length."""
    import torch

    ids = torch.full((1, positions), 42, dtype=torch.long)  # [1, positions]
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    started = time.perf_counter()
    model(ids, use_cache=True, logits_to_keep=positions, **{cache_arg: past})
    elapsed = time.perf_counter() - started
    past.crop(-positions)
    assert past.get_seq_length() == context
    return elapsed


# ---- advice -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassAdvice:
    cls: str
    agreement: float | None
    rows: tuple[tuple[KStats, float | None], ...]  # (stats, speedup) per k
    recommended_k: int | None  # None: do not speculate on this class (the built k measured slower)
    best_speedup: float | None  # predicted
    measured: DecodeSpeed | None = None  # at the artifact's k, when the validation run measured it

    @property
    def measured_slower(self) -> bool:
        """The built k decoded this class slower than the target alone on the same artifact."""
        return self.measured is not None and self.measured.speedup <= 1.0

    @property
    def pays_off(self) -> bool:
        """False when even the best k is predicted slower than the target alone,
        or the built k measured so."""
        return self.best_speedup is not None and self.best_speedup > 1.0 and not self.measured_slower

    def predicted_at(self, k: int) -> float | None:
        return next((sp for stats, sp in self.rows if stats.k == k), None)

    def decode_record(self) -> DecodeSpeedRecord | None:
        """Measured next to predicted at the built k (None when not measured)."""
        m = self.measured
        if m is None:
            return None
        predicted = self.predicted_at(m.k)
        return DecodeSpeedRecord(cls=self.cls, k=m.k, predicted_speedup=predicted, measured_speedup=m.speedup,
                                 ratio=m.speedup / predicted if predicted else None,
                                 target_s_per_token=m.target_s_per_token,
                                 fused_s_per_token=m.fused_s_per_token, tokens=m.tokens,
                                 run_speedups=m.run_speedups, repeats=len(m.fused_runs), spread=m.spread)

    def record(self) -> ClassAdviceRecord:
        return ClassAdviceRecord(cls=self.cls, agreement=self.agreement, recommended_k=self.recommended_k,
                                 best_speedup=self.best_speedup, pays_off=self.pays_off,
                                 by_k=[s.record(speedup=sp) for s, sp in self.rows])


@dataclass(frozen=True)
class Advice:
    model: CostModel
    classes: tuple[ClassAdvice, ...]  # the prompt classes in file order, then "overall"
    measurement: CostMeasurement | None = None  # transformers forwards on this host, when those set c
    step_times: StepTimesRecord | None = None  # the artifact's (or a device's) step times, when those set c

    def for_class(self, cls: str) -> ClassAdvice:
        return next(c for c in self.classes if c.cls == cls)

    @property
    def recommended_k(self) -> int | None:
        return self.for_class(OVERALL).recommended_k

    def record(self) -> AdviceRecord:
        decode = [c.decode_record() for c in self.classes]
        return AdviceRecord(cost_model=self.model.record(),
                            measurement=self.measurement.record() if self.measurement else None,
                            step_times=self.step_times,
                            recommended_k={c.cls: c.recommended_k for c in self.classes},
                            classes=[c.record() for c in self.classes],
                            decode=[d for d in decode if d is not None])


def advise(table: AcceptanceTable, model: CostModel, measurement: CostMeasurement | None = None, *,
           decode: Sequence[DecodeSpeed] = (), step_times: StepTimesRecord | None = None) -> Advice:
    """Speedup per class and k under `model`, and the k that maximises it per class and overall.

    `decode` holds what the validation run measured at the built k. A class whose built k measured
    slower than the target alone gets no k at all (do not speculate), whatever the model predicts: the
    built k is the only one this artifact can serve, and it was seen to lose."""
    measured = {d.cls: d for d in decode}
    classes = []
    for cls, by_k in table.per_class.items():
        rows = tuple((stats, model.speedup(stats)) for stats in by_k.values())
        scored = [(sp, stats.k) for stats, sp in rows if sp is not None]
        # Highest speedup wins; on a tie the smaller k (less draft work, less KV cache).
        best = max(scored, key=lambda t: (t[0], -t[1])) if scored else None
        advice = ClassAdvice(cls=cls, agreement=table.agreement(cls), rows=rows,
                             recommended_k=best[1] if best else None, best_speedup=best[0] if best else None,
                             measured=measured.get(cls))
        if advice.measured_slower:
            advice = replace(advice, recommended_k=None)
        classes.append(advice)
    return Advice(model=model, classes=tuple(classes), measurement=measurement, step_times=step_times)


def rescore(record: AdviceRecord, model: CostModel) -> AdviceRecord:
    """`record` under another cost model: every predicted speedup from its stored steps and tokens per k
    (the acceptance does not depend on the cost model), each class's pick and the predictions next to
    what was measured at the built k. A class measured slower than the target alone still gets no k."""
    decode = []
    predicted: dict[tuple[str, int], float | None] = {}
    classes = []
    for c in record.classes:
        rows = [row.model_copy(update={"speedup": _speedup(row.tokens, row.steps, row.k, model)})
                for row in c.by_k]
        predicted.update({(c.cls, row.k): row.speedup for row in rows})
        scored = [(row.speedup, row.k) for row in rows if row.speedup is not None]
        best = max(scored, key=lambda t: (t[0], -t[1])) if scored else None
        slower = any(d.cls == c.cls and d.measured_speedup <= 1.0 for d in record.decode)
        pays_off = best is not None and best[0] > 1.0 and not slower
        classes.append(c.model_copy(update={"by_k": rows, "best_speedup": best[0] if best else None,
                                            "recommended_k": None if slower or best is None else best[1],
                                            "pays_off": pays_off}))
    for d in record.decode:
        again = predicted.get((d.cls, d.k))
        decode.append(d.model_copy(update={"predicted_speedup": again,
                                           "ratio": d.measured_speedup / again if again else None}))
    return record.model_copy(update={"cost_model": model.record(), "measurement": None, "step_times": None,
                                     "classes": classes, "decode": decode,
                                     "recommended_k": {c.cls: c.recommended_k for c in classes}})


def _speedup(tokens: int, steps: int, k: int, model: CostModel) -> float | None:
    return tokens / (steps * model.step_cost(k)) if steps else None


def format_table(advice: Advice) -> str:
    """A plain-text table per class: k, steps, tokens/step, acceptance rate, speedup; '*' marks the pick."""
    lines = [f"cost model: {advice.model.record().formula}, {advice.model.describe()}"]
    for c in advice.classes:
        agreement = "n/a" if c.agreement is None else f"{c.agreement:.2f}"
        lines.append("")
        if c.measured_slower:
            verdict = "do not speculate (the built k measured slower than the target alone)"
        else:
            verdict = f"recommended k = {c.recommended_k}" + (
                "" if c.pays_off else " (no k beats the target alone: do not speculate on this class)")
        lines.append(f"[{c.cls}] agreement {agreement}, {verdict}")
        record = c.decode_record()
        if record is not None:
            lines.append(f"  measured at built k={record.k}: {format_decode(record)}")
        lines.append(f"  {'k':>3} {'steps':>6} {'tok/step':>8} {'accept':>7} {'speedup':>8}")
        for stats, sp in c.rows:
            mark = "*" if stats.k == c.recommended_k else " "
            lines.append(f"{mark} {stats.k:>3} {stats.steps:>6} {_fmt(stats.tokens_per_step):>8} "
                         f"{_fmt(stats.acceptance_rate):>7} {_fmt(sp):>8}")
    return "\n".join(lines)


def format_decode(record: DecodeSpeedRecord) -> str:
    """'predicted 1.36x, measured 0.92x (ratio 0.68; median of 3, spread 5%)', and a warning when the runs
    disagree too much to judge the prediction by (DecodeSpeedRecord.noisy). A noisy measurement still keeps
    a k measured slower out of the advice."""
    predicted = "n/a" if record.predicted_speedup is None else f"{record.predicted_speedup:.2f}x"
    ratio = "n/a" if record.ratio is None else f"{record.ratio:.2f}"
    noisy = (" - too noisy to judge the prediction by: validate again on a quiet host" if record.noisy()
             else "")
    return (f"predicted {predicted}, measured {record.measured_speedup:.2f}x (ratio {ratio}; median of "
            f"{record.repeats}, spread {record.spread:.0%}){noisy}")



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
    measured = {row.cls: row for row in advice.decode}
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
        if c.cls in measured:  # what the artifact did at its k, next to the curve that predicted it
            row = measured[c.cls]
            ax.plot([row.k], [row.measured_speedup], marker="X", markersize=9, linestyle="none",
                    color=line.get_color(), markeredgecolor="black", zorder=6,
                    label="measured at the built k" if c.cls == OVERALL else None)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no speedup")
    for i, k in enumerate(mark_ks):
        ax.axvline(k, color="tab:red", linestyle=":", linewidth=1.2,
                   label="built k" + ("" if len(mark_ks) > 1 else f" (k={k})") if i == 0 else None)
    ax.set_xlabel("speculation length k (tokens per fused step at most)")
    ax.set_ylabel("speedup over target-only decoding (curves predicted)")
    ax.set_title(title, fontsize=11)
    model = advice.cost_model
    note = (f"c = t_draft/t_target = {model.cost_ratio:.3f}, verify slope b = {model.verify_slope:.2f}: "
            f"{model.source}")
    wrapped = textwrap.wrap(note, 150)
    # under the axes, so the note never covers a curve
    fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=7, color="dimgray", va="bottom")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", title="class (best k, marked *)", title_fontsize=8)
    fig.tight_layout(rect=(0.0, 0.025 * (len(wrapped) + 1), 1.0, 1.0))
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
                verify_slope: float = 0.0, eos_token_ids: Sequence[int] | None = None,
                runner: Runner | None = None, step_times: StepTimesRecord | None = None,
                reference: Reference | None = None, models: HfModels | None = None,
                archs: tuple[ModelArch, ModelArch] | None = None, stated: CostModel | None = None,
                agreement: Sequence[PromptAgreement] | None = None,
                host_costs: CostMeasurement | None = None,
                draft_identity: dict[str, Any] | None = None) -> PairAdvice:
    """Reference (cached), teacher-forced agreement, predicted steps for every k, and advice.

    A validation hands what it holds already: its `reference`, its `models` (the target it loaded for the
    reference is not loaded again), both models' `archs` (their parsed config.json), and the `agreement`
    and `host_costs` (the transformers forwards below) it computed before loading the artifact, so no
    transformers model is held beside the artifact's runner.

    Where c and b come from, first that applies: `cost_ratio` (given, with `verify_slope`); recorded
    `step_times`; the artifact's own step programs when `runner` (the validation run's) has them; a
    stated bytes-read model (`stated`, for a build not compiled yet, or of a runner whose backend states
    one: neuron); else transformers forwards on this host, named as such. With a runner whose artifact has
    the target-alone programs, the decode speedup at its k is also measured per class and judged against
    the prediction, except with recorded `step_times`: they are the serving hardware's, and this host's
    decode is not.
    """
    models = models or HfModels()
    eos = list(eos_token_ids) if eos_token_ids is not None else list(read_arch(target_dir).eos_token_id)
    if reference is None:
        reference = get_reference(target_dir, target_identity, rendered, max_new_tokens=max_new_tokens,
                                  dtype=dtype, eos_token_ids=eos, cache_dir=cache_dir, models=models)
    if agreement is None:  # cached by the draft's content when it is given (validate/acceptance.py)
        agreement = get_agreement(target_dir, draft_dir, draft_identity or {}, reference, dtype=dtype,
                                  cache_dir=cache_dir, models=models)
    table = predict(agreement, ks)
    decode: list[DecodeSpeed] = []
    if runner is not None and runner.target_alone and step_times is None:  # recorded times: other hardware
        by_class: dict[str, list[list[int]]] = {}
        for prompt in rendered:
            by_class.setdefault(prompt.cls, []).append(list(prompt.ids))
        decode = measure_decode(runner, by_class, max_new_tokens, eos)
        if cost_ratio is None:
            step_times = runner.step_times()
    measurement = None
    if cost_ratio is not None:
        model = CostModel(cost_ratio, verify_slope, source="given")
    elif step_times is not None:
        model = cost_model_from_times(step_times)
    elif stated is not None:
        model = stated
    elif runner is not None and (stated := stated_bytes_model(
            runner.description.backend, runner.spec,
            *(archs or (read_arch(target_dir), read_arch(draft_dir))))) is not None:
        model = stated  # this host's CPU says nothing about a memory-bound device step (neuron)
    else:
        measurement = host_costs or measure_costs(target_dir, draft_dir, dtype=dtype, models=models)
        why = "" if runner is None else f" ({TARGET_ALONE_HINT})"  # an artifact without target-alone programs
        model = CostModel(measurement.cost_ratio, verify_slope, source=HOST_FORWARDS + why)
    advice = advise(table, model, measurement, decode=decode, step_times=step_times)
    return PairAdvice(reference=reference, table=table, advice=advice)
