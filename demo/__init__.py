"""The demo: the main job on embedded defaults, on any machine, in a few minutes.

It makes a tiny Qwen3 target (real architecture and 151,936-token vocabulary, random weights) with the
real Qwen3 tokenizer, and a draft that is a slightly perturbed copy, so the draft agrees with the
target on most but not all tokens (acceptance between 0 and 1, like a real pair). Then it runs
compile-fused on a 4-config matrix on the cpu backend: compile, greedy gate, k advice, publish to a
local store. Run it twice: the second run finds everything published and compiles nothing.
"""

from __future__ import annotations

from pathlib import Path

from fusedspec.compile.runconfig import RunConfig, run_config_from_dict
from fusedspec.core.settings import Settings
from fusedspec.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir

DRAFT_NOISE = 0.02  # relative noise on every weight: ~80% teacher-forced agreement on the tiny pair
# The tiny pair's draft is as large as its target, so a measured step-cost ratio would be ~1 and no k
# could pay off. The demo advises as if the draft cost a tenth of the target, about what Qwen3-1.7B
# costs next to Qwen3-32B per decode step on Trainium; `fusedspec advise` measures it for real pairs.
DEMO_COST_RATIO = 0.1


def demo_models(settings: Settings) -> tuple[Path, Path]:
    """The demo's target and draft checkpoint directories (made once, then reused)."""
    root = settings.work_dir / "demo"
    tokenizer = qwen3_tokenizer_dir(root)
    target = make_tiny_qwen3(root / "tiny-qwen3-target", tokenizer, seed=1)
    draft = derive_draft(target, root / "tiny-qwen3-draft", noise=DRAFT_NOISE, seed=3)
    return target, draft


def demo_config(target: Path, draft: Path, publish_uri: str | None) -> RunConfig:
    return run_config_from_dict({
        "target": str(target),
        "draft": str(draft),
        "backend": "cpu",
        "matrix": {"tp_degree": [1, 2], "seq_len": [256], "speculation_length": [3, 5], "batch_size": [1],
                   "dtype": ["float32"]},
        "validation": {"prompts": "default", "max_new_tokens": 24, "cost_ratio": DEMO_COST_RATIO},
        # exported programs, not the AOTInductor default: the demo's tiny models load in a second either
        # way, and four AOTInductor compiles would add minutes on a 2-core machine
        "compile": {"aot_inductor": False},
        "publish": {"uri": publish_uri},
    }, source="demo config")
