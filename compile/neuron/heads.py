"""NxDI's attention-head arithmetic at a TP degree: how many Q and KV heads one model has once sharded. Pure.

Read from aws-neuron/neuronx-distributed-inference modules/attention/gqa.py (identical at 0.6.0 e07f056 and
0.9.0 c63afe0) and aws-neuron/neuronx-distributed parallel_layers/pad.py `get_number_of_extra_heads`:
  - `determine_sharding_strategy`: REPLICATE_TO_TP_DEGREE unless `tp % kv_heads != 0`, then CONVERT_TO_MHA
    (with a warning, never an error);
  - `get_shardable_head_counts`: Q heads padded up to a multiple of TP; KV heads kept when TP divides them,
    replicated up to TP when they divide TP (REPLICATE_TO_TP_DEGREE), else made one per padded Q head
    (CONVERT_TO_MHA). A model whose KV heads equal its Q heads (MHA) gets the padded Q count.
The MLP and the embeddings are padded to TP as well (`pad=True` on the parallel layers of NeuronLlamaMLP and
of Qwen3's embed_tokens / lm_head), so NxDI shards a dense Qwen3 or Llama at any TP; the only cost of an
unfitting TP is the replicated KV heads (a larger KV cache), which the dry run says.
"""

from __future__ import annotations

from dataclasses import dataclass

SPLIT = "split"  # TP divides the KV heads: each rank holds kv / tp of them
REPLICATE = "replicate-to-tp-degree"  # the KV heads divide TP: each rank holds one
CONVERT_TO_MHA = "convert-to-mha"  # neither: one KV head per padded Q head


@dataclass(frozen=True)
class ShardedHeads:
    q_heads: int  # after padding to a multiple of TP
    kv_heads: int  # after splitting, replication or MHA conversion (all ranks together)
    strategy: str  # SPLIT, REPLICATE or CONVERT_TO_MHA

    def kv_per_rank(self, tp: int) -> int:
        return self.kv_heads // tp  # every strategy leaves a multiple of TP


def sharded_heads(num_attention_heads: int, num_key_value_heads: int, tp: int) -> ShardedHeads:
    """The head counts NxDI compiles for one model at `tp` (gqa.py get_shardable_head_counts)."""
    q = num_attention_heads + (-num_attention_heads % tp)
    kv = num_key_value_heads
    if kv == num_attention_heads:  # MHA: one KV head per Q head, padding included
        return ShardedHeads(q, q, SPLIT)
    if kv >= tp and kv % tp == 0:
        return ShardedHeads(q, kv, SPLIT)
    if tp % kv == 0:
        return ShardedHeads(q, tp, REPLICATE)
    return ShardedHeads(q, q, CONVERT_TO_MHA)
