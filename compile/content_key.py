"""The keys of a build: what its compiled programs depend on, which weights it holds, and the
version both name.

    graph key     everything that shapes the compiled programs and nothing else: the graph fields of both
                  models' configs (below), the BuildSpec, the backend, its toolchain, the compile options
                  that change a program, and the version of our own compile code
    weight key    which weights: both models' commits and the hashes of every file a build reads
    version key   a content key over the two: a version names exactly what was compiled and which weights
                  it holds. It is the build's directory in the work dir and its version in stores ("key").

Compiled programs carry no weights (the cpu programs take every weight as a graph input; NxDI traces with
uninitialized weights and shards them apart), so a new revision of a model with the same configuration
(a fine-tune, a re-trained draft) has the graph key of the last one: its programs are reused and only its
weights are sharded again (compile/build.py). The greedy gate still runs for every new weight key.

Which config fields are graph fields: all of them, except LEFT_OUT below, each with the reason it cannot
change a program. Everything else is in, including fields no code of ours reads (a newer transformers'):
a field wrongly in costs one compile, a field wrongly out would reuse programs of another model. Fields
written differently by transformers 4.x and 5.x (rope_theta / rope_parameters / rope_scaling; dtype /
torch_dtype) enter through their one parsed value (compile/modelconfig.py), so a revision saved by another
transformers keeps its graph key. tests/test_graph_key.py enumerates the fields of real configs and shows
which change the key.

Out of every key: model references as written (a branch name, a local path), times, hosts, store locations,
cache locations (UNKEYED_OPTIONS).
Same inputs give the same keys in any process on any machine, so finished work is found, not redone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fusedspec.compile.modelconfig import ModelConfig
from fusedspec.compile.modelref import ResolvedModel
from fusedspec.compile.spec import BuildSpec

KEY_SCHEMA = 2  # bump when the set or meaning of key inputs changes (2: graph and weight keys)

# config.json fields that never change a compiled program, and why.
LEFT_OUT: dict[str, str] = {
    "eos_token_id": "token ids at which generation stops: the runner reads them from build.json (the "
                    "version's), no program does",
    "bos_token_id": "prepended by the tokenizer, not by a program",
    "pad_token_id": "padding id for batched Hugging Face calls; programs take each prompt at its own length "
                    "(NxDI's fused graph reads it only in non-greedy EAGLE token selection, "
                    "models/model_base.py _speculative_token_selection, which no greedy build traces)",
    "torch_dtype": "the dtype the checkpoint is stored in (4.x spelling): a build runs in its spec's dtype "
                   "and casts the weights when it shards them",
    "dtype": "torch_dtype's 5.x spelling (see torch_dtype)",
    "max_position_embeddings": "programs are sized by the spec's seq_len; the plan checks seq_len against "
                               "this bound for every build, reused programs included (in the key after all "
                               "with a rope type of ROPE_TYPES_READING_MAX_POSITIONS)",
    "architectures": "the Python class transformers instantiates; model_type names the structure",
    "transformers_version": "the version that wrote the file",
    "initializer_range": "the spread of random initial weights, used "
                         "only when a model is trained from scratch",
    "attention_dropout": "dropout is off at inference",
    "use_cache": "a flag of transformers' generate(); the programs always keep a static KV cache",
    "_name_or_path": "where the file was loaded from",
}


# RoPE types whose frequencies transformers computes from max_position_embeddings (modeling_rope_utils.py
# _compute_dynamic_ntk_parameters, _compute_yarn_parameters, _compute_longrope_parameters). The cpu backend
# refuses every RoPE type but the default; NxDI builds these through transformers' LlamaRotaryEmbedding
# (models/llama/modeling_llama.py get_rope, NxDI 0.6.0 e07f056 to 0.9.0 c63afe0), so there the field shapes
# the NEFFs and enters the graph key.
ROPE_TYPES_READING_MAX_POSITIONS = ("dynamic", "yarn", "longrope")

# Backend options that change no output, so no key holds them and build.json does not record them.
UNKEYED_OPTIONS: dict[str, str] = {
    "compile_cache_url": "where Neuron's persistent compile cache lives (NEURON_COMPILE_CACHE_URL): it "
                         "decides where NEFFs are looked up and stored, never what a compile produces",
}


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def graph_fields(config: ModelConfig) -> dict[str, Any]:
    """The config fields of one model that enter the graph key (parsed fields by their one parsed value)."""
    left_out = set(LEFT_OUT)
    if config.other.get("rope_parameters", {}).get("rope_type") in ROPE_TYPES_READING_MAX_POSITIONS:
        left_out.discard("max_position_embeddings")
    fields = {name: value for name, value in config.other.items() if name not in left_out}
    fields |= {name: value for name, value in config.arch.to_json().items() if name not in left_out}
    return dict(sorted(fields.items()))


def model_identity(model: ResolvedModel) -> dict[str, Any]:
    return {"commit": model.commit, "files": dict(sorted(model.file_hashes.items()))}


def key_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """Unset and false options are every backend's defaults: {"aot_inductor": False}, {} and None are the same
    build and must share a key (the CLI passes every option, a library caller few). UNKEYED_OPTIONS are
    out."""
    return {name: value for name, value in sorted(recorded_options(options).items())
            if value is not None and value is not False}


def recorded_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The options as build.json records them: all but UNKEYED_OPTIONS (a host's cache location)."""
    return {name: value for name, value in (options or {}).items() if name not in UNKEYED_OPTIONS}


@dataclass(frozen=True)
class BuildKeys:
    graph: str
    weights: str
    version: str


def graph_inputs(spec: BuildSpec, target: ModelConfig, draft: ModelConfig, toolchain: dict[str, str],
                 code_version: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": KEY_SCHEMA,
        "spec": spec.to_json(),  # the backend is one of its fields
        "target": graph_fields(target),
        "draft": graph_fields(draft),
        "toolchain": dict(sorted(toolchain.items())),
        "code_version": code_version,
        "options": key_options(options),
    }


def weight_inputs(target: ResolvedModel, draft: ResolvedModel) -> dict[str, Any]:
    return {"schema": KEY_SCHEMA, "target": model_identity(target), "draft": model_identity(draft)}


def build_keys(spec: BuildSpec, target: ResolvedModel, draft: ResolvedModel, target_config: ModelConfig,
               draft_config: ModelConfig, toolchain: dict[str, str], code_version: str,
               options: dict[str, Any] | None = None) -> BuildKeys:
    """The three keys of one build. `target_config`/`draft_config` are the models' parsed config.json."""
    graph = _digest(graph_inputs(spec, target_config, draft_config, toolchain, code_version, options))
    weights = _digest(weight_inputs(target, draft))
    return BuildKeys(graph=graph, weights=weights,
                     version=_digest({"schema": KEY_SCHEMA, "graph": graph, "weights": weights}))
