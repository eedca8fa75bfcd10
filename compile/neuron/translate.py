"""BuildSpec + both model configs + the neuron options -> the complete NxDI configuration for a
fused-speculation build, as plain data. Pure: no Neuron import, no file access, the same answer on any
machine, so it is tested here and printed by `fusedspec compile --dry-run`; device.py turns it into NxDI
objects on a Neuron host.

Sources (aws-neuron/neuronx-distributed-inference, read at NxDI 0.9.0 / SDK 2.29, commit c63afe0, and
0.6.0 / SDK 2.26, tag v0.6.10598 (e07f056); field lists also at 0.7.0 fcb5a86 and 0.8.0 cd3abf3):
  - models/config.py: NeuronConfig fields and defaults; `_get_lnc` lets NEURON_LOGICAL_NC_CONFIG win over the
    field; FusedSpecNeuronConfig(worker_cls, draft_config, draft_model_path[, draft_model_cls from 0.7.0]).
    The user's options and NxDI's rules for them: compile/neuron/options.py.
  - modules/kvcache/kv_cache_manager.py (0.6.0): without `is_continuous_batching`, context encoding writes
    its KV with `fill_prefix` into every batch line; with it, only the line of its `seq_id` (one sequence per
    call: ctx_batch_size 1). vLLM prefills one request while others decode, so batch > 1 needs it.
  - models/model_base.py (0.6.0): context encoding is compiled at ctx_batch_size, the fused step at
    tkg_batch_size; the fused model asserts `on_device_sampling_config` and forces the draft greedy; it builds
    the draft with `worker_cls` unless `draft_model_cls` is given.
  - modules/autobucketing.py: with enable_bucketing, buckets are the given lists, else generate_buckets(128,
    limit); without bucketing one graph of max_context_length / max_length.
  - modules/attention/gqa.py: any TP is sharded; one that fits neither KV-head count converts to MHA
    (compile/neuron/heads.py).
  - inference_demo.py `run_inference`: the recipe followed here (target config from the checkpoint with
    `load_pretrained_config`, draft neuron config = deep copy of the target's with speculation_length=0 and
    enable_fused_speculation=False, FusedSpecNeuronConfig(model_cls._model_cls, ...) attached as
    `config.fused_spec_config`, `model_cls(target_path, config).compile(path)`).
  - models/application_base.py: compile() writes neuron_config.json (`self.config.save`) and model.pt and,
    with save_sharded_checkpoint=True, weights/tp{rank}_sharded_checkpoint.safetensors for ranks
    0..local_ranks_size-1 (= tp_degree here) through `shard_weights(compiled_model_path)`; scratch goes to
    BASE_COMPILE_WORK_DIR. Which of those files are programs, and how a new revision only shards: see
    PROGRAM_FILES and shard_calls below.
  - models/model_wrapper.py: `target` adds `--target` to the compiler arguments.
The serving side (what a vLLM pod needs, recorded as plan["serving"]) follows the legacy vLLM fork that serves
draft-model fused speculation. The DLC of SDK 2.26.1 clones its ref 2.26.1 anonymously from
https://github.com/aws-neuron/upstreaming-to-vllm (aws-neuron/deep-learning-containers
vllm/inference/0.9.1/Dockerfile.neuronx at 14b1f0d), so it is public; that ref could not be fetched for this
work, and the fork was read at branch neuron-2.24-vllm-v0.7.2 (490ab20) and main (dd417b3), which do not list
Qwen3ForCausalLM: vllm/model_executor/model_loader/neuronx_distributed.py `_get_default_speculation_config`
(bucketing on, is_continuous_batching True, ctx_batch_size 1, greedy on-device sampling) and
`NeuronSpeculationCausalLM.load_weights` (the artifact's neuron_config.json, then each
--override-neuron-config item set on it); vllm/engine/arg_utils.py `_is_async_enabled` (async_mode read from
--override-neuron-config sizes the lookahead slots). The recipe is the Neuron SDK 2.26 tutorial for Qwen3
fused speculation (aws-neuron/aws-neuron-sdk libraries/nxd-inference/tutorials/sd-inference-tutorial.rst at
db1586c).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedspec.compile.fused_step import max_model_len
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.neuron.fields import (
    INSTALLED,
    InstalledNxdi,
    field_lists,
    list_sources,
    unknown_per_version,
)
from fusedspec.compile.neuron.heads import CONVERT_TO_MHA, sharded_heads
from fusedspec.compile.neuron.options import PLATFORMS, NeuronOptions, build_problems, parse_options
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import redact_url

NXDI_PACKAGE = "neuronx_distributed_inference"


@dataclass(frozen=True)
class ModelClasses:
    """NxDI's classes for one Hugging Face model_type (models/<family>/modeling_<family>.py)."""

    module: str
    causal_lm: str  # the application class: compile / load / forward
    inference_config: str  # what causal_lm.get_config_cls() returns
    neuron_config: str  # what the inference config's get_neuron_config_cls() returns
    model: str  # causal_lm._model_cls: FusedSpecNeuronConfig.worker_cls

    def ref(self, name: str) -> dict[str, str]:
        # The shape NxDI's to_dict() gives classes in neuron_config.json, which is how vLLM finds them again.
        return {"__module__": self.module, "__name__": getattr(self, name)}


MODEL_CLASSES = {
    "qwen3": ModelClasses(f"{NXDI_PACKAGE}.models.qwen3.modeling_qwen3", "NeuronQwen3ForCausalLM",
                          "Qwen3InferenceConfig", "Qwen3NeuronConfig", "NeuronQwen3Model"),
    "qwen2": ModelClasses(f"{NXDI_PACKAGE}.models.qwen2.modeling_qwen2", "NeuronQwen2ForCausalLM",
                          "Qwen2InferenceConfig", "Qwen2NeuronConfig", "NeuronQwen2Model"),
    # LlamaInferenceConfig.get_neuron_config_cls() returns the base NeuronConfig.
    "llama": ModelClasses(f"{NXDI_PACKAGE}.models.llama.modeling_llama", "NeuronLlamaForCausalLM",
                          "LlamaInferenceConfig", "NeuronConfig", "NeuronLlamaModel"),
}

# Greedy on-device sampling. Fused speculation asserts that on-device sampling is configured, and
# greedy (do_sample False, top_k 1) is what makes the fused output equal to the target's greedy output.
# `dynamic: False` compiles these values in: the served model ignores each request's temperature, top_k
# and top_p and decodes greedily (the fork's own speculation default, {top_k: 1, do_sample: False}, does too).
GREEDY_SAMPLING = {"do_sample": False, "top_k": 1, "top_p": 1.0, "temperature": 1.0, "dynamic": False,
                   "deterministic": False, "global_topk": 256}
SAMPLING_NOTE = ("on-device sampling is greedy and static (dynamic: false): vLLM requests' temperature, "
                 "top_k and top_p are ignored, every request is decoded greedily")
ASYNC_NOTE = ("async_mode: NxDI runs it with fused speculation (models/config.py refuses it only with "
              "Medusa); the Deployment passes it in --override-neuron-config, where the vLLM fork reads it "
              "to size its lookahead slots (vllm/engine/arg_utils.py at 490ab20); serving it on the fork's "
              "2.26.1 ref was not verified (that ref could not be read)")

# Smallest bucket NxDI generates by itself (modules/autobucketing.py: generate_buckets(128, limit)).
SMALLEST_BUCKET = 128
EXPECTED_FILES = ("neuron_config.json", "model.pt")
# What compile() writes that depends on the graph key alone, so a new revision of the models reuses it.
# model.pt: NxD's ModelBuilder traces with initialize_model_weights=False (every weight an input of the
# NEFFs) and saves the NEFFs, their metaneffs, the input flattener and output packer, the weights' shapes
# and dtypes, and the weight-layout transform NEFF that the device applies to the plain sharded weights at
# load (neuronx-distributed trace/model_builder.py build_nxd_model, SDK 2.26 fecfe75 to 2.29 fbac349): no
# weight, no path. neuron_config.json is not: InferenceConfig.save writes the whole config, the target's
# `_name_or_path` and every field of its config.json (the left-out ones of compile/content_key.py too:
# eos_token_id, transformers_version), and `fused_spec_config.draft_model_path`; the shard step writes it
# again for each revision, as compile() does. The weights are per revision by definition.
PROGRAM_FILES = ("model.pt",)
# Variables of a build's process that say where this host keeps things: not recorded in build.json (which
# names what was built, and whose env a load starts with).
HOST_ONLY_ENV = ("BASE_COMPILE_WORK_DIR", "NEURON_COMPILE_CACHE_URL")
NEURON_DEFAULT_CACHE = "Neuron's own default (the Neuron docs: /var/tmp/neuron-compile-cache)"
# What a k-sweep can share, said in the plan rather than promised (the graph key holds k).
K_SWEEP_NOTE = ("builds of different k share no fused NEFF: NxDI's context-encoding graph pads its output to "
                "k tokens (models/model_base.py NeuronFusedSpecModel._cte_postprocessor, 0.6.0 and 0.9.0) "
                "and the fused graph runs k draft steps, so each k compiles its own programs, and Neuron's "
                "compile cache holds nothing another k can use")


def translation_problems(spec: BuildSpec, target: ModelArch, draft: ModelArch,
                         opts: NeuronOptions) -> list[str]:
    """Everything NxDI would reject, or vLLM could not serve, for this build. Empty when fine."""
    return [*model_problems(spec, target, draft),
            *build_problems(opts, tp=spec.tp_degree, seq_len=spec.seq_len, k=spec.k)]


def model_problems(spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
    """What this pair of models cannot be built as with NxDI, whatever the options (their own rules are
    checked where the options are read: the run config, and build_problems here)."""
    problems: list[str] = []  # a BuildSpec is valid on its own by construction (compile.spec)
    if spec.backend != "neuron":
        problems.append(f"the spec is for backend {spec.backend!r}; the neuron backend builds only neuron "
                        "specs")
    for role, arch in (("target", target), ("draft", draft)):
        if arch.model_type not in MODEL_CLASSES:
            problems.append(f"the {role}'s model_type {arch.model_type!r} has no NxDI causal-LM class here "
                            f"(supported: {', '.join(MODEL_CLASSES)})")
        if spec.seq_len > arch.max_position_embeddings:
            problems.append(f"seq_len={spec.seq_len} exceeds the {role}'s "
                            f"max_position_embeddings={arch.max_position_embeddings}")
    if target.model_type != draft.model_type:
        # Without FusedSpecNeuronConfig.draft_model_cls (NxDI 0.7.0 on, fcb5a86; absent in 0.6.0, the SDK 2.26
        # stack that serves fused speculation) NxDI builds the draft with the target's worker class, so a
        # draft of another family would load into the wrong model.
        problems.append(f"the draft's model_type {draft.model_type!r} differs from the target's "
                        f"{target.model_type!r}; NxDI builds the draft with the target's model class")
    if spec.seq_len - spec.k < 2:
        # The served bound keeps k of seq_len's positions free (compile.fused_step): below 2, no request of a
        # prompt token and a new token fits.
        problems.append(f"seq_len={spec.seq_len} leaves {spec.seq_len - spec.k} position(s) after "
                        f"k={spec.k}, and a server admits prompt + max_tokens <= seq_len - k: no request "
                        "would fit; use seq_len >= k + 2")
    return problems


def translation_notes(spec: BuildSpec, target: ModelArch, draft: ModelArch, opts: NeuronOptions) -> list[str]:
    """What the build does that a user should know and did not spell out (not problems)."""
    notes = [SAMPLING_NOTE]
    for role, arch in (("target", target), ("draft", draft)):
        heads = sharded_heads(arch.num_attention_heads, arch.num_key_value_heads, spec.tp_degree)
        if heads.strategy == CONVERT_TO_MHA:
            notes.append(f"tp_degree={spec.tp_degree} fits neither the {role}'s {arch.num_key_value_heads} "
                         "KV heads nor is a multiple of them: NxDI converts its attention to MHA "
                         f"(modules/attention/gqa.py, GQA.CONVERT_TO_MHA), {heads.kv_heads} KV heads of "
                         f"which each rank holds {heads.kv_per_rank(spec.tp_degree)}, a KV cache "
                         f"{heads.kv_heads / arch.num_key_value_heads:g}x the model's; a TP that divides or "
                         "is a multiple of the KV heads avoids it")
    if opts.async_mode:
        notes.append(ASYNC_NOTE)
    return notes


def default_buckets(limit: int) -> list[int]:
    """The buckets NxDI generates itself when bucketing is on and no list is given (modules/autobucketing.py
    generate_buckets(128, limit): powers of two from 128 up to 2**round(log2(limit)), exclusive, then limit),
    written out so the dry run and build.json show them."""
    if limit <= SMALLEST_BUCKET:
        return [limit]
    top = round(math.log2(limit))
    return [2**i for i in range(int(math.log2(SMALLEST_BUCKET)), top)] + [limit]


def batching_fields(spec: BuildSpec) -> dict[str, Any]:
    """Continuous batching as vLLM drives it: each prefill is one request (ctx_batch_size 1) writing only its
    own seq_id's cache line, while the fused step runs the whole batch. The vLLM fork's speculation defaults
    set is_continuous_batching and ctx_batch_size 1 for every batch size, so one artifact layout serves
    all."""
    return {"is_continuous_batching": True, "ctx_batch_size": 1, "tkg_batch_size": spec.batch_size}


def bucketing_fields(spec: BuildSpec, opts: NeuronOptions) -> dict[str, Any]:
    """Bucketing on (as the fork and the plugin default) with the options' lists or NxDI's own for seq_len,
    or off (NxDI then compiles one graph of seq_len for each)."""
    if not opts.enable_bucketing:
        return {"enable_bucketing": False}
    return {"enable_bucketing": True,
            "context_encoding_buckets": list(opts.context_encoding_buckets or default_buckets(spec.seq_len)),
            "token_generation_buckets": list(opts.token_generation_buckets or default_buckets(spec.seq_len))}


def target_neuron_config(spec: BuildSpec, opts: NeuronOptions) -> dict[str, Any]:
    """The target's NeuronConfig keyword arguments: every field fusedspec sets, none left to NxDI's default
    where a default could differ between its versions or hosts."""
    return {
        "tp_degree": spec.tp_degree,
        "batch_size": spec.batch_size,
        **batching_fields(spec),
        "seq_len": spec.seq_len,
        # The whole sequence may be prompt: NxDI's default, and what vLLM passes for max_model_len.
        "max_context_length": spec.seq_len,
        # Given explicitly, so NxDI never takes the dtype from the checkpoint's config (torch_dtype / dtype).
        "torch_dtype": spec.dtype,
        "padding_side": "right",
        "speculation_length": spec.speculation_length,
        "enable_fused_speculation": True,
        "on_device_sampling_config": dict(GREEDY_SAMPLING),
        "output_logits": False,
        # Without pre-sharded weights, load() re-reads the original checkpoints from the compile host's paths.
        "save_sharded_checkpoint": True,
        "skip_sharding": False,
        **bucketing_fields(spec, opts),
        "async_mode": opts.async_mode,
        "logical_nc_config": opts.lnc,
        "target": opts.platform,
    }


def draft_changes() -> dict[str, Any]:
    """What NxDI's recipe changes on the deep copy of the target's neuron config for the draft."""
    return {"speculation_length": 0, "enable_fused_speculation": False}


def inference_overrides(arch: ModelArch) -> dict[str, Any]:
    """InferenceConfig keyword overrides, applied by NxDI after load_pretrained_config.

    NxDI reads config.json with the transformers it pins (4.51 at 0.6.0, 4.57 at 0.9.0); a checkpoint saved
    by transformers 5.x has `rope_parameters.rope_theta` instead of `rope_theta`, which 4.x would replace by
    its default of 10000 without a word. We read both spellings and pass the value explicitly.
    """
    return {"rope_theta": arch.rope_theta}


def serving(spec: BuildSpec, opts: NeuronOptions, target_nc: dict[str, Any]) -> dict[str, Any]:
    """What a vLLM pod needs to serve the artifact as compiled, on the SDK 2.26 stack (the legacy vLLM fork).

    The fork loads NEURON_COMPILED_ARTIFACTS with `Cls(path)` (the artifact's neuron_config.json wins) and
    then sets each --override-neuron-config item on the loaded config, so the override repeats the tutorial's
    two fields with the artifact's own values, and async_mode when it is on (vLLM reads it there, not from the
    artifact). The tutorial passes method "eagle" with a plain Qwen3 draft; on the fork that only shapes
    vLLM's draft config, while NxDI builds draft-model fused speculation from neuron_config.json
    (enable_eagle_speculation stays false). max_model_len keeps k positions free (compile.fused_step): NxDI's
    KV cache holds seq_len positions and a fused step writes k of them.
    """
    platform = PLATFORMS[opts.platform]
    longest = max_model_len(spec.seq_len, spec.k)
    override = ("save_sharded_checkpoint", "enable_fused_speculation",
                *(("async_mode",) if opts.async_mode else ()))
    return {
        "recipe": "Neuron SDK 2.26 Qwen3 fused speculation: aws-neuron/aws-neuron-sdk "
                  "libraries/nxd-inference/tutorials/sd-inference-tutorial.rst (db1586c)",
        "env": {"VLLM_USE_V1": "0", "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
                "NEURON_LOGICAL_NC_CONFIG": str(opts.lnc)},
        "tensor_parallel_size": spec.tp_degree,
        "max_model_len": longest,
        "max_num_seqs": spec.batch_size,
        "dtype": spec.dtype,
        "override_neuron_config": {name: target_nc[name] for name in override},
        "speculative_config": {"num_speculative_tokens": spec.speculation_length, "max_model_len": longest,
                               "method": "eagle"},
        "platform": opts.platform,
        "instance_type": platform.instance_type,
        "logical_nc_config": opts.lnc,
        "neuron_devices": math.ceil(spec.tp_degree / platform.logical_cores_per_device(opts.lnc)),
    }


def translate(
    spec: BuildSpec,
    target: ModelArch,
    draft: ModelArch,
    *,
    target_path: Path,
    draft_path: Path,
    compiled_model_path: Path,
    compile_work_dir: Path,
    options: dict[str, Any] | None = None,
    neuron_cc_flags: str | None = None,
    host_compile_cache_url: str | None = None,
    installed: InstalledNxdi | None = None,
) -> dict[str, Any]:
    """The complete NxDI configuration of one fused build, or ConfigError listing every problem.

    Every NeuronConfig / OnDeviceSamplingConfig / FusedSpecNeuronConfig key in the result is in the accepted
    list of every stored NxDI version and, given `installed` (compile.neuron.fields.InstalledNxdi), of the
    NxDI installed on this host (checked here, so the invariant holds for any options).
    """
    opts = parse_options(options)
    problems = translation_problems(spec, target, draft, opts)
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) with the neuron build {spec.slug}:\n"
                          + "\n".join(f"  - {p}" for p in problems))
    classes = MODEL_CLASSES[target.model_type]
    target_nc = target_neuron_config(spec, opts)
    draft_nc = {**copy.deepcopy(target_nc), **draft_changes()}
    fused = {"worker_cls": classes.ref("model"), "draft_model_path": str(draft_path)}
    lists = field_lists(installed)
    field_check = {
        "NeuronConfig": unknown_per_version(target_nc, "NeuronConfig", lists),
        "OnDeviceSamplingConfig": unknown_per_version(GREEDY_SAMPLING, "OnDeviceSamplingConfig", lists),
        "FusedSpecNeuronConfig": unknown_per_version([*fused, "draft_config"], "FusedSpecNeuronConfig",
                                                     lists),
    }
    sources = list_sources(installed)
    dropped = [(sources[version], f"{cls} field {name!r}") for cls, per_version in field_check.items()
               for version, names in per_version.items() for name in names]
    # Invariant: the translation never emits a name a stored NxDI would drop.
    assert all(source == INSTALLED for source, _ in dropped), field_check
    if dropped:
        assert installed is not None
        on_host = [name for _, name in dropped]
        raise ConfigError(f"the NxDI installed here ({installed.version}) would silently drop "
                          f"{', '.join(on_host)} (its {installed.config_py} does not read them): this "
                          "fusedspec does not support it")
    return {
        "nxdi_versions": sources,
        "unknown_fields_per_nxdi_version": field_check,
        "platform": opts.platform,
        "model_type": target.model_type,
        "classes": {name: classes.ref(name)
                    for name in ("causal_lm", "inference_config", "neuron_config", "model")},
        "target": {"model_path": str(target_path), "neuron_config": target_nc,
                   "inference_config_overrides": inference_overrides(target)},
        "draft": {"model_path": str(draft_path), "neuron_config": draft_nc,
                  "neuron_config_changes_from_target": draft_changes(),
                  "inference_config_overrides": inference_overrides(draft)},
        "fused_spec_config": fused,
        "env": compile_env(opts, compile_work_dir, neuron_cc_flags),
        "compile_cache": compile_cache(opts, host_compile_cache_url),
        "compile": {"compiled_model_path": str(compiled_model_path),
                    "compile_work_dir": str(compile_work_dir),
                    "calls": [*config_calls(classes), "model.compile(compile.compiled_model_path)"]},
        "shard": {"calls": shard_calls(classes), "writes": sharded_files(spec.tp_degree),
                  "program_files": list(PROGRAM_FILES)},
        "expected_files": expected_files(spec.tp_degree),
        "serving": serving(spec, opts, target_nc),
        "notes": translation_notes(spec, target, draft, opts),
    }


def target_only(plan: dict[str, Any], compiled_model_path: Path, compile_work_dir: Path) -> dict[str, Any]:
    """The target alone, same shapes and sampling, no speculation: NxDI's own greedy reference build, with a
    scratch directory of its own (a trace empties its scratch first)."""
    neuron_config = {**copy.deepcopy(plan["target"]["neuron_config"]), **draft_changes()}
    reference = copy.deepcopy(plan)
    reference["target"]["neuron_config"] = neuron_config
    del reference["draft"], reference["fused_spec_config"], reference["serving"], reference["shard"]
    reference["compile"]["compiled_model_path"] = str(compiled_model_path)
    reference["compile"]["compile_work_dir"] = str(compile_work_dir)
    reference["env"]["BASE_COMPILE_WORK_DIR"] = str(compile_work_dir)
    return reference


def compile_env(opts: NeuronOptions, compile_work_dir: Path, neuron_cc_flags: str | None) -> dict[str, str]:
    """Environment of the build's own process (compile.neuron.isolation starts it with these set, so NxDI and
    the compiler read them at import and compile time, and no other build sees them)."""
    env = {
        # Lets a CPU-only compile node target Trainium (NxDI fills it from the detected platform otherwise,
        # models/config.py _setup_kernel_target_platform); optimum-neuron exports from CPU the same way.
        "NEURON_PLATFORM_TARGET_OVERRIDE": opts.platform,
        # NxDI's _get_lnc: the environment wins over the field; set both to the same value.
        "NEURON_LOGICAL_NC_CONFIG": str(opts.lnc),
        # NxDI's scratch (HLOs, NEFFs per bucket) defaults to /tmp/nxd_model/; keep it in our work dir, at a
        # path fixed per graph key (the backend's compile_work_dir): NxD adds --logfile=<scratch>/... to the
        # compiler flags and hashes the flags into the persistent cache's key (neuronx-distributed
        # trace/model_builder.py get_hash_module), so a path per version would miss that cache every time.
        "BASE_COMPILE_WORK_DIR": str(compile_work_dir),
    }
    if neuron_cc_flags:
        env["NEURON_CC_FLAGS"] = neuron_cc_flags
    if opts.compile_cache_url is not None:  # else the process inherits the host's, if any
        env["NEURON_COMPILE_CACHE_URL"] = opts.compile_cache_url
    return env


def compile_cache(opts: NeuronOptions, host_url: str | None) -> dict[str, str | None]:
    """Which persistent compile cache the build's process uses, and who chose it (for the dry run)."""
    if opts.compile_cache_url is not None:
        return {"url": opts.compile_cache_url, "from": "the run config's neuron.compile_cache_url"}
    if host_url:
        return {"url": redact_url(host_url), "from": "NEURON_COMPILE_CACHE_URL of this host (inherited)"}
    return {"url": None, "from": NEURON_DEFAULT_CACHE}


def expected_files(tp_degree: int) -> list[str]:
    return [*EXPECTED_FILES,
            *(f"weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(tp_degree))]


def sharded_files(tp_degree: int) -> list[str]:
    """What the shard step writes: every file compile() writes but the programs."""
    return [name for name in expected_files(tp_degree) if name not in PROGRAM_FILES]


def shard_calls(classes: ModelClasses) -> list[str]:
    """A new revision of the models on the programs of its graph key: what compile() does after the trace.

    NxDI 0.6.0 to 0.9.0 (models/application_base.py at e07f056, fcb5a86, cd3abf3, c63afe0) have
    `shard_weights(compiled_model_path, debug=False, pre_shard_weights_hook=None)`, the last call of
    compile(): with save_sharded_checkpoint it calls `get_builder().shard_checkpoint(serialize_path=
    <path>/weights/)`, which needs the model's modules and checkpoint loader only, no trace
    (neuronx-distributed ModelBuilder.shard_checkpoint: modules on the meta device, the checkpoint read,
    sharded per rank); NxDI's own load() does the same on a model built from a compiled directory when it
    shards at load time. The weights it writes are in the checkpoint's layout; model.pt's weight-layout NEFF
    transforms them on load.
    """
    return [*config_calls(classes),
            "model.config.save(compile.compiled_model_path)  # neuron_config.json, compile()'s first write",
            "model.shard_weights(compile.compiled_model_path)  # weights/, compile()'s last step: no trace"]


def config_calls(classes: ModelClasses) -> list[str]:
    # What device.py does with the data above, in order, for people reading a dry run.
    return [
        f"neuron_config = {classes.neuron_config}(**target.neuron_config)",
        f"config = {classes.inference_config}(neuron_config, "
        "load_config=load_pretrained_config(target.model_path), **target.inference_config_overrides)",
        "draft_neuron_config = copy.deepcopy(neuron_config); apply draft.neuron_config_changes_from_target",
        f"draft_config = {classes.inference_config}(draft_neuron_config, "
        "load_config=load_pretrained_config(draft.model_path), **draft.inference_config_overrides)",
        f"config.fused_spec_config = FusedSpecNeuronConfig({classes.model}, draft_config=draft_config, "
        "draft_model_path=draft.model_path)",
        f"model = {classes.causal_lm}(target.model_path, config)",
    ]
