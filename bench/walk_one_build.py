"""The walk of one planned build from `fusedspec run` to its manifest, counted: what each stage reads again.

    nice -n 19 .venv/bin/python bench/walk_one_build.py

One cpu build of the demo's tiny pair (tp 1, seq_len 64, k 3, exported programs, a 2-prompt file, 8 new
tokens) through `fusedspec run` in this process (Prefect's ephemeral mode), published to a directory store
in a fresh work dir. Counted while it runs:

  - every file opened by Python (the interpreter's `open` audit event: our readers, json, transformers'
    config reads), grouped as the model configs, each document and the artifact's files, reads and writes
    apart; native readers (safetensors' Rust, torch's zip reader) raise no audit event and are not counted;
  - calls of the functions that parse or load: load_settings, backend_plugins (the one variable a backend
    lookup reads), plan_run, read_config (a config.json parsed), Document.read per document class,
    transformers' from_pretrained per model directory;
  - the pipeline's stages as the run logs them.

Asserts nothing; prints one table. Its figures, before and after issue 22's third point, are in
bench/RESULTS.md ("The walk of one build, counted").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ('{"id": "count", "class": "sequence", "text": "1, 2, 3, 4, 5, 6, 7,"}\n'
           '{"id": "story", "class": "prose", "text": "Once upon a time, a small robot"}\n')
WATCHED = ("config.json", "build.json", "validation.json", "manifest.json", "programs.json", "tokenizer.json")


def rebind(module_attr: tuple[str, str], counts: Counter[str], label: str) -> None:
    """Count calls of a module-level function wherever it was imported by name."""
    import importlib

    module = importlib.import_module(module_attr[0])
    original = getattr(module, module_attr[1])

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[label] += 1
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        ours = getattr(loaded, "__name__", "").startswith("fusedspec")
        if ours and getattr(loaded, module_attr[1], None) is original:
            setattr(loaded, module_attr[1], counted)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="walk-", dir=os.environ.get("TMPDIR")))
    os.environ["FUSEDSPEC_WORK_DIR"] = str(work / "work")
    from fusedspec.core.settings import load_settings
    from fusedspec.demo import demo_models

    shared = load_settings().__class__(work_dir=Path(os.environ.get("WALK_MODELS_WORK", ROOT / ".work")))
    target, draft = demo_models(shared)  # the demo's pair, made once in the project's work dir
    prompts = work / "prompts.jsonl"
    prompts.write_text(PROMPTS)
    config = work / "run.yaml"
    config.write_text(json.dumps({
        "target": str(target), "draft": str(draft), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                   "dtype": ["float32"]},
        "validation": {"prompts": str(prompts), "max_new_tokens": 8, "cost_ratio": 0.1},
        "compile": {"aot_inductor": False}, "publish": {"uri": str(work / "store")}}))

    import transformers

    import fusedspec.compile.documents.base as documents
    import fusedspec.flows.cli  # noqa: F401 - every module the run uses, imported before the counters bind
    import fusedspec.flows.commands.run  # noqa: F401
    import fusedspec.flows.pipeline  # noqa: F401

    calls: Counter[str] = Counter()
    counted = ((("fusedspec.core.settings", "load_settings"), "load_settings"),
               (("fusedspec.core.settings", "backend_plugins"), "backend_plugins"),
               (("fusedspec.compile.modelconfig", "read_config"), "read_config (config.json parsed)"),
               (("fusedspec.flows.planning", "plan_run"), "plan_run"))
    for target_fn, label in counted:
        rebind(target_fn, calls, label)
    read = documents.Document.read.__func__  # type: ignore[attr-defined]

    def counted_read(cls: Any, path: Path) -> Any:
        calls[f"{cls.__name__}.read"] += 1
        return read(cls, path)

    documents.Document.read = classmethod(counted_read)  # type: ignore[assignment, method-assign]
    loads: Counter[str] = Counter()
    for auto in (transformers.AutoModelForCausalLM,):
        original = auto.from_pretrained.__func__

        def counted_load(cls: Any, path: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            loads[Path(str(path)).name] += 1
            return _original(cls, path, *args, **kwargs)

        auto.from_pretrained = classmethod(counted_load)  # type: ignore[method-assign]

    opened: Counter[tuple[str, str, str]] = Counter()
    builds = str(work / "work" / "builds")
    roots = {str(target): "target", str(draft): "draft"}

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
            return
        path = os.fsdecode(args[0])
        mode = args[1] if isinstance(args[1], str) else ""
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR))
        kind = "write" if writing else "read"
        name = os.path.basename(path)
        owner = next((role for root, role in roots.items() if path.startswith(root + os.sep)), None)
        if path.startswith(builds):
            rel = path[len(builds):].split(os.sep, 2)[-1]
            opened[("artifact", rel, kind)] += 1
        elif name in WATCHED:
            opened[(owner or "other", name, kind)] += 1

    sys.addaudithook(audit)
    from fusedspec.flows.cli import main as cli

    code = cli(["run", str(config)])
    io = Path("/proc/self/io").read_text() if Path("/proc/self/io").exists() else ""
    print(f"\nfusedspec run exit {code}; work dir {work}\n")
    print("| counted | times |\n|---|---|")
    for label, count in sorted(calls.items()):
        print(f"| {label} | {count} |")
    for name, count in sorted(loads.items()):
        print(f"| from_pretrained {name} | {count} |")
    print("\n| where | file | opened to | times |\n|---|---|---|---|")
    for (where, name, kind), count in sorted(opened.items()):
        print(f"| {where} | {name} | {kind} | {count} |")
    rchar = next((line.split()[1] for line in io.splitlines() if line.startswith("rchar")), "n/a")
    print(f"\nbytes read by this process through read(2): {rchar}")


if __name__ == "__main__":
    main()
