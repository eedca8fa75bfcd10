"""Choosing the draft as well as k: every (draft, k) ranked per prompt class, and why the winner wins.

Each draft has its own k advice (validate.advice): its acceptance against the target's greedy reference and
its own cost model, since a smaller draft is cheaper per step (smaller c) but usually agrees less. The
ranking puts every (draft, k) of a class in order of predicted decode speedup under each draft's own c and
b, so one table answers what the write-up this product grew from tuned by hand (Qwen3-0.6B was the faster
draft, but accepted ~60% fewer tokens than 1.7B, and 1.7B with k = 7 won).

    ranking = rank_drafts({"hf://Qwen/Qwen3-1.7B": advice_a.record(),
                           "hf://Qwen/Qwen3-0.6B": advice_b.record()})
    ranking.best("overall")          # the (draft, k) to serve, or None: no draft pays off for the class
    ranking.explain("overall")       # the winner against each other draft, in words a user can act on

Ties go to the smaller k (less draft work and KV cache), then to the draft named first. A class where a
draft's built k measured slower than the target alone (validate.advice) gets no k from that draft, so
the ranking never advises a pair that was seen to lose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from fusedspec.compile.documents.validation import AdviceRecord, ClassAdviceRecord
from fusedspec.core.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """One (draft, k) of one class: its predicted speedup and what it rests on."""

    draft: str
    k: int
    speedup: float
    accepted_per_step: float  # draft tokens the target accepts per fused step at this k
    tokens_per_step: float  # tokens a fused step yields at this k (accepted + the target's own)
    step_cost: float  # one fused step at this k in target decode steps: 1 + b*(k-1) + k*c
    agreement: float | None  # the draft's teacher-forced agreement with the target over the class
    cost_ratio: float  # c = t_draft / t_target of this draft


@dataclass(frozen=True)
class DraftRanking:
    drafts: tuple[str, ...]  # in the order given
    classes: tuple[str, ...]  # in the first draft's order (the prompt file's, then "overall")
    options: Mapping[str, tuple[Option, ...]]  # class -> every (draft, k) that may serve it, best first
    cost_sources: Mapping[str, str]  # draft -> where its c and b came from

    def best(self, cls: str) -> Option | None:
        """The (draft, k) to serve `cls`, or None when no (draft, k) is predicted faster than the target."""
        ranked = self.options.get(cls, ())
        return ranked[0] if ranked and ranked[0].speedup > 1.0 else None

    def best_of(self, cls: str, draft: str) -> Option | None:
        return next((o for o in self.options.get(cls, ()) if o.draft == draft), None)

    def top(self, cls: str, n: int) -> list[Option]:
        """The first `n` (draft, k) of the class that beat the target alone."""
        return [o for o in self.options.get(cls, ()) if o.speedup > 1.0][:n]

    def first(self, cls: str, n: int) -> list[Option]:
        """The first `n` (draft, k) of the class, whether or not they beat the target alone: what the run
        config's `matrix.top_per_class` builds (validate.matrix_limit)."""
        return list(self.options.get(cls, ()))[:n]

    def explain(self, cls: str) -> str:
        """Why the class's winner wins: against each other draft's best k, its cost and its acceptance."""
        win = self.best(cls)
        if win is None:
            return f"[{cls}] no draft at any k is predicted faster than the target alone: do not speculate"
        lines = [f"[{cls}] serve draft {win.draft} at k = {win.k}: predicted {win.speedup:.2f}x"]
        for draft in self.drafts:
            if draft == win.draft:
                continue
            other = self.best_of(cls, draft)
            if other is None:
                lines.append(f"  {draft}: no k of it may serve this class "
                             "(measured slower than the target alone)")
                continue
            lines.append(f"  {draft}: best k = {other.k}, {other.speedup:.2f}x; {_against(other, win)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"drafts": list(self.drafts), "cost_sources": dict(self.cost_sources),
                "classes": {cls: {"best": _option_json(self.best(cls)),
                                  "ranked": [_option_json(o) for o in self.options.get(cls, ())]}
                            for cls in self.classes}}


def _against(other: Option, win: Option) -> str:
    """Why `other` (a draft's best k) loses to `win`: its draft step's cost and its acceptance against the
    winner's, then what decides, since speedup = tokens per fused step / cost of that step: 'its draft step is
    3.0x cheaper (c 0.050 against 0.150), but it accepts 61% fewer draft tokens per step; a fused step
    yields 1.90 tokens for 1.15 target steps, against 4.20 for 2.05'."""
    if math.isclose(other.speedup, win.speedup, rel_tol=1e-9):
        how = f"its smaller k ({win.k} against {other.k})" if win.k != other.k else "being named first"
        return f"tied at {win.speedup:.2f}x: {win.draft} wins by {how}"
    ratio = win.cost_ratio / other.cost_ratio
    if math.isclose(ratio, 1.0, rel_tol=0.005):
        cost, cheaper = f"its draft step costs the same (c {other.cost_ratio:.3f})", None
    elif ratio > 1:
        cost, cheaper = (f"its draft step is {ratio:.1f}x cheaper (c {other.cost_ratio:.3f} against "
                         f"{win.cost_ratio:.3f})"), True
    else:
        cost, cheaper = (f"its draft step is {1 / ratio:.1f}x costlier (c {other.cost_ratio:.3f} against "
                         f"{win.cost_ratio:.3f})"), False
    if other.accepted_per_step == 0:
        accept, fewer = "it accepts no draft token", True
    elif math.isclose(other.accepted_per_step, win.accepted_per_step, rel_tol=0.005):
        accept, fewer = "it accepts as many draft tokens per step", None
    elif other.accepted_per_step < win.accepted_per_step:
        accept = (f"it accepts {1 - other.accepted_per_step / win.accepted_per_step:.0%} fewer draft tokens "
                  "per step")
        fewer = True
    else:
        accept = (f"it accepts {other.accepted_per_step / win.accepted_per_step - 1:.0%} more draft tokens "
                  "per step")
        fewer = False
    joiner = "but" if cheaper is not None and fewer is not None and cheaper == fewer else "and"
    return (f"{cost}, {joiner} {accept}; a fused step at k = {other.k} yields {other.tokens_per_step:.2f} "
            f"tokens for {other.step_cost:.2f} target steps, against {win.tokens_per_step:.2f} for "
            f"{win.step_cost:.2f} at k = {win.k}")


def _option_json(option: Option | None) -> dict[str, object] | None:
    if option is None:
        return None
    return {"draft": option.draft, "k": option.k, "speedup": option.speedup,
            "accepted_per_step": option.accepted_per_step, "tokens_per_step": option.tokens_per_step,
            "step_cost": option.step_cost, "agreement": option.agreement, "cost_ratio": option.cost_ratio}


def rank_drafts(advice: Mapping[str, AdviceRecord]) -> DraftRanking:
    """Every (draft, k) per class, best predicted speedup first, from each draft's k advice."""
    if not advice:
        raise ConfigError("no draft to rank: give at least one --draft")
    drafts = tuple(advice)
    classes = tuple(c.cls for c in advice[drafts[0]].classes)
    for draft, record in advice.items():
        if tuple(c.cls for c in record.classes) != classes:
            raise ConfigError(f"draft {draft} was advised on other prompt classes than {drafts[0]}: advise "
                              "every draft on the same prompt set")
    options: dict[str, list[Option]] = {}
    for cls in classes:
        for draft, record in advice.items():
            options.setdefault(cls, []).extend(_options(draft, record,
                                                        next(c for c in record.classes if c.cls == cls)))
    return ranking_of(drafts, classes, options, {d: r.cost_model.source for d, r in advice.items()})


def ranking_of(drafts: Sequence[str], classes: Sequence[str], options: Mapping[str, Sequence[Option]],
               cost_sources: Mapping[str, str]) -> DraftRanking:
    """The ranking of the given options per class: best predicted speedup first; ties to the smaller k, then
    to the draft named first. The run's summary ranks the (draft, k) it built with it (flows.summary)."""
    order = {draft: i for i, draft in enumerate(drafts)}
    return DraftRanking(drafts=tuple(drafts), classes=tuple(classes), cost_sources=dict(cost_sources),
                        options={cls: tuple(sorted(options.get(cls, ()), key=lambda o: (-o.speedup, o.k,
                                                                                         order[o.draft])))
                                 for cls in classes})


def _options(draft: str, record: AdviceRecord, advice: ClassAdviceRecord) -> Sequence[Option]:
    measured_slower = any(d.cls == advice.cls and d.measured_speedup <= 1.0 for d in record.decode)
    if measured_slower:
        return []
    found = (option_at(draft, record, advice, row.k) for row in advice.by_k)
    return [option for option in found if option is not None]


def option_at(draft: str, record: AdviceRecord, advice: ClassAdviceRecord, k: int) -> Option | None:
    """The (draft, k) of one class under the draft's advice `record`,
    or None when it predicts nothing at k."""
    row = next((row for row in advice.by_k if row.k == k), None)
    if row is None or row.speedup is None or not row.steps:
        return None
    model = record.cost_model
    return Option(draft=draft, k=row.k, speedup=row.speedup,
                  accepted_per_step=row.accepted_draft_tokens / row.steps,
                  tokens_per_step=row.tokens / row.steps,
                  step_cost=1.0 + model.verify_slope * (row.k - 1) + row.k * model.cost_ratio,
                  agreement=advice.agreement, cost_ratio=model.cost_ratio)


def format_ranking(ranking: DraftRanking, *, top: int = 5) -> str:
    """Per class: the first `top` (draft, k) with speedup, acceptance and c, then why the winner wins."""
    width = max(len(d) for d in ranking.drafts)
    lines = ["drafts and their cost models:"]
    lines += [f"  {d}: {ranking.cost_sources[d]}" for d in ranking.drafts]
    costly = sorted({o.draft for options in ranking.options.values() for o in options if o.cost_ratio >= 1.0})
    lines += [f"  note: {d} has c >= 1, a draft step as slow as the target's: no k can pay off. Measured on "
              "a busy host, measure again on a quiet one or give --cost-ratio" for d in costly]
    for cls in ranking.classes:
        lines += ["", ranking.explain(cls), f"  {'draft':<{width}} {'k':>3} {'speedup':>8} {'acc/step':>8} "
                                            f"{'agree':>6} {'c':>6}"]
        for option in ranking.options[cls][:top]:
            agreement = "n/a" if option.agreement is None else f"{option.agreement:.2f}"
            lines.append(f"  {option.draft:<{width}} {option.k:>3} {option.speedup:>8.2f} "
                         f"{option.accepted_per_step:>8.2f} {agreement:>6} {option.cost_ratio:>6.3f}")
    return "\n".join(lines)


def plot_drafts(advice: Mapping[str, AdviceRecord], out: BinaryIO, *, title: str,
                ranking: DraftRanking | None = None) -> None:
    """Speedup vs k as PNG bytes: one panel per prompt class, one curve per draft, each class's winner by
    `ranking` (default: every k of each draft's advice ranked) starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranking = ranking or rank_drafts(advice)
    columns = min(3, len(ranking.classes))
    rows = -(-len(ranking.classes) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), dpi=110, squeeze=False)
    for ax, cls in zip(axes.flat, ranking.classes, strict=False):
        win = ranking.best(cls)
        for draft in ranking.drafts:
            record = next(c for c in advice[draft].classes if c.cls == cls)
            points = [(row.k, row.speedup) for row in record.by_k if row.speedup is not None]
            if not points:
                continue
            ks, speedups = zip(*points, strict=True)
            (line,) = ax.plot(ks, speedups, marker="o", markersize=3, linewidth=1.6,
                              label=f"{_short(draft)} (c {advice[draft].cost_model.cost_ratio:.3f})")
            if win is not None and win.draft == draft:
                ax.plot([win.k], [win.speedup], marker="*", markersize=14, color=line.get_color(),
                        markeredgecolor="black", zorder=5)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        verdict = f"{_short(win.draft)}, k={win.k}" if win is not None else "do not speculate"
        ax.set_title(f"{cls}: {verdict}", fontsize=9)
        ax.set_xlabel("k", fontsize=8)
        ax.set_ylabel("predicted speedup", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(ranking.classes):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


def _short(draft: str) -> str:
    """A draft's name in a plot panel: a Hub reference as given, a directory by its last part."""
    return draft if "://" in draft else draft.rstrip("/").rsplit("/", 1)[-1]
