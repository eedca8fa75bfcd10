"""Validation's transformers loads stay whole when a run's builds validate side by side in threads of one
process (validate/hf_models.py FROM_PRETRAINED_LOCK). Unlocked, transformers' own swap of
PreTrainedModel.tie_weights for a no-op during each load was put back in the wrong order: the no-op stayed,
and every later load in that worker left the tiny target's lm_head untied on the meta device (a CI run:
agreement 0 in a published build, then 'Tensor on device meta' in later tests)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fusedspec.validate.hf_models import HfModels

LOADS_PER_THREAD = 4


def test_loads_in_two_threads_leave_weight_tying_to_every_later_load(tiny_target: Path) -> None:
    from transformers import PreTrainedModel

    tie_weights = PreTrainedModel.tie_weights

    def load_again(_: int) -> None:
        for _ in range(LOADS_PER_THREAD):
            HfModels().causal_lm(tiny_target, "float32")  # a new holder: a load every time

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(load_again, range(2)))
    assert PreTrainedModel.tie_weights is tie_weights
    model = HfModels().causal_lm(tiny_target, "float32")
    assert model.lm_head.weight.device.type == "cpu"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def test_closing_releases_memory_by_the_bytes_of_the_models_it_held(tiny_target: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The full collection after a validation is for large models only (core/memory.py): what decides is the
    weights of every model the holder loaded, each counted once (tied embeddings share one tensor), and its
    buffers (rotary tables here: a few KB)."""
    from safetensors import safe_open

    from fusedspec.validate import hf_models

    asked: list[int | None] = []
    monkeypatch.setattr(hf_models, "release_freed_memory", asked.append)
    models = HfModels()
    for dtype in ("float32", "bfloat16"):
        models.causal_lm(tiny_target, dtype)
    models.close()
    with safe_open(tiny_target / "model.safetensors", "pt") as tensors:
        stored = sum(tensors.get_tensor(n).numel() for n in tensors.keys())  # noqa: SIM118
    (held,) = asked
    assert stored * 4 + stored * 2 <= held < stored * 6 + 4096, "weights once each, plus the small buffers"
