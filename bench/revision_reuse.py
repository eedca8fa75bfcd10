"""What a new revision of a model costs next to its first build: revision A compiles, revision B reuses
programs.

    nice -n 19 .venv/bin/python bench/revision_reuse.py [--pair tiny|real] [--packaging aoti|export]

Revision A: the pair as it is. Revision B: the target with small Gaussian noise on every matrix (relative 1e-3
of each tensor's spread, as a fine-tune moves weights), same config.json. Both go through the pipeline a run
uses (flows.pipeline.process_build: build, greedy gate with its k advice, publish) into one fresh directory
store, in one process, A first. Printed per revision: builds compiled, wall time, bytes uploaded, files copied
inside the store, the gate's verdict; then B's time and bytes as ratios to A's.

Pairs: `tiny` is the demo's (2-layer Qwen3, real vocabulary): tp 1, 2 x k 3, 5, float32, 4 builds. `real` is
Qwen2.5-Coder-1.5B-Instruct with the 0.5B-Instruct draft (tests.support.pypi_models: a multi-GB download and
conversion the first time), bfloat16, tp 1 x k 4, batch 1: one build, about 10 GB of memory. Asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ('{"id": "code", "class": "structured", "text": "def fibonacci(n):"}\n'
           '{"id": "json", "class": "structured", "text": "Return the JSON object '
           '{\\"a\\": 1, \\"b\\": [1, 2"}\n'
           '{"id": "story", "class": "prose", "text": "Once upon a time, there lived a robot who"}\n')


def fine_tuned(source: Path, out: Path, scale: float, seed: int) -> Path:
    """`source` with noise of relative scale `scale` on every floating tensor, the config and tokenizer
    kept."""
    import torch
    from safetensors.torch import load_file, save_file

    if (out / "config.json").is_file():
        return out
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    gen = torch.Generator().manual_seed(seed)
    for path in sorted(source.glob("*.safetensors")):
        tensors = load_file(str(path))
        for name, tensor in tensors.items():
            if tensor.is_floating_point() and tensor.dim() >= 2:
                noise = (torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * scale
                         * tensor.float().std())
                tensors[name] = (tensor.float() + noise).to(tensor.dtype)
        save_file(tensors, str(out / path.name), metadata={"format": "pt"})
    for index in source.glob("*.safetensors.index.json"):
        shutil.copy2(index, out / index.name)
    return out


def pair(kind: str, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    from fusedspec.core.settings import load_settings

    if kind == "tiny":
        from fusedspec.demo import demo_models

        target, draft = demo_models(load_settings())
        matrix = {"tp_degree": [1, 2], "seq_len": [128], "speculation_length": [3, 5], "batch_size": [1],
                  "dtype": ["float32"]}
        return target, draft, matrix
    from tests.support.pypi_models import real_model_dir

    cache = load_settings().work_dir / "real-models"
    matrix = {"tp_degree": [1], "seq_len": [256], "speculation_length": [4], "batch_size": [1],
              "dtype": ["bfloat16"]}
    return real_model_dir("qwen2.5-coder-1.5b", cache), real_model_dir("qwen2.5-coder-0.5b", cache), matrix


def run_revision(target: Path, draft: Path, matrix: dict[str, Any], packaging: str, store: Path,
                 prompts: Path, settings: Any) -> dict[str, Any]:
    from fusedspec.compile.runconfig import run_config_from_dict
    from fusedspec.flows.pipeline import process_build
    from fusedspec.flows.planning import plan_run

    started = time.perf_counter()
    config = {"target": str(target), "draft": str(draft), "backend": "cpu", "matrix": matrix,
              "validation": {"prompts": str(prompts), "max_new_tokens": 16},
              "compile": {"aot_inductor": packaging == "aoti"}, "publish": {"uri": str(store)}}
    plan = plan_run(run_config_from_dict(config), settings)
    outcomes = [process_build(plan, planned, settings) for planned in plan.builds]
    return {"seconds": time.perf_counter() - started, "builds": len(outcomes),
            "compiled": sum(o.compiled for o in outcomes),
            "reused_programs": sum(o.programs_from is not None for o in outcomes),
            "bytes_sent": sum(o.bytes_sent for o in outcomes),
            "files_copied": sum(o.files_copied for o in outcomes),
            "gate": ", ".join(sorted({o.status if o.status != "failed" else f"failed in {o.failed_stage}"
                                      for o in outcomes})),
            "compile_s": sum(o.compile_seconds or 0.0 for o in outcomes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--packaging", choices=("aoti", "export"), default="aoti")
    args = parser.parse_args()

    from fusedspec.core.settings import Settings, load_settings

    base = load_settings()
    target, draft, matrix = pair(args.pair, base.work_dir)
    revision_b = fine_tuned(target, base.work_dir / "bench-revisions" / f"{target.name}-revision-b", 1e-3,
                            seed=7)
    with tempfile.TemporaryDirectory(dir=base.tmp_dir) as scratch:
        root = Path(scratch)
        settings = Settings(work_dir=root / "work")  # no builds, no program cache, no reference cache
        (root / "prompts.jsonl").write_text(PROMPTS)
        rows = {"A (first)": run_revision(target, draft, matrix, args.packaging, root / "store",
                                          root / "prompts.jsonl", settings),
                "B (new target weights)": run_revision(revision_b, draft, matrix, args.packaging,
                                                       root / "store", root / "prompts.jsonl", settings)}
    print(f"pair {args.pair}, packaging {args.packaging}, matrix {matrix}")
    header = f"{'revision':<24} {'builds':>6} {'compiled':>8} {'reused':>6} {'seconds':>8} " \
             f"{'compile s':>9} {'bytes sent':>12} {'copied':>6}  gate"
    print(header)
    for name, r in rows.items():
        print(f"{name:<24} {r['builds']:>6} {r['compiled']:>8} {r['reused_programs']:>6} "
              f"{r['seconds']:>8.1f} {r['compile_s']:>9.1f} {r['bytes_sent']:>12,} {r['files_copied']:>6}  "
              f"{r['gate']}")
    a, b = rows["A (first)"], rows["B (new target weights)"]
    print(f"B / A: wall time {b['seconds'] / a['seconds']:.2f}, build stage "
          f"{b['compile_s'] / a['compile_s']:.2f}, bytes uploaded "
          f"{b['bytes_sent'] / max(a['bytes_sent'], 1):.2f}")


if __name__ == "__main__":
    main()
