"""The cpu runner on compiled artifacts: the sharded weights are what runs, a fresh process without
transformers generates the same tokens, EOS and length limits, more prompts than lines, prompt errors,
AOTInductor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from fusedspec.compile.backend import get_backend
from fusedspec.core.errors import ArtifactError, PromptError
from tests.fixtures.cpu_artifacts import NEW_TOKENS

# Builds shared with test_cpu_equivalence (same keys: compiled once per session).
TP2 = {"tp": 2, "k": 2, "batch": 1, "draft": "cut"}
TP4 = {"tp": 4, "k": 4, "batch": 4, "draft": "unrelated"}


def _edit_shard(artifact: Path, rank: int, name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    path = artifact / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"
    tensors = load_file(path)
    tensors[name] = change(tensors[name]).contiguous()
    save_file(tensors, path)


def test_a_perturbed_shard_changes_the_tokens(build_tiny: Callable[..., Path], tmp_path: Path,
                                              tiny_prompts: list[list[int]],
                                              hf_reference: list[list[int]]) -> None:
    """Rank 1's slice of one q_proj is only ever read from tp1's file: damage it and the output moves."""
    copy = tmp_path / "artifact"
    shutil.copytree(build_tiny(**TP2), copy)
    _edit_shard(copy, 1, "target_model.layers.0.self_attn.q_proj.weight", lambda t: t.flip(0) * 3)
    gen = get_backend("cpu").load(copy).generate(tiny_prompts[:3], 12)
    assert gen.tokens != [ref[:12] for ref in hf_reference[:3]]


def test_a_replicated_tensor_that_differs_between_ranks_is_refused(build_tiny: Callable[..., Path],
                                                                   tmp_path: Path) -> None:
    copy = tmp_path / "artifact"
    shutil.copytree(build_tiny(**TP2), copy)
    _edit_shard(copy, 1, "draft_model.norm.weight", lambda t: t + 1)
    with pytest.raises(ArtifactError, match=r"tp1_sharded_checkpoint.safetensors: replicated tensor "
                                            r"'draft_model.norm.weight' differs from rank 0"):
        get_backend("cpu").load(copy)


def test_a_fresh_process_without_transformers_generates_the_same_tokens(
        build_tiny: Callable[..., Path], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    artifact = build_tiny(**TP4)
    script = (
        "import json, sys\n"
        "from compile.backend import get_backend\n"
        f"gen = get_backend('cpu').load({str(artifact)!r}).generate(json.loads(sys.argv[1]), 16)\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
        "print(json.dumps(gen.tokens))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, json.dumps(tiny_prompts[:4])], capture_output=True,
                          text=True, cwd=Path(__file__).parent.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [ref[:16] for ref in hf_reference[:4]]


def test_eos_and_length_limits_cut_rows_and_their_last_step(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    runner = cpu_runner(build_tiny(tp=1, k=7, batch=4, draft="copy"))
    ref = hf_reference[0]
    eos = ref[9]  # pretend the target's 10th token is an end-of-sequence token
    stop = ref.index(eos) + 1
    gen = runner.generate(tiny_prompts[:1], NEW_TOKENS, eos_token_ids=[eos])
    assert gen.tokens == [ref[:stop]]
    assert sum(gen.accepted[0]) + 1 == stop and gen.accepted[0][-1] <= 7

    gen = runner.generate(tiny_prompts[:2], 11)
    assert gen.tokens == [r[:11] for r in hf_reference[:2]]
    assert gen.accepted == [[7, 3], [7, 3]]  # the copy draft would accept 7: the last step is cut to 3

    gen = runner.generate(tiny_prompts[:2], 1)  # only the context-encoding token: no fused step
    assert gen.tokens == [[r[0]] for r in hf_reference[:2]] and gen.accepted == [[], []]


def test_prompts_beyond_the_batch_take_the_lines_that_free_up(
        build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    """5 prompts on 4 lines: the fifth waits for the first line to free; each prompt gets the tokens and
    steps it gets alone, and the free lines that ride along in its step change nothing."""
    runner = cpu_runner(build_tiny(tp=1, k=7, batch=4, draft="copy"))
    gen = runner.generate(tiny_prompts[:5], 8)
    assert gen.tokens == [r[:8] for r in hf_reference[:5]]
    assert gen.accepted == [runner.generate([prompt], 8).accepted[0]
                            for prompt in tiny_prompts[:5]] == [[7]] * 5
    assert gen.timings["decode_steps"] == 2


def test_bad_prompts_are_refused_before_running(build_tiny: Callable[..., Path],
                                                cpu_runner: Callable[[Path], Any]) -> None:
    runner = cpu_runner(build_tiny(**TP2))  # seq_len 128, context 128, batch 1
    with pytest.raises(PromptError, match=r"prompt 1 has 129 tokens but this artifact was compiled for "
                                          r"prompts of at most 128"):
        runner.generate([[1, 2], [5] * 129], 4)
    with pytest.raises(PromptError,
                       match=r"prompt 0 has 100 tokens \+ max_new_tokens=29 = 129 > seq_len=128"):
        runner.generate([[5] * 100], 29)
    with pytest.raises(PromptError, match="prompt 0 is empty"):
        runner.generate([[]], 4)
    with pytest.raises(PromptError, match=r"token id 151936 outside the vocabulary \[0, 151936\)"):
        runner.generate([[151936]], 4)
    with pytest.raises(PromptError, match="max_new_tokens=0 must be a positive integer"):
        runner.generate([[1]], 0)


def test_a_directory_that_is_not_an_artifact_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no build.json; this is not a fusedspec artifact"):
        get_backend("cpu").load(tmp_path)


@pytest.mark.slow
def test_aot_inductor_packages_give_the_same_tokens(build_tiny: Callable[..., Path],
                                                    cpu_runner: Callable[[Path], Any],
                                                    tiny_prompts: list[list[int]],
                                                    hf_reference: list[list[int]]) -> None:
    artifact = build_tiny(**TP2, aot_inductor=True)
    assert sorted(p.name for p in (artifact / "programs").iterdir()) == [
        "context_encoding.aoti.pt2", "fused_step.aoti.pt2"]
    gen = cpu_runner(artifact).generate(tiny_prompts, NEW_TOKENS)
    assert gen.tokens == hf_reference
    assert gen.accepted == cpu_runner(build_tiny(**TP2)).generate(tiny_prompts, NEW_TOKENS).accepted


# Built with the target-alone programs; shared by the two tests below (compiled once per session).
PLAIN = {"tp": 2, "k": 3, "batch": 4, "draft": "copy", "target_alone": True}


def test_target_alone_is_plain_greedy_through_the_same_weights(
        build_tiny: Callable[..., Path], tiny_prompts: list[list[int]],
        hf_reference: list[list[int]]) -> None:
    """speculate=False runs the target-alone programs: Hugging Face greedy's tokens, one per step; the same
    artifact still speculates."""
    runner = get_backend("cpu").load(build_tiny(**PLAIN))
    plain = runner.generate(tiny_prompts, NEW_TOKENS, speculate=False)
    assert plain.tokens == hf_reference
    assert plain.accepted == [[1] * (len(tokens) - 1) for tokens in plain.tokens]
    fused = runner.generate(tiny_prompts, NEW_TOKENS)
    assert fused.tokens == hf_reference
    assert sum(map(len, fused.accepted)) < sum(map(len, plain.accepted))  # the copy draft is accepted


def test_context_length_follows_the_batch_from_one_token_to_the_longest(
        build_tiny: Callable[..., Path], tiny_target: Path) -> None:
    """The context programs take the batch's own prompt length (dynamic, 2..max_context_length): a batch
    mixing a one-token prompt with a 96-token one, then a one-token prompt alone (padded to the floor of
    2), give Hugging Face greedy's tokens, speculating and not."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    prompts = [[9707], [(7 * i) % 5000 + 100 for i in range(96)], [9707, 1879, 0]]

    def hf(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                             pad_token_id=151643)
        return out[0, len(prompt):].tolist()

    reference = [hf(prompt) for prompt in prompts]
    runner = get_backend("cpu").load(build_tiny(**PLAIN))
    for speculate in (True, False):
        assert runner.generate(prompts, 24, speculate=speculate).tokens == reference
        assert runner.generate(prompts[:1], 24, speculate=speculate).tokens == reference[:1]


def test_plain_greedy_needs_the_target_alone_programs(build_tiny: Callable[..., Path],
                                                      tiny_prompts: list[list[int]]) -> None:
    runner = get_backend("cpu").load(build_tiny(**TP2))
    with pytest.raises(ArtifactError, match=r"no target-alone programs.*compile option target_alone: true"):
        runner.generate(tiny_prompts[:1], 4, speculate=False)
