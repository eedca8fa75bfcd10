"""What a compile-fused run shows in the Prefect UI: its name, a table of builds, a table of their stages, a
markdown summary with each build's version and the k-advice plot, all under artifact keys of its model pair
(so each pair keeps its own history).

Plain functions over the plan and the summary; the flow calls `publish_run_artifacts` once at the end.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from typing import Any

from fusedspec.compile.documents.validation import AdviceRecord
from fusedspec.compile.runconfig import RunConfig
from fusedspec.flows.planning import RunPlans, short_name
from fusedspec.flows.summary import (
    RunSummary,
    advice_lines,
    build_name,
    built_ranking,
    decode_cells,
    decode_rows,
)
from fusedspec.validate.acceptance import OVERALL
from fusedspec.validate.draft_choice import DraftRanking, ranking_of

MAX_KEY = 100


def run_name() -> str:
    """The flow run's name, from its `config` parameter (see `describe_run`)."""
    from prefect.runtime import flow_run

    config: Any = flow_run.parameters.get("config")
    if isinstance(config, dict):  # a deployment run's parameters, as JSON
        try:
            config = RunConfig.model_validate(config)
        except ValueError:
            return "compile-fused"  # the plan task names what is wrong with it
    return describe_run(config) if isinstance(config, RunConfig) else "compile-fused"


def describe_run(config: RunConfig) -> str:
    """A run's name from its models and matrix: `Qwen3-32B+Qwen3-1.7B tp32 k5,7 (4 builds)`, the drafts
    joined by commas in a run of several (`Qwen3-32B+Qwen3-1.7B,Qwen3-0.6B ...`)."""
    matrix = config.matrix
    tps = ",".join(str(t) for t in matrix.tp_degree)
    ks = ",".join(str(k) for k in matrix.speculation_length)
    size = matrix.size() * len(config.drafts)
    drafts = ",".join(short_name(d) for d in config.drafts)
    return f"{short_name(config.target)}+{drafts} tp{tps} k{ks} ({size} build{'s' if size != 1 else ''})"


def artifact_key(plans: RunPlans, what: str) -> str:
    """A Prefect artifact key per target and drafts (lowercase letters, digits and dashes). Several drafts
    are a digest of their store names, in any order: up to 8 names would not fit the key's 100 characters,
    and a cut key would give two different comparisons one history."""
    drafts = sorted(plan.draft.store_name for plan in plans.plans)
    digest = hashlib.sha256("\n".join(drafts).encode()).hexdigest()[:12]
    named = drafts[0] if len(drafts) == 1 else f"drafts-{digest}"
    pair = f"{plans.target.store_name}-{named}"
    slug = re.sub(r"[^a-z0-9]+", "-", pair.lower()).strip("-")
    return f"fusedspec-{slug}"[: MAX_KEY - len(what) - 1].rstrip("-") + f"-{what}"


def table_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """One row per build, numbers only, so the table fits a browser window (1400 px, the UI's side panels
    included): status, what the build did, measured and predicted tokens per fused step, predicted speedup at
    the build's k, near-ties, and the build's seconds (the stages table says where they went). The long texts,
    each version URI, a failure's reason and the decode speedup measured on the build, are in the summary."""
    rows = []
    for o in summary.outcomes:
        rows.append({
            **({"draft": short_name(o.draft)} if summary.several() else {}),
            "config": o.slug,
            "status": (o.status + (f" ({o.failed_stage})" if o.failed_stage else "")
                       + (" repaired" if o.repaired else "")),
            "work": o.work,  # compile, reuse programs (of its graph key), publish build, reuse version
            "tokens/step": _number(o.tokens_per_step),
            "predicted": _number(o.predicted_tokens_per_step),
            "speedup": _number(_speedup_at(o.advice or summary.advice, o.spec.k)),
            "near-ties": o.near_ties,
            "seconds": _number(o.seconds),
        })
    for left in summary.limit.left_out if summary.limit is not None else []:  # why: the summary's Left out
        rows.append({**({"draft": short_name(left.draft)} if summary.several() else {}), "config": left.slug,
                     "status": "left out", "work": "-", "tokens/step": "", "predicted": "", "speedup": "",
                     "near-ties": "", "seconds": ""})
    return rows


def stage_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """A row per stage per build (claim, download, compile, validate, publish: back to back, so each build's
    rows add up to its seconds), with what the stage moved."""
    return [{"config": build_name(summary, o), "stage": t.stage, "seconds": _number(t.seconds),
             "moved": t.detail}
            for o in summary.outcomes for t in o.stages]


def build_lines_md(summary: RunSummary) -> list[str]:
    """Each build's version (`fusedspec verify <it>` checks it) or why there is none, and the decode speedup
    per class predicted and measured on the build (with target-alone programs)."""
    lines = []
    for o in summary.outcomes:
        where = f"`{o.version_uri}`" if o.version_uri else f"{o.failed_stage}: {_first_line(o.reason)}"
        lines.append(f"- `{build_name(summary, o)}` {o.status}: {where}")
        rows = decode_rows(o)
        if rows:
            lines.append(f"  - decode speedup at k={o.spec.k}, predicted / measured (ratio): "
                         f"{decode_cells(rows)}")
    return lines


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:160] if lines else ""


def _number(value: float | None) -> float | str:
    return "" if value is None else round(value, 2)


def _speedup_at(advice: AdviceRecord | None, k: int) -> float | None:
    """The predicted speedup over the target alone at `k`, over all prompt classes."""
    overall = next((c for c in advice.classes if c.cls == OVERALL), None) if advice is not None else None
    return next((row.speedup for row in overall.by_k if row.k == k), None) if overall is not None else None


def markdown_summary(summary: RunSummary, plot_png: bytes | None) -> str:
    c = summary.counts
    md = [f"# {_models(summary)} ({summary.backend})", "",
          f"**{c.configs}** configs: **{c.compiled}** compiled, **{c.programs_reused}** from reused "
          f"programs, **{c.published}** published, "
          f"**{c.reused}** reused, **{c.failed}** failed; {c.bytes_uploaded:,} bytes uploaded.", "",
          f"Versions are under `{summary.store}`; check one with `fusedspec verify <version>`.", ""]
    failed = [o for o in summary.outcomes if o.status == "failed"]
    if failed:
        md += ["## Failed", *[f"- `{build_name(summary, o)}` ({o.failed_stage}): {_first_line(o.reason)}"
                              for o in failed], ""]
    md += ["## Builds", "", *build_lines_md(summary), ""]
    if summary.limit is not None:
        md += [f"## Left out before compiling (matrix.top_per_class {summary.limit.top_per_class})", "",
               "Predicted from each draft's k advice on the downloaded models; the advice below ranks the "
               "built (draft, k) only.", "",
               *[f"- `{_left_out_name(summary, left.draft, left.slug)}`: {left.reason}"
                 for left in summary.limit.left_out],
               *([] if summary.limit.left_out else ["- none: every build was among the first of some class"]),
               ""]
    md += ["## Draft and k advice" if summary.several() else "## k advice", "",
           *[f"    {line}" for line in advice_lines(summary)], ""]
    if plot_png:
        md += [f"![predicted speedup vs k]({png_data_uri(plot_png)})", ""]
    return "\n".join(md)


def _left_out_name(summary: RunSummary, draft: str, slug: str) -> str:
    return f"{short_name(draft)} {slug}" if summary.several() else slug


def _models(summary: RunSummary) -> str:
    """`target + draft`, the drafts joined by commas in a run of several."""
    return f"{short_name(summary.target)} + {', '.join(short_name(d) for d in summary.drafts)}"


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def advice_plot(summary: RunSummary, plans: RunPlans) -> bytes | None:
    """The speedup-vs-k plot of the run's advice, rendered here (no download of what was just uploaded).
    Each class is marked with the run's own recommendation (a built (draft, k), or none), so the plot never
    names a k the summary advises against. A run of several drafts draws one curve per draft."""
    if summary.advice is None:
        return None
    import io

    from fusedspec.validate.advice import plot_record
    from fusedspec.validate.draft_choice import plot_drafts

    buffer = io.BytesIO()
    if summary.several():
        plot_drafts({short_name(d): record for d, record in summary.draft_advice.items()}, buffer,
                    title=f"Predicted speedup vs k: {_models(summary)}",
                    ranking=_short_ranking(summary))
        return buffer.getvalue()

    chosen = {r.cls: r for r in summary.recommendations}
    classes = []
    for cls in summary.advice.classes:
        pick = chosen.get(cls.cls)
        k = pick.k if pick is not None else None
        best = pick.predicted_speedup if pick is not None and k is not None else None
        classes.append(cls.model_copy(update={"recommended_k": k, "pays_off": k is not None,
                                              "best_speedup": best}))
    advice = summary.advice.model_copy(update={"classes": classes,
                                               "recommended_k": {c.cls: c.recommended_k for c in classes}})
    plot_record(advice, buffer, title=f"Predicted speedup vs k: {_models(summary)}",
                mark_ks=sorted({planned.spec.k for _, planned in plans.builds}))
    return buffer.getvalue()


def _short_ranking(summary: RunSummary) -> DraftRanking | None:
    """The run's ranking of its built (draft, k), each draft by its short name (the plot's legend)."""
    ranking = built_ranking(summary.outcomes, summary.drafts)
    if ranking is None:
        return None
    options = {cls: [dataclasses.replace(o, draft=short_name(o.draft)) for o in found]
               for cls, found in ranking.options.items()}
    return ranking_of([short_name(d) for d in ranking.drafts], ranking.classes, options,
                      {short_name(d): source for d, source in ranking.cost_sources.items()})


def publish_run_artifacts(plans: RunPlans, summary: RunSummary) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    pair = _models(summary)
    create_table_artifact(table=table_rows(summary), key=artifact_key(plans, "builds"),
                          description=f"Builds of {pair} ({summary.backend}): status, tokens per step "
                                      "measured and predicted, predicted speedup, near-ties, seconds "
                                      "(versions: the summary)")
    create_table_artifact(table=stage_rows(summary), key=artifact_key(plans, "stages"),
                          description=f"Where each build's seconds went ({pair}): its stages, back to back, "
                                      "and what each moved")
    create_markdown_artifact(markdown_summary(summary, advice_plot(summary, plans)),
                             key=artifact_key(plans, "summary"),
                             description=f"Run summary and k advice for {pair}")
