"""The longest sequence a server may admit for a fused artifact, so that no fused step writes past its cache.

One rule for every backend and server: the neuron Deployment's `--max-model-len` (registry.k8s, recorded by
compile.neuron.translate) and the cpu server's request bound (compile.cpu.runner.check_prompt, which
`fusedspec serve` applies to every request) are both `max_model_len(...)`.

Why k positions are kept free. A fused step at a sequence of L tokens feeds the last token and the draft's
k-1 proposals at positions L-1 .. L+k-2 and writes their KV there; NxDI picks its graph by `L + k` and has
none when `L + k` exceeds the largest bucket, which is at most seq_len
(aws-neuron/neuronx-distributed-inference models/model_wrapper.py `get_target_bucket`, 0.6.0 e07f056;
`_get_seq_bucket` from 0.8.0 cd3abf3, unchanged at 0.9.0 c63afe0). NxDI's own generation loop stops fused
steps once k or fewer positions remain (utils/hf_adapter.py `_fused_assisted_decoding`:
`if max_len - cur_len <= spec_len: break`). A server admits prompt + max_tokens <= max_model_len and steps a
sequence while it is shorter than that; keeping k positions free means even a server that checks the length
only after a step (one more step at L = max_model_len) needs max_model_len + k <= cache positions. It is one
position stricter than the bare bucket rule, and it is the same bound our own device path asks
(compile.neuron.steps.request_budget: prompt + new tokens + k <= seq_len). NxDI's async mode does not tighten
it: its one-step-ahead launch runs only while more than 2k positions remain (modules/async_execution.py
`within_bounds`, 0.6.0 to 0.9.0), and falls back to one step at a time.
"""

from __future__ import annotations


def max_model_len(cache_positions: int, k: int) -> int:
    """The longest prompt + generated tokens to admit when the KV cache holds `cache_positions` positions per
    sequence and a fused step writes k: a neuron artifact's cache is its seq_len (NxDI's max_length), so
    seq_len - k; a cpu artifact's cache is seq_len + k (compile.cpu.layout), so seq_len."""
    if k < 1 or cache_positions <= k:
        raise ValueError(f"a cache of {cache_positions} positions leaves no room for a fused step of k={k}")
    return cache_positions - k
