"""The pure NxDI translation: the Qwen3-32B + Qwen3-1.7B build, what NxDI would reject or vLLM could not
serve, continuous batching and bucketing (issue 13), the neuron options in the emitted NeuronConfig and the
serving tail (issue 26), and config reading in both transformers spellings (issue 7, must-show 1, 2 and 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusedspec.compile.modelconfig import ModelArch, arch_from_dict, read_arch
from fusedspec.compile.neuron.fields import accepted_fields, field_table, supported_versions
from fusedspec.compile.neuron.read_nxdi_fields import read_fields
from fusedspec.compile.neuron.translate import (
    GREEDY_SAMPLING,
    MODEL_CLASSES,
    default_buckets,
    target_only,
    translate,
)
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError

# config.json of each model as Hugging Face publishes it (transformers 4.51 spelling); numbers as in
# the models' config.json files on the Hugging Face Hub (Qwen/Qwen3-32B, Qwen/Qwen3-1.7B).
QWEN3 = {
    "Qwen3-32B": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, tie_word_embeddings=False, max_window_layers=64),
    "Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True, max_window_layers=28),
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True, max_window_layers=28),
}


def qwen3_config(name: str, spelling: str = "4.57", rope_theta: float = 1000000.0) -> dict[str, Any]:
    """A Qwen3 config.json as written by transformers 4.57 (`rope_theta`, `torch_dtype`) or 5.x
    (`rope_parameters`, `dtype`)."""
    cfg: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 40960, "model_type": "qwen3",
        "rms_norm_eps": 1e-06, "sliding_window": None, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936, **QWEN3[name],
    }
    if spelling == "4.57":
        cfg.update(rope_theta=rope_theta, rope_scaling=None, torch_dtype="bfloat16",
                   transformers_version="4.57.1")
    else:
        cfg.update(rope_parameters={"rope_theta": rope_theta, "rope_type": "default"}, dtype="bfloat16",
                   transformers_version="5.0.0")
    return cfg


def write_config(directory: Path, cfg: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    return directory


def arch(name: str, spelling: str = "4.57", **changes: Any) -> ModelArch:
    return arch_from_dict({**qwen3_config(name, spelling), **changes})


def plan_for(spec: BuildSpec, target: ModelArch, draft: ModelArch, **kwargs: Any) -> dict[str, Any]:
    return translate(spec, target, draft, target_path=Path("/models/Qwen3-32B"),
                     draft_path=Path("/models/Qwen3-1.7B"), compiled_model_path=Path("/builds/key"),
                     compile_work_dir=Path("/work/neuron-compile/key"), **kwargs)


SPEC = BuildSpec(tp_degree=32, seq_len=1024, speculation_length=7, batch_size=4, dtype="bf16",
                 backend="neuron")


# ---- must-show 1: the Qwen3-32B + Qwen3-1.7B build ------------------------------------------------------

def test_qwen3_32b_with_1_7b_draft_is_fused_greedy_and_sharded() -> None:
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), neuron_cc_flags="--retry_failed_compilation")
    target, draft = plan["target"]["neuron_config"], plan["draft"]["neuron_config"]
    assert (target["tp_degree"], target["seq_len"], target["batch_size"]) == (32, 1024, 4)
    assert target["max_context_length"] == 1024 and target["torch_dtype"] == "bfloat16"
    assert target["speculation_length"] == 7 and target["enable_fused_speculation"] is True
    assert target["on_device_sampling_config"] == GREEDY_SAMPLING
    assert target["on_device_sampling_config"]["do_sample"] is False
    assert target["on_device_sampling_config"]["top_k"] == 1
    assert target["save_sharded_checkpoint"] is True and target["skip_sharding"] is False
    assert "token_generation_batches" not in target  # no batch bucketing with speculation
    assert target["logical_nc_config"] == 2 and target["target"] == "trn2"
    # vLLM prefills one request while the others decode: each prefill writes only its own cache line.
    assert target["is_continuous_batching"] is True and target["ctx_batch_size"] == 1
    assert target["tkg_batch_size"] == 4
    assert target["enable_bucketing"] is True
    assert target["context_encoding_buckets"] == target["token_generation_buckets"] == [128, 256, 512, 1024]
    # The draft is NxDI's recipe: the target's config with speculation off, nothing else changed.
    assert draft["speculation_length"] == 0 and draft["enable_fused_speculation"] is False
    assert {k: v for k, v in draft.items()
            if k not in ("speculation_length", "enable_fused_speculation")} == \
        {k: v for k, v in target.items() if k not in ("speculation_length", "enable_fused_speculation")}
    assert plan["fused_spec_config"] == {
        "worker_cls": {"__module__": "neuronx_distributed_inference.models.qwen3.modeling_qwen3",
                       "__name__": "NeuronQwen3Model"},
        "draft_model_path": "/models/Qwen3-1.7B"}
    assert plan["classes"]["causal_lm"]["__name__"] == "NeuronQwen3ForCausalLM"
    assert plan["env"] == {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "2",
                           "BASE_COMPILE_WORK_DIR": "/work/neuron-compile/key",
                           "NEURON_CC_FLAGS": "--retry_failed_compilation"}
    files = plan["expected_files"]
    assert files[:2] == ["neuron_config.json", "model.pt"] and len(files) == 2 + 32
    assert files[2] == "weights/tp0_sharded_checkpoint.safetensors"
    assert files[-1] == "weights/tp31_sharded_checkpoint.safetensors"
    json.dumps(plan)  # plain data all the way down


def test_every_field_name_is_in_nxdi_accepted_list() -> None:
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"),
                    options={"context_encoding_buckets": [256, 1024], "async_mode": True,
                            "logical_nc_config": 1})
    for role in ("target", "draft"):
        names = set(plan[role]["neuron_config"])
        assert names <= accepted_fields("NeuronConfig"), names - accepted_fields("NeuronConfig")
        assert set(plan[role]["neuron_config"]["on_device_sampling_config"]) <= \
            accepted_fields("OnDeviceSamplingConfig")
    assert set(plan["fused_spec_config"]) <= accepted_fields("FusedSpecNeuronConfig")
    # And the accepted list itself: read from NxDI models/config.py at every supported SDK, 2.26 to 2.29.
    assert supported_versions() == {"0.6.0": "2.26", "0.7.0": "2.27", "0.8.0": "2.28", "0.9.0": "2.29"}
    for info in field_table()["versions"].values():
        assert len(info["commit"]) == 40 and "speculation_length" in info["NeuronConfig"]


def test_target_only_reference_has_the_same_shapes_without_speculation() -> None:
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    ref = target_only(plan, Path("/builds/key-reference"), Path("/work/neuron-compile/key.target-only"))
    nc = ref["target"]["neuron_config"]
    assert nc["speculation_length"] == 0 and nc["enable_fused_speculation"] is False
    assert (nc["tp_degree"], nc["seq_len"], nc["batch_size"]) == (32, 1024, 4)
    assert "draft" not in ref and "fused_spec_config" not in ref and "shard" not in ref
    assert ref["compile"]["compiled_model_path"] == "/builds/key-reference"
    # its own scratch: a trace empties its scratch directory first, and the fused build of the key has one
    assert ref["compile"]["compile_work_dir"] == ref["env"]["BASE_COMPILE_WORK_DIR"] == \
        "/work/neuron-compile/key.target-only"
    assert plan["env"]["BASE_COMPILE_WORK_DIR"] == "/work/neuron-compile/key"
    assert plan["target"]["neuron_config"]["enable_fused_speculation"] is True  # the plan is not modified


def test_a_new_revision_reuses_model_pt_and_writes_the_rest_with_nxdis_shard_calls() -> None:
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    shard = plan["shard"]
    # neuron_config.json names the checkpoints and every config field: written again per revision
    assert shard["program_files"] == ["model.pt"]
    assert shard["writes"] == [name for name in plan["expected_files"] if name != "model.pt"]
    assert shard["calls"][:-2] == plan["compile"]["calls"][:-1]  # the same model, built the same way
    assert shard["calls"][-2].startswith("model.config.save(")
    assert shard["calls"][-1].startswith("model.shard_weights(")
    assert plan["compile"]["calls"][-1] == "model.compile(compile.compiled_model_path)"


def test_the_compile_cache_location_reaches_the_build_process_only_when_the_run_config_sets_it() -> None:
    target, draft = arch("Qwen3-32B"), arch("Qwen3-1.7B")
    cached = plan_for(SPEC, target, draft, options={"compile_cache_url": "s3://c/neff"},
                      host_compile_cache_url="/var/cache/neuron")
    assert cached["env"]["NEURON_COMPILE_CACHE_URL"] == "s3://c/neff"
    assert cached["compile_cache"] == {"url": "s3://c/neff",
                                       "from": "the run config's neuron.compile_cache_url"}
    host = plan_for(SPEC, target, draft, host_compile_cache_url="/var/cache/neuron")
    assert "NEURON_COMPILE_CACHE_URL" not in host["env"]  # the process inherits the host's own
    assert host["compile_cache"]["url"] == "/var/cache/neuron"
    assert {k: v for k, v in cached.items() if k not in ("env", "compile_cache")} == \
        {k: v for k, v in host.items() if k not in ("env", "compile_cache")}  # nothing else differs


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_model_class_per_model_type(model_type: str) -> None:
    changes = {"model_type": model_type}
    plan = plan_for(SPEC, arch("Qwen3-32B", **changes), arch("Qwen3-1.7B", **changes))
    assert plan["classes"]["causal_lm"]["__module__"].endswith(f"modeling_{model_type}")
    assert plan["fused_spec_config"]["worker_cls"] == plan["classes"]["model"]
    assert MODEL_CLASSES[model_type].model.startswith("Neuron")


# ---- must-show 2: what NxDI would reject or silently ignore ---------------------------------------------

def rejected(spec: BuildSpec = SPEC, target: ModelArch | None = None, draft: ModelArch | None = None,
             **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        plan_for(spec, target or arch("Qwen3-32B"), draft or arch("Qwen3-1.7B"), **kwargs)
    return str(info.value)


def test_tp_fitting_neither_head_count_is_built_as_nxdi_does_with_its_mha_fallback() -> None:
    # NxDI converts GQA to MHA for such a TP (modules/attention/gqa.py): built, and the dry run says what
    # it costs (the KV cache of one KV head per padded Q head).
    spec = BuildSpec(tp_degree=6, seq_len=1024, speculation_length=7, batch_size=4, backend="neuron")
    plan = plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    assert plan["target"]["neuron_config"]["tp_degree"] == 6
    mha = [note for note in plan["notes"] if "GQA.CONVERT_TO_MHA" in note]
    assert len(mha) == 2
    assert "the target's 8 KV heads" in mha[0] and "66 KV heads of which each rank holds 11" in mha[0]
    assert "the draft's 8 KV heads" in mha[1] and "18 KV heads of which each rank holds 3" in mha[1]
    assert not [note for note in plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"))["notes"]
                if "MHA" in note]


def test_a_seq_len_that_leaves_no_request_room_after_k_is_rejected() -> None:
    spec = BuildSpec(tp_degree=8, seq_len=8, speculation_length=7, batch_size=1, backend="neuron")
    assert "seq_len=8 leaves 1 position(s) after k=7" in rejected(spec)
    plan_for(BuildSpec(tp_degree=8, seq_len=9, speculation_length=7, batch_size=1, backend="neuron"),
             arch("Qwen3-32B"), arch("Qwen3-1.7B"))  # one prompt token and one new token fit


def test_k_below_2_is_rejected() -> None:
    with pytest.raises(ConfigError, match="k=1 is plain decoding"):
        BuildSpec(tp_degree=32, seq_len=1024, speculation_length=1, batch_size=4, backend="neuron")


@pytest.mark.parametrize("options, words", [
    ({"token_generation_buckets": [512, 2048]},
     "the largest exceeds seq_len=1024; NxDI asserts it is <= max_length"),
    ({"context_encoding_buckets": [2048]}, "NxDI asserts it is <= max_context_length"),
    ({"context_encoding_buckets": [1024], "enable_bucketing": False},
     "would be ignored: NxDI reads bucket lists"),
    ({"token_generation_buckets": [8, 1024]}, "token_generation_buckets [8] would never run at k=7"),
    ({"context_encoding_buckets": [128, 512]}, "the largest must be seq_len=1024, or the server admits"),
    ({"token_generation_buckets": []}, "should have at least 1 item"),
    ({"token_generation_buckets": [512, 512, 1024]}, "repeats a length"),
    ({"token_generation_buckets": [0, 1024]}, "greater than or equal to 1"),
    ({"enable_bucketing": "yes"}, "enable_bucketing='yes': input should be a valid boolean"),
    ({"async_mode": 1}, "async_mode=1: input should be a valid boolean"),
    ({"logical_nc_config": 2, "platform": "trn1"}, "logical_nc_config=2 needs trn2"),
    ({"platform": "trn3"}, "trn3 needs NxDI 0.7 or later"),
    ({"neuron_config": {"fused_qkv": True}}, "neuron.neuron_config: unknown field"),
])
def test_options_nxdi_would_reject_or_ignore(options: dict[str, Any], words: str) -> None:
    assert words in rejected(options=options)


def test_draft_of_another_family_and_bad_options_are_rejected() -> None:
    assert "NxDI builds the draft with the target's model class" in rejected(
        draft=arch("Qwen3-1.7B", model_type="llama"))
    assert "model_type 'mistral' has no NxDI causal-LM class" in rejected(draft=arch("Qwen3-1.7B",
                                                                                      model_type="mistral"))
    message = rejected(options={"platform": "tpu", "logical_nc_config": 3, "speed": "max"})
    assert "neuron.speed: unknown field" in message and "neuron.platform='tpu'" in message
    assert "neuron.logical_nc_config=3: input should be less than or equal to 2" in message
    cpu_spec = BuildSpec(tp_degree=32, seq_len=1024, speculation_length=7, batch_size=4, backend="cpu")
    assert "builds only neuron specs" in rejected(cpu_spec)


def test_all_problems_are_reported_at_once() -> None:
    spec = BuildSpec(tp_degree=128, seq_len=65536, speculation_length=7, batch_size=4, backend="neuron")
    message = rejected(spec, options={"token_generation_buckets": [4, 512]})
    assert message.startswith("5 problem(s)")
    assert "exceeds the target's max_position_embeddings=40960" in message
    assert "exceeds the 64 logical NeuronCores of one trn2.48xlarge" in message
    assert "the largest must be seq_len=65536" in message and "[4] would never run" in message


# ---- must-show 5: config.json in both transformers spellings --------------------------------------------

@pytest.mark.parametrize("spelling", ["4.57", "5.x"])
def test_config_reading_in_both_spellings(tmp_path: Path, spelling: str) -> None:
    target = read_arch(write_config(tmp_path / "t", qwen3_config("Qwen3-32B", spelling)))
    draft = read_arch(write_config(tmp_path / "d", qwen3_config("Qwen3-1.7B", spelling)))
    assert (target.rope_theta, target.torch_dtype, target.num_key_value_heads) == (1e6, "bfloat16", 8)
    assert (draft.tie_word_embeddings, draft.num_attention_heads) == (True, 16)
    plan = plan_for(SPEC, target, draft)
    # NxDI reads config.json with transformers 4.5x, which would give a 5.x file rope_theta=10000:
    # the translation passes the value read here explicitly, for both models.
    assert plan["target"]["inference_config_overrides"] == {"rope_theta": 1e6}
    assert plan["draft"]["inference_config_overrides"] == {"rope_theta": 1e6}
    assert plan["target"]["neuron_config"]["torch_dtype"] == "bfloat16"


def test_both_spellings_translate_identically(tmp_path: Path) -> None:
    plans = []
    for spelling in ("4.57", "5.x"):
        target = read_arch(write_config(tmp_path / spelling / "t", qwen3_config("Qwen3-32B", spelling, 5e5)))
        draft = read_arch(write_config(tmp_path / spelling / "d", qwen3_config("Qwen3-0.6B", spelling, 5e5)))
        plans.append(plan_for(SPEC, target, draft))
    assert plans[0] == plans[1]
    assert plans[0]["draft"]["inference_config_overrides"]["rope_theta"] == 5e5


# ---- issue 13: continuous batching, bucketing, what one node can serve, the serving recipe --------------

@pytest.mark.parametrize("batch", [1, 2, 4])
def test_every_batch_size_is_compiled_for_continuous_batching(batch: int) -> None:
    spec = BuildSpec(tp_degree=32, seq_len=1024, speculation_length=7, batch_size=batch, backend="neuron")
    plan = plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    # the draft's config is the target's copy: same batching in the fused graph
    for role in ("target", "draft"):
        nc = plan[role]["neuron_config"]
        assert (nc["is_continuous_batching"], nc["ctx_batch_size"], nc["tkg_batch_size"]) == (True, 1, batch)
        assert nc["batch_size"] == batch


@pytest.mark.parametrize("seq_len, buckets", [
    (1024, [128, 256, 512, 1024]), (4096, [128, 256, 512, 1024, 2048, 4096]), (1000, [128, 256, 512, 1000]),
    (1500, [128, 256, 512, 1024, 1500]), (128, [128]), (64, [64]),
])
def test_default_buckets_are_nxdi_own_for_the_seq_len(seq_len: int, buckets: list[int]) -> None:
    # NxDI modules/autobucketing.py generate_buckets(128, seq_len): 2**7 .. 2**round(log2(seq_len)) exclusive.
    assert default_buckets(seq_len) == buckets
    spec = BuildSpec(tp_degree=8, seq_len=seq_len, speculation_length=7, batch_size=1, backend="neuron")
    nc = plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"))["target"]["neuron_config"]
    assert nc["context_encoding_buckets"] == nc["token_generation_buckets"] == buckets


def test_bucketing_is_settable_through_options() -> None:
    off = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"enable_bucketing": False})
    nc = off["target"]["neuron_config"]
    assert nc["enable_bucketing"] is False
    assert "context_encoding_buckets" not in nc and "token_generation_buckets" not in nc
    own = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"),
                   options={"context_encoding_buckets": [1024, 512], "token_generation_buckets": [256, 1024]})
    nc = own["target"]["neuron_config"]
    assert nc["enable_bucketing"] is True
    assert (nc["context_encoding_buckets"], nc["token_generation_buckets"]) == ([512, 1024], [256, 1024])
    # one fused graph, one list
    assert own["draft"]["neuron_config"]["context_encoding_buckets"] == [512, 1024]
    # Only one list given: the other is NxDI's own for the seq_len.
    one = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"),
                   options={"token_generation_buckets": [512, 1024]})
    assert one["target"]["neuron_config"]["context_encoding_buckets"] == [128, 256, 512, 1024]


@pytest.mark.parametrize("tp, options, limit", [
    (128, {}, "exceeds the 64 logical NeuronCores of one trn2.48xlarge at logical_nc_config=2"),
    (64, {"platform": "trn1"}, "exceeds the 32 logical NeuronCores of one trn1.32xlarge"),
    (32, {"platform": "inf2"}, "exceeds the 24 logical NeuronCores of one inf2.48xlarge"),
])
def test_tp_beyond_one_node_is_rejected(tp: int, options: dict[str, Any], limit: str) -> None:
    spec = BuildSpec(tp_degree=tp, seq_len=1024, speculation_length=7, batch_size=4, backend="neuron")
    assert limit in rejected(spec, options=options)
    plan_for(BuildSpec(tp_degree=128, seq_len=1024, speculation_length=7, batch_size=4, backend="neuron"),
             arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"logical_nc_config": 1})  # 128 cores at LNC 1


@pytest.mark.parametrize("options", [
    {}, {"platform": "trn1", "logical_nc_config": 1}, {"platform": "inf2"}, {"enable_bucketing": False},
    {"context_encoding_buckets": [512, 1024], "token_generation_buckets": [256, 1024]}, {"async_mode": True},
])
def test_every_emitted_name_is_accepted_by_each_nxdi_version_0_6_to_0_9(options: dict[str, Any]) -> None:
    spec = BuildSpec(tp_degree=8, seq_len=1024, speculation_length=7, batch_size=4, backend="neuron")
    plan = plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options=options)
    versions = field_table()["versions"]
    assert sorted(versions) == ["0.6.0", "0.7.0", "0.8.0", "0.9.0"]
    for version, info in versions.items():  # each version's own list, not the intersection
        for role in ("target", "draft"):
            assert set(plan[role]["neuron_config"]) <= set(info["NeuronConfig"]), version
        assert set(GREEDY_SAMPLING) <= set(info["OnDeviceSamplingConfig"]), version
        assert {*plan["fused_spec_config"], "draft_config"} <= set(info["FusedSpecNeuronConfig"]), version
    assert all(not names for per_class in plan["unknown_fields_per_nxdi_version"].values()
               for names in per_class.values())


def test_each_option_lands_in_the_neuron_config_and_the_compile_environment() -> None:
    nc = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"))["target"]["neuron_config"]
    assert (nc["target"], nc["logical_nc_config"], nc["async_mode"]) == ("trn2", 2, False)
    trn1 = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"),
                    options={"platform": "trn1", "async_mode": True})
    nc = trn1["target"]["neuron_config"]
    assert (nc["target"], nc["logical_nc_config"], nc["async_mode"]) == ("trn1", 1, True)
    assert trn1["draft"]["neuron_config"]["async_mode"] is True
    assert trn1["env"]["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn1" and \
        trn1["env"]["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert any(note.startswith("async_mode: NxDI runs it with fused speculation") for note in trn1["notes"])


def test_serving_recipe_and_devices_follow_tp_and_lnc() -> None:
    plan = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    serving = plan["serving"]
    assert serving["env"] == {"VLLM_USE_V1": "0", "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
                              "NEURON_LOGICAL_NC_CONFIG": "2"}
    assert serving["override_neuron_config"] == {"save_sharded_checkpoint": True,
                                                 "enable_fused_speculation": True}
    # Issue 26: the serving tail keeps k positions of the seq_len-long KV cache free (compile.fused_step).
    assert serving["speculative_config"] == {"num_speculative_tokens": 7, "max_model_len": 1017,
                                             "method": "eagle"}
    assert (serving["tensor_parallel_size"], serving["max_model_len"],
            serving["max_num_seqs"]) == (32, 1017, 4)
    # 4 logical cores each
    assert serving["neuron_devices"] == 8 and serving["instance_type"] == "trn2.48xlarge"
    assert any("temperature, top_k and top_p are ignored" in note for note in plan["notes"])
    lnc1 = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"logical_nc_config": 1})["serving"]
    assert lnc1["neuron_devices"] == 4 and lnc1["env"]["NEURON_LOGICAL_NC_CONFIG"] == "1"
    trn1 = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"platform": "trn1"})["serving"]
    assert trn1["neuron_devices"] == 16 and trn1["instance_type"] == "trn1.32xlarge"
    inf2 = plan_for(BuildSpec(tp_degree=24, seq_len=1024, speculation_length=7, batch_size=4,
                              backend="neuron"),
                    arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"platform": "inf2"})["serving"]
    assert inf2["neuron_devices"] == 12 and inf2["instance_type"] == "inf2.48xlarge"
    # async_mode is read by vLLM from --override-neuron-config (it sizes the lookahead slots there).
    on = plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"async_mode": True})["serving"]
    assert on["override_neuron_config"] == {"save_sharded_checkpoint": True, "enable_fused_speculation": True,
                                            "async_mode": True}
    assert "serving" not in target_only(plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B")), Path("/ref"),
                                        Path("/ref-scratch"))


def test_buckets_that_leave_no_room_for_a_fused_step_are_rejected() -> None:
    # k is at most 32 (compile.spec.MAX_K), below NxDI's smallest default bucket (128): given buckets can
    # still be too small. A fused step at L tokens takes the first bucket above L + k (L >= 1), or the
    # largest when L + k equals it: a bucket of k + 1 below the largest is never chosen, k + 2 is.
    spec = BuildSpec(tp_degree=8, seq_len=1024, speculation_length=32, batch_size=1, backend="neuron")
    plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"))
    plan_for(spec, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options={"token_generation_buckets": [34, 1024]})
    message = rejected(spec, options={"token_generation_buckets": [32, 33, 1024]})
    assert "token_generation_buckets [32, 33] would never run at k=32" in message


def test_options_that_are_not_a_mapping_or_of_the_wrong_type_are_rejected() -> None:
    with pytest.raises(ConfigError, match="neuron backend options must be a mapping"):
        plan_for(SPEC, arch("Qwen3-32B"), arch("Qwen3-1.7B"), options=["platform"])  # type: ignore[arg-type]
    assert "neuron.platform=['trn2']: input should be 'trn2', 'trn1' or 'inf2'" in \
        rejected(options={"platform": ["trn2"]})
    assert "neuron.logical_nc_config=True: input should be a valid integer" in \
        rejected(options={"logical_nc_config": True})


# ---- the reader that produced neuron_config_fields.json --------------------------------------------------

NXDI_LIKE_SOURCE = '''
class NeuronConfig:
    def __init__(self, **kwargs):
        self.batch_size = kwargs.pop("batch_size", 1)
        if "torch_dtype" in kwargs:
            self.torch_dtype = kwargs.pop("torch_dtype")
        self.logical_nc_config = self._get_lnc(kwargs)
        self.other = kwargs.get("not_consumed")

    def _get_lnc(self, kwargs):
        return kwargs.pop("logical_nc_config", 1)


class OnDeviceSamplingConfig:
    def __init__(self, **kwargs):
        self.top_k = kwargs.pop("top_k", 1)

    def helper(self, kwargs):
        return kwargs.pop("not_a_constructor_field", None)


class FusedSpecNeuronConfig:
    def __init__(self, worker_cls, draft_config=None, draft_model_path=None, *, draft_model_cls=None):
        pass
'''


def test_field_reader_collects_what_the_constructors_consume() -> None:
    assert read_fields(NXDI_LIKE_SOURCE) == {
        "NeuronConfig": ["batch_size", "logical_nc_config", "torch_dtype"],
        "OnDeviceSamplingConfig": ["top_k"],
        "FusedSpecNeuronConfig": ["draft_config", "draft_model_cls", "draft_model_path", "worker_cls"],
    }
    with pytest.raises(ValueError, match="no class OnDeviceSamplingConfig, FusedSpecNeuronConfig"):
        read_fields("class NeuronConfig:\n    def __init__(self, **kwargs):\n        pass\n")
