"""How well the k advice predicts what an artifact does: predicted against measured decode speedup, per run.

    nice -n 19 .venv/bin/python bench/advice_accuracy.py --pair real [--ks 4,8] [--runs 3]
        [--packaging export,aoti] [--max-new-tokens 32] [--per-class N] [--dtype bfloat16]
    .venv/bin/python bench/advice_accuracy.py --pair tiny  (the demo's tiny Qwen3 pair: minutes, for a check)

Pairs: `real` is Qwen2.5-Coder-1.5B-Instruct + 0.5B-Instruct (tests.support.pypi_models: multi-GB download
and conversion the first time, cached under the work dir); `tiny` the demo's pair (demo).
For each k and packaging (torch.export programs, AOTInductor), one child process builds a cpu artifact
(tp 1, batch 1, with the target-alone programs) and validates it `--runs` times with `fusedspec validate`'s
code (validate.greedy.validate_artifact). Each validation times the artifact's own programs for c and b,
predicts the decode speedup per class from them, and measures it (target alone against fused, same
artifact). Prompts: the shipped set's chat variant, every class but prose relabelled `structured`
(--per-class N: the first N of each, the structured ones one shipped class after another).
Prints, per build and class, predicted / measured (ratio) of every run and the spread of the measured
speedup over the runs; then c and b per run. Nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROSE = "prose"


def pair_dirs(pair: str) -> tuple[Path, Path]:
    from fusedspec.core.settings import load_settings

    settings = load_settings()
    if pair == "tiny":
        from fusedspec.demo import demo_models

        return demo_models(settings)
    from tests.support.pypi_models import real_model_dir

    root = settings.work_dir / "real-models"
    return real_model_dir("qwen2.5-coder-1.5b", root), real_model_dir("qwen2.5-coder-0.5b", root)


def structured_and_prose(out: Path, per_class: int | None) -> Path:
    """The shipped prompt set with every class but prose named `structured` (two classes to compare); the
    first `per_class` of each when given (structured: one shipped class after another, first of each
    first)."""
    from fusedspec.validate.prompts import load_prompt_set

    prompts = load_prompt_set("default").prompts
    prose = [p for p in prompts if p.cls == PROSE]
    others = [p for p in prompts if p.cls != PROSE]
    firsts = list({p.cls: p for p in reversed(others)}.values())[::-1]
    structured = firsts + [p for p in others if p not in firsts]
    if per_class is not None:
        prose, structured = prose[:per_class], structured[:per_class]
    lines = [json.dumps({"id": p.id, "class": "structured", "text": p.text}) for p in structured]
    lines += [json.dumps({"id": p.id, "class": PROSE, "text": p.text}) for p in prose]
    out.write_text("\n".join(lines) + "\n")
    return out


def one_build(p: dict[str, Any]) -> dict[str, Any]:
    """Build one artifact, validate it p["runs"] times; per run the cost model and the decode rows."""
    from bench.decode_real_pair import stage_build  # the same build (tp 1, batch 1, target-alone programs)
    from fusedspec.compile.backend import read_build_description
    from fusedspec.core.settings import load_settings
    from fusedspec.validate.greedy import ValidationRequest, validate_artifact
    from fusedspec.validate.prompts import load_prompt_set

    settings = load_settings()
    built = stage_build({**p, "aoti": p["packaging"] == "aoti"})
    artifact, build_s = Path(built["artifact"]), built["seconds"]
    prompt_set = load_prompt_set(p["prompts"])
    runs = []
    for _ in range(p["runs"]):
        request = ValidationRequest(artifact, read_build_description(artifact), Path(p["target"]),
                                    Path(p["draft"]), prompt_set, max_new_tokens=p["max_new_tokens"],
                                    variants=("chat",))
        result = validate_artifact(request, settings)
        advice = result.document.advice
        assert advice is not None
        runs.append({"cost_model": advice.cost_model.model_dump(mode="json"),
                     "decode": [row.model_dump(mode="json") for row in advice.decode],
                     "recommended_k": advice.recommended_k})
    return {"artifact": str(artifact), "build_s": build_s, "runs": runs}


def child(params: dict[str, Any]) -> dict[str, Any]:
    """one_build in a fresh interpreter, so no two builds' weights share a process's memory."""
    out = Path(params["out"])
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(params)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"k={params['k']} {params['packaging']} failed (exit {done.returncode})")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def table(results: dict[tuple[int, str], dict[str, Any]], runs: int) -> list[str]:
    head = f"{'k':>2} {'programs':<8} {'class':<10} " + " ".join(f"{f'run {i + 1}: pred / meas (ratio)':<28}"
                                                            for i in range(runs)) + "  measured spread"
    lines = [head, "-" * len(head)]
    for (k, packaging), found in results.items():
        classes = [row["class"] for row in found["runs"][0]["decode"]]
        for cls in classes:
            rows = [next(r for r in run["decode"] if r["class"] == cls) for run in found["runs"]]
            cells = [f"{r['predicted_speedup']:.2f}x / {r['measured_speedup']:.2f}x ({r['ratio']:.2f})"
                     for r in rows]
            measured = [r["measured_speedup"] for r in rows]
            spread = (max(measured) - min(measured)) / statistics.median(measured)
            lines.append(f"{k:>2} {packaging:<8} {cls:<10} " + " ".join(f"{c:<28}" for c in cells)
                         + f"  {spread:.0%}")
    lines.append("")
    for (k, packaging), found in results.items():
        for i, run in enumerate(found["runs"]):
            model = run["cost_model"]
            lines.append(f"k={k} {packaging} run {i + 1}: c = {model['cost_ratio']:.3f}, "
                         f"b = {model['verify_slope']:.3f} ({model['source']}); advised "
                         f"{run['recommended_k']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--ks", default="4,8")
    parser.add_argument("--packaging", default="export,aoti", help="export, aoti or both")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--per-class", type=int, default=None,
                        help="the first N prompts of each class (default: all)")
    parser.add_argument("--dtype", default=None, help="default: float32 for tiny, bfloat16 for real")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of the builds whose results are saved already (an interrupted "
                            "run)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's parameters
    args = parser.parse_args()
    if args.one is not None:
        params = json.loads(args.one)
        Path(params["out"]).write_text(json.dumps(one_build(params)))
        return

    from fusedspec.core.settings import load_settings

    work = load_settings().work_dir / "bench-advice-accuracy"
    work.mkdir(parents=True, exist_ok=True)
    target, draft = pair_dirs(args.pair) if not args.table_only else (Path("-"), Path("-"))
    prompts = (structured_and_prose(work / "structured-and-prose.jsonl", args.per_class)
               if not args.table_only else Path("-"))
    dtype = args.dtype or ("float32" if args.pair == "tiny" else "bfloat16")
    results = {}
    for packaging in args.packaging.split(","):  # every k of the faster packaging first
        for k in [int(k) for k in args.ks.split(",")]:
            out = work / f"{args.pair}-k{k}-{packaging}.json"
            if args.table_only:
                if out.is_file():
                    results[(k, packaging)] = json.loads(out.read_text())
                continue
            started = time.perf_counter()
            params = {"target": str(target), "draft": str(draft), "k": k, "packaging": packaging,
                      "dtype": dtype, "runs": args.runs, "max_new_tokens": args.max_new_tokens,
                      "prompts": str(prompts), "out": str(out)}
            results[(k, packaging)] = child(params)
            print(f"  k={k} {packaging}: {time.perf_counter() - started:.0f} s", flush=True)
    print(f"\n{args.pair} pair, {dtype}, {args.max_new_tokens} new tokens, chat prompts, tp 1, batch 1")
    print("\n".join(table(results, args.runs)))


if __name__ == "__main__":
    main()
