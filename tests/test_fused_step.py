"""The serving tail (issue 26, must-show 3): the longest request a server admits keeps a fused step inside the
KV cache. Checked against a model of NxDI's graph choice for a fused step (models/model_wrapper.py
`get_target_bucket`, first fit, 0.6.0 e07f056; `_get_seq_bucket` from 0.8.0): the step at a sequence of L
tokens needs a bucket above L + k, or L + k equal to the largest, which is at most seq_len. The Deployment's
--max-model-len is asserted in tests/test_k8s.py, the cpu server's bound in tests/test_serve_inputs.py."""

from __future__ import annotations

import itertools

import pytest

from fusedspec.compile.fused_step import max_model_len
from fusedspec.compile.neuron.translate import default_buckets


def nxdi_fused_bucket(buckets: list[int], length: int, k: int) -> int:
    """The graph NxDI runs a fused step of a sequence of `length` tokens with, or ValueError (the step would
    write past the largest bucket): a model of model_wrapper.py's first-fit choice, not NxDI's code."""
    for bucket in buckets:
        if length + k < bucket:
            return bucket
    if length + k == buckets[-1]:
        return buckets[-1]
    raise ValueError(f"input len {length} + k {k} exceeds the largest bucket {buckets[-1]}")


def serve(prompt: int, max_tokens: int, k: int, buckets: list[int], accepted: int, *, one_more: bool) -> None:
    """A server's steps for one request: the context encoding gives the first token, then fused steps of
    `accepted` tokens each while the request is unfinished (`one_more`: a server that checks only after a
    step, so it runs one at the limit too)."""
    length, limit = prompt + 1, prompt + max_tokens
    while length < limit or (one_more and length == limit):
        nxdi_fused_bucket(buckets, length, k)
        length += accepted


@pytest.mark.parametrize("seq_len, k", [(1024, 7), (1000, 5), (128, 32), (64, 3)])
def test_no_request_within_the_bound_makes_a_fused_step_write_past_seq_len(seq_len: int, k: int) -> None:
    longest = max_model_len(seq_len, k)
    assert longest == seq_len - k
    buckets = default_buckets(seq_len)  # the largest is seq_len, as the neuron options require of any list
    for prompt, accepted in itertools.product((1, 2, longest // 2, longest - 1), (1, k - 1, k)):
        for one_more in (False, True):
            serve(prompt, longest - prompt, k, buckets, accepted, one_more=one_more)


def test_one_position_more_overruns_with_a_server_that_checks_after_the_step() -> None:
    seq_len, k = 1024, 7
    buckets = default_buckets(seq_len)
    # the bare bucket rule holds
    serve(100, max_model_len(seq_len, k) + 1 - 100, k, buckets, 1, one_more=False)
    with pytest.raises(ValueError, match="exceeds the largest bucket 1024"):
        serve(100, max_model_len(seq_len, k) + 1 - 100, k, buckets, 1, one_more=True)


def test_the_bound_of_each_backend_and_what_it_refuses() -> None:
    assert max_model_len(1024, 7) == 1017  # neuron: NxDI's cache is seq_len long (max_length)
    assert max_model_len(128 + 3, 3) == 128  # cpu: its cache is seq_len + k (compile.cpu.layout)
    for cache, k in ((7, 7), (3, 0)):
        with pytest.raises(ValueError, match="leaves no room for a fused step"):
            max_model_len(cache, k)
