"""The `cpu` reference backend: a fused speculative-decoding compiler and runner in plain PyTorch.

Read in this order: `checkpoint.py` (HF safetensors -> checked full tensors), `sharding.py` (NxDI's
tensor-parallel rules -> one weight dict per rank), `model.py` (the decoder over rank shards with a
static KV cache), `programs.py` (context encoding and the fused speculation step), `export.py`
(torch.export / AOTInductor, programs without weights), `runner.py` (load and generate greedily),
`batching.py` (continuous batching: requests admitted into cache lines while others decode),
`backend.py` (the Backend object the rest of fusedspec talks to).

Nothing here imports transformers, so an artifact loads in a process that never does.
"""
