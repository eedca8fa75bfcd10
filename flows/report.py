"""What a run tells people: the summary table, the markdown and plot for the Prefect UI, and the
same summary as plain text for the terminal. Plain functions over ConfigOutcomes; no Prefect here."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

from flows.pipeline import ConfigOutcome


def counts(outcomes: list[ConfigOutcome]) -> dict[str, int]:
    by_status = Counter(o.status for o in outcomes)
    return {
        "configs": len(outcomes),
        "compiled": sum(o.compiled for o in outcomes),
        "published": by_status["published"],
        "reused": by_status["reused"],
        "failed": by_status["failed"],
        "bytes_uploaded": sum(o.bytes_sent for o in outcomes),
        "files_uploaded": sum(o.files_uploaded for o in outcomes),
        "files_copied": sum(o.files_copied for o in outcomes),
    }


def table_rows(outcomes: list[ConfigOutcome]) -> list[dict[str, Any]]:
    """One row per config for the Prefect table artifact."""
    return [{
        "config": o.slug,
        "key": o.key[:16],
        "status": o.status + (f" ({o.failed_stage})" if o.failed_stage else ""),
        "tokens/step": o.tokens_per_step if o.tokens_per_step is not None else "",
        "predicted tokens/step": o.predicted_tokens_per_step if o.predicted_tokens_per_step is not None else "",
        "near-ties": o.near_ties,
        "verify": f"fusedspec verify {o.version_uri}" if o.version_uri else (o.reason or "")[:200],
    } for o in outcomes]


def advice_lines(advice: dict[str, Any] | None) -> list[str]:
    """The k advice of a validation report, one line per prompt class."""
    if not advice:
        return ["k advice: not available (no build was validated in this run)"]
    lines = []
    model = advice.get("cost_model") or {}
    ratio = model.get("cost_ratio")
    ratio_text = f"{ratio:.3f}" if isinstance(ratio, int | float) else "?"
    lines.append(f"k advice (draft/target step cost {ratio_text}, {model.get('source', '')}):")
    for cls in advice.get("classes", []):
        speedup = cls.get("best_speedup")
        speed_text = f"{speedup:.2f}x" if isinstance(speedup, int | float) else "-"
        agreement = cls.get("agreement")
        agree_text = f"{agreement:.2f}" if isinstance(agreement, int | float) else "-"
        note = "" if cls.get("pays_off") else "  (speculation does not pay off here)"
        lines.append(f"  {cls.get('class', '?'):<10} agreement {agree_text}  recommended k={cls.get('recommended_k')}"
                     f"  predicted speedup {speed_text}{note}")
    return lines


def text_summary(outcomes: list[ConfigOutcome], advice: dict[str, Any] | None) -> str:
    c = counts(outcomes)
    lines = [f"{c['configs']} config(s): {c['compiled']} compiled, {c['published']} published, "
             f"{c['reused']} reused (already published), {c['failed']} failed; "
             f"{c['bytes_uploaded']:,} bytes uploaded ({c['files_uploaded']} files sent, "
             f"{c['files_copied']} copied in the store)"]
    width = max((len(o.slug) for o in outcomes), default=10)
    for o in outcomes:
        tps = f"{o.tokens_per_step:.2f} tok/step" if o.tokens_per_step is not None else ""
        where = o.version_uri or f"{o.failed_stage}: {(o.reason or '').splitlines()[0][:160]}"
        lines.append(f"  {o.slug:<{width}}  {o.status:<9} {o.key[:12]}  {tps:<14} {where}")
    lines += advice_lines(advice)
    return "\n".join(lines)


def markdown_summary(outcomes: list[ConfigOutcome], advice: dict[str, Any] | None, plot_png: bytes | None,
                     *, target: str, draft: str, backend: str) -> str:
    c = counts(outcomes)
    md = [f"# compile-fused: {target} + {draft} ({backend})", "",
          f"**{c['configs']}** configs: **{c['compiled']}** compiled, **{c['published']}** published, "
          f"**{c['reused']}** reused, **{c['failed']}** failed; {c['bytes_uploaded']:,} bytes uploaded.", ""]
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        md += ["## Failed", *[f"- `{o.slug}` ({o.failed_stage}): {(o.reason or '').splitlines()[0]}" for o in failed], ""]
    md += ["## k advice", "", *[f"    {line}" for line in advice_lines(advice)], ""]
    if plot_png:
        md += [f"![speedup vs k]({png_data_uri(plot_png)})", ""]
    return "\n".join(md)


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
