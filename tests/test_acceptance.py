"""Acceptance: the contract's step semantics, checked against a literal simulation of greedy speculative
decoding, and the teacher-forced agreement of real (tiny) Qwen3 drafts."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import load_settings
from fusedspec.registry.hub import resolve_model
from fusedspec.validate.acceptance import (
    OVERALL,
    PromptAgreement,
    accepted_per_step,
    get_agreement,
    parse_k_range,
    predict,
    teacher_forced_agreement,
)
from fusedspec.validate.hf_models import HfModels
from fusedspec.validate.prompts import load_prompt_set, load_tokenizer, render_prompts
from fusedspec.validate.reference import Reference, get_reference

SMALL_SET = [
    {"id": "rep", "class": "repeat", "text": "Repeat this line 5 times: all work and no play"},
    {"id": "seq", "class": "sequence", "text": "1, 2, 3, 4, 5, 6,"},
    {"id": "code", "class": "code", "text": "def add(a, b):"},
    {"id": "story", "class": "prose", "text": "Once upon a time, in a quiet village,"},
]
MAX_NEW = 16


def simulate_speculative(n: int, draft_right: list[bool], k: int) -> list[int]:
    """Greedy speculative decoding done literally on token values: the target's tokens are 100, 101, ...;
    the draft proposes the target's token at position j when draft_right[j], else a wrong one. Returns the
    tokens each fused step added. Independent of `accepted_per_step`'s counting formulation."""
    y = [100 + i for i in range(n)]  # y_1..y_n at indices 0..n-1
    out = [y[0]]  # y_1 from context encoding
    steps = []
    while len(out) < n:
        p = len(out)
        proposals = [y[j - 1] if j <= n and draft_right[j] else -1 for j in range(p + 1, p + k)]
        added = []
        for i, token in enumerate(proposals):  # the target verifies its own greedy token at each position
            if p + i < n and token == y[p + i]:
                added.append(token)
            else:
                break
        if p + len(added) < n:
            added.append(y[p + len(added)])  # the target's correction or bonus token
        added = added[: n - p]
        out += added
        steps.append(len(added))
    assert out == y
    return steps


def agreement_of(n: int, draft_right: list[bool]) -> PromptAgreement:
    return PromptAgreement(id="p", cls="c", n_tokens=n, draft_hits=tuple(draft_right[1:n + 1]),
                           target_flips=0)


def test_contract_example_by_hand() -> None:
    # N = 6; agree[2..6] = T T F T T
    prompt = agreement_of(6, [False, False, True, True, False, True, True])
    assert accepted_per_step(prompt, 3) == [3, 2]
    assert accepted_per_step(prompt, 2) == [2, 1, 2]


def test_steps_equal_a_literal_simulation_for_random_agreement() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 24)
        rate = rng.random()
        right = [False] + [rng.random() < rate for _ in range(n)]  # index j = 1..n
        prompt = agreement_of(n, right)
        for k in range(2, 10):
            expected = simulate_speculative(n, right, k) if n else []
            assert accepted_per_step(prompt, k) == expected, (n, right, k)


def test_k_range_parsing() -> None:
    assert parse_k_range("2..16") == list(range(2, 17))
    assert parse_k_range("7,4, 9") == [4, 7, 9]
    for bad in ("1..4", "x", "", "5..3"):
        with pytest.raises(ConfigError, match="k range"):
            parse_k_range(bad)


@pytest.fixture(scope="module")
def small_reference(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    folder = tmp_path_factory.mktemp("acceptance")
    path = folder / "small.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in SMALL_SET))
    rendered = render_prompts(load_prompt_set(path), load_tokenizer(tiny_target), ["raw", "chat"])
    identity = resolve_model(str(tiny_target), load_settings()).identity()
    return get_reference(tiny_target, identity, rendered, max_new_tokens=MAX_NEW, dtype="float32",
                         eos_token_ids=[151645], cache_dir=folder / "cache")


def test_identical_draft_agrees_everywhere(tiny_target: Path, tiny_drafts: dict[str, Path],
                                           small_reference: Reference) -> None:
    prompts = teacher_forced_agreement(tiny_target, tiny_drafts["copy"], small_reference)
    assert [p.id for p in prompts] == [r.id for r in small_reference.prompts]
    table = predict(prompts, range(2, 9))
    for p in prompts:
        assert p.target_flips == 0, "the target's teacher-forced argmax must reproduce its own greedy output"
        assert p.agreement == 1.0
        for k in table.ks:
            assert table.steps(p.id, k) == math.ceil((p.n_tokens - 1) / k)
    overall = table.per_class[OVERALL]
    assert overall[2].tokens == sum(p.n_tokens - 1 for p in prompts)
    assert all(s.accepted == s.tokens - s.steps for s in overall.values())
    assert table.agreement(OVERALL) == 1.0


def test_a_pairs_agreement_is_computed_once_and_read_by_every_later_build(
        tiny_target: Path, tiny_drafts: dict[str, Path], small_reference: Reference, tmp_path: Path) -> None:
    """What a second build of the same pair gets is the first one's agreement, with no model loaded (a 32B
    target is not loaded again per TP and k); another draft's content, or a damaged entry, is computed."""
    cache = tmp_path / "cache"
    draft = resolve_model(str(tiny_drafts["unrelated"]), load_settings()).identity()
    first = get_agreement(tiny_target, tiny_drafts["unrelated"], draft, small_reference, dtype="float32",
                          cache_dir=cache)
    assert first == teacher_forced_agreement(tiny_target, tiny_drafts["unrelated"], small_reference)
    no_loads = HfModels()
    no_loads.close()  # asked for a model, it raises
    again = get_agreement(tiny_target, tiny_drafts["unrelated"], draft, small_reference, dtype="float32",
                          cache_dir=cache, models=no_loads)
    assert again == first
    with pytest.raises(RuntimeError, match="asked for after its holder released its models"):
        get_agreement(tiny_target, tiny_drafts["copy"], {**draft, "files": {"model.safetensors": "sha256:0"}},
                      small_reference, dtype="float32", cache_dir=cache, models=no_loads)
    (entry,) = (cache / "agreement").glob("*.json")
    shortened = json.loads(entry.read_text())
    shortened["prompts"][0]["draft_hits"].pop()  # no longer one hit per reference token
    loose = json.loads(entry.read_text())
    hits = loose["prompts"][0]["draft_hits"]
    hits[hits.index(False)] = 1  # a miss written as 1: not read as a hit
    for damaged in ("[]", json.dumps(shortened), json.dumps(loose)):
        entry.write_text(damaged)
        assert get_agreement(tiny_target, tiny_drafts["unrelated"], draft, small_reference, dtype="float32",
                             cache_dir=cache) == first


def test_unrelated_and_cut_drafts_agree_less(tiny_target: Path, tiny_drafts: dict[str, Path],
                                             small_reference: Reference) -> None:
    copy = predict(teacher_forced_agreement(tiny_target, tiny_drafts["copy"], small_reference), [4])
    for name in ("unrelated", "cut"):
        table = predict(teacher_forced_agreement(tiny_target, tiny_drafts[name], small_reference), [4])
        assert table.agreement(OVERALL) < 0.5
        assert table.per_class[OVERALL][4].steps > copy.per_class[OVERALL][4].steps
        assert table.per_class[OVERALL][4].acceptance_rate < copy.per_class[OVERALL][4].acceptance_rate
        # Classes partition the prompts: class totals add up to the overall ones.
        classes = [c for c in table.per_class if c != OVERALL]
        assert sorted(classes) == sorted({p["class"] for p in SMALL_SET})
        assert sum(table.per_class[c][4].steps for c in classes) == table.per_class[OVERALL][4].steps
