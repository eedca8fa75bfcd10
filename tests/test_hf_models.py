"""Validation's transformers loads stay whole when a run's builds validate side by side in threads of one
process (validate/hf_models.py FROM_PRETRAINED_LOCK). Unlocked, transformers' own swap of
PreTrainedModel.tie_weights for a no-op during each load was put back in the wrong order: the no-op stayed,
and every later load in that worker left the tiny target's lm_head untied on the meta device (a CI run:
agreement 0 in a published build, then 'Tensor on device meta' in later tests)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
