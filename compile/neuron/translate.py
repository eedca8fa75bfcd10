"""BuildSpec + both model configs -> the complete NxDI configuration for a fused-speculation build, as plain
data. Pure: no Neuron import, no file access, the same answer on any machine, so it is tested here and
printed by `fusedspec compile --dry-run`; device.py turns it into NxDI objects on a Neuron host.

Sources (aws-neuron/neuronx-distributed-inference, read at NxDI 0.9.0 / SDK 2.29, commit c63afe0, and
0.6.0 / SDK 2.26, tag v0.6.10598; field lists also at 0.7.0 fcb5a86 and 0.8.0 cd3abf3):
  - models/config.py: NeuronConfig fields and defaults; `_validate_batch_bucketing_compatibility` (0.9.0)
    rejects `token_generation_batches` with speculation; context/token-generation buckets must fit
    max_context_length / max_length; `_get_lnc` lets NEURON_LOGICAL_NC_CONFIG win over the field;
    FusedSpecNeuronConfig(worker_cls, draft_config, draft_model_path[, draft_model_cls from 0.7.0, fcb5a86]).
  - modules/kvcache/kv_cache_manager.py (0.6.0): without `is_continuous_batching`, context encoding writes
    its KV with `fill_prefix` into every batch line; with it, only the line of its `seq_id` (one sequence per
    call: ctx_batch_size 1). vLLM prefills one request while others decode, so batch > 1 needs it.
  - models/model_base.py (0.6.0): context encoding is compiled at ctx_batch_size, the fused step at
    tkg_batch_size; modules/autobucketing.py: with enable_bucketing, buckets are the given lists, else
    generate_buckets(128, limit).
  - models/model_base.py: the fused model asserts `on_device_sampling_config` and forces the draft greedy;
    it builds the draft with `worker_cls` unless `draft_model_cls` is given.
  - inference_demo.py `run_inference`: the recipe followed here (target config from the checkpoint with
    `load_pretrained_config`, draft neuron config = deep copy of the target's with speculation_length=0 and
    enable_fused_speculation=False, FusedSpecNeuronConfig(model_cls._model_cls, ...) attached as
    `config.fused_spec_config`, `model_cls(target_path, config).compile(path)`).
  - models/application_base.py: compile() writes neuron_config.json and model.pt and, with
    save_sharded_checkpoint=True, weights/tp{rank}_sharded_checkpoint.safetensors for ranks
    0..local_ranks_size-1 (= tp_degree here); scratch goes to BASE_COMPILE_WORK_DIR.
  - models/model_wrapper.py: `target` adds `--target` to the compiler arguments.
The serving side (what a vLLM pod needs, recorded as plan["serving"]) follows the legacy vLLM fork that
serves draft-model fused speculation (aws-neuron/upstreaming-to-vllm, branch neuron-2.24-vllm-v0.7.2 at
490ab20, vllm/model_executor/model_loader/neuronx_distributed.py `_get_default_speculation_config`: bucketing
on, is_continuous_batching True, ctx_batch_size 1, greedy on-device sampling; the DLC of SDK 2.26.1 installs
its branch 2.26.1, which is not public) and the Neuron SDK 2.26 tutorial for Qwen3 fused speculation
(aws-neuron/aws-neuron-sdk libraries/nxd-inference/tutorials/sd-inference-tutorial.rst at db1586c).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusedspec.compile.matrix import tp_problem
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.neuron.fields import (
    accepted_fields,
    field_problems,
    supported_versions,
    unknown_per_version,
)
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError

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


@dataclass(frozen=True)
class Platform:
    """A Trainium generation: its default logical NeuronCore config (NxDI get_platform_lnc: 2 on trn2, else 1)
    and the one instance size that serves a large model on it."""

    default_lnc: int
    physical_cores_per_device: int
    devices_per_node: int
    instance_type: str

    def logical_cores_per_device(self, lnc: int) -> int:
        return self.physical_cores_per_device // lnc


# trn2.48xlarge: 16 Trainium2 devices of 8 NeuronCores (the SDK 2.26 tutorial serves Qwen3-32B at TP 64 with
# the default LNC 2 on it, i.e. all 16 devices); trn1.32xlarge: 16 Trainium devices of 2 NeuronCores.
PLATFORMS = {"trn2": Platform(2, 8, 16, "trn2.48xlarge"), "trn1": Platform(1, 2, 16, "trn1.32xlarge")}
DEFAULT_PLATFORM = "trn2"

# Greedy on-device sampling. Fused speculation asserts that on-device sampling is configured, and
# greedy (do_sample False, top_k 1) is what makes the fused output equal to the target's greedy output.
# `dynamic: False` compiles these values in: the served model ignores each request's temperature, top_k
# and top_p and decodes greedily (the fork's own speculation default, {top_k: 1, do_sample: False}, does too).
GREEDY_SAMPLING = {"do_sample": False, "top_k": 1, "top_p": 1.0, "temperature": 1.0, "dynamic": False,
                   "deterministic": False, "global_topk": 256}
SAMPLING_NOTE = ("on-device sampling is greedy and static (dynamic: false): vLLM requests' temperature, top_k "
                 "and top_p are ignored, every request is decoded greedily")

# Smallest bucket NxDI generates by itself (modules/autobucketing.py: generate_buckets(128, limit)).
SMALLEST_BUCKET = 128
_BATCH = "the matrix's batch_size (continuous batching, one prefill per call, is what vLLM needs)"
# Fields set from the BuildSpec and the options; an override of one of them is refused with the right knob.
OWNED_FIELDS = {
    "tp_degree": "the matrix's tp_degree", "batch_size": "the matrix's batch_size",
    "seq_len": "the matrix's seq_len", "max_context_length": "the matrix's seq_len",
    "max_length": "the matrix's seq_len", "n_positions": "the matrix's seq_len",
    "torch_dtype": "the matrix's dtype", "speculation_length": "the matrix's speculation_length (k)",
    "enable_fused_speculation": "nothing: the neuron backend always builds fused speculation",
    "on_device_sampling_config": "nothing: greedy on-device sampling is required for the greedy check",
    "save_sharded_checkpoint": "nothing: artifacts must carry their sharded weights",
    "skip_sharding": "nothing: artifacts must carry their sharded weights",
    "logical_nc_config": "the option logical_nc_config", "logical_neuron_cores": "the option logical_nc_config",
    "target": "the option platform",
    "is_continuous_batching": _BATCH, "ctx_batch_size": _BATCH, "tkg_batch_size": _BATCH,
    "max_batch_size": _BATCH, "kv_cache_batch_size": _BATCH, "spec_batch_size": _BATCH,
}
# Features that turn this into something other than draft-model fused speculation.
OTHER_SPECULATION = ("enable_eagle_speculation", "is_eagle_draft", "is_eagle3", "is_medusa",
                     "medusa_speculation_length", "num_medusa_heads", "medusa_tree", "token_tree_config")
# Features the serving recipe does not use and whose KV layout or batching differs from what is checked
# here (vLLM then sends requests this artifact was not compiled for).
# {field: (feature, the value that leaves it off)}.
UNSERVED_FEATURES: dict[str, tuple[str, Any]] = {
    "is_block_kv_layout": ("block KV layout (vLLM's prefix caching / chunked prefill)", False),
    "is_prefix_caching": ("prefix caching", False), "chunked_prefill_config": ("chunked prefill", None),
    "attention_dp_degree": ("attention data parallelism", 1), "async_mode": ("async mode", False),
}
OPTION_NAMES = ("platform", "logical_nc_config", "neuron_config")
EXPECTED_FILES = ("neuron_config.json", "model.pt")
BUCKET_FIELDS = (("context_encoding_buckets", "max_context_length"), ("token_generation_buckets", "seq_len"))


@dataclass(frozen=True)
class NeuronOptions:
    """Backend options (they enter the content key): platform, LNC, extra NeuronConfig fields."""

    platform: str = DEFAULT_PLATFORM
    logical_nc_config: int | None = None  # None: the platform's default
    neuron_config: dict[str, Any] = field(default_factory=dict)

    @property
    def lnc(self) -> int:
        return self.logical_nc_config if self.logical_nc_config is not None else PLATFORMS[self.platform].default_lnc


def parse_options(options: dict[str, Any] | None) -> NeuronOptions:
    """Options for the neuron backend, or ConfigError naming each bad one."""
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"neuron backend options must be a mapping, not {options!r}")
    options = dict(options or {})
    problems = [f"unknown neuron backend option {name!r} (known: {', '.join(OPTION_NAMES)})"
                for name in sorted(options) if name not in OPTION_NAMES]
    platform = options.get("platform", DEFAULT_PLATFORM)
    if not isinstance(platform, str) or platform not in PLATFORMS:
        problems.append(f"platform {platform!r} is not one of {', '.join(PLATFORMS)}")
        platform = DEFAULT_PLATFORM
    lnc = options.get("logical_nc_config")
    if lnc is not None and (not isinstance(lnc, int) or isinstance(lnc, bool) or lnc not in (1, 2)):
        problems.append(f"logical_nc_config={lnc!r} must be 1 or 2")
    if lnc == 2 and platform == "trn1":
        problems.append("logical_nc_config=2 needs trn2; trn1 has LNC 1 only")
    extra = options.get("neuron_config", {})
    if not isinstance(extra, dict):
        problems.append(f"option neuron_config must be a mapping of NeuronConfig fields, not {extra!r}")
        extra = {}
    if problems:
        raise ConfigError("neuron backend options: " + "; ".join(problems))
    return NeuronOptions(platform=platform, logical_nc_config=lnc, neuron_config=dict(extra))


def translation_problems(spec: BuildSpec, target: ModelArch, draft: ModelArch, opts: NeuronOptions) -> list[str]:
    """Everything NxDI would reject, silently ignore, or vLLM could not serve, for this build. Empty when fine."""
    problems: list[str] = []  # a BuildSpec is valid on its own by construction (compile.spec)
    if spec.backend != "neuron":
        problems.append(f"the spec is for backend {spec.backend!r}; the neuron backend builds only neuron specs")
    for role, arch in (("target", target), ("draft", draft)):
        if arch.model_type not in MODEL_CLASSES:
            problems.append(f"the {role}'s model_type {arch.model_type!r} has no NxDI causal-LM class here "
                            f"(supported: {', '.join(MODEL_CLASSES)})")
        if isinstance(spec.tp_degree, int) and spec.tp_degree >= 1:
            tp = tp_problem(arch, spec.tp_degree, role)
            if tp:
                problems.append(tp)
        if isinstance(spec.seq_len, int) and spec.seq_len > arch.max_position_embeddings:
            problems.append(f"seq_len={spec.seq_len} exceeds the {role}'s "
                            f"max_position_embeddings={arch.max_position_embeddings}")
    if target.model_type != draft.model_type:
        # Without FusedSpecNeuronConfig.draft_model_cls (NxDI 0.7.0 on, fcb5a86; absent in 0.6.0, the SDK 2.26
        # stack that serves fused speculation) NxDI builds the draft with the target's worker class, so a
        # draft of another family would load into the wrong model.
        problems.append(f"the draft's model_type {draft.model_type!r} differs from the target's "
                        f"{target.model_type!r}; NxDI builds the draft with the target's model class")
    problems.extend(_node_problems(spec, opts))
    problems.extend(_override_problems(spec, opts.neuron_config))
    return problems


def _node_problems(spec: BuildSpec, opts: NeuronOptions) -> list[str]:
    """The TP must fit one instance: NxDI and the vLLM fork run one model on one node."""
    if not isinstance(spec.tp_degree, int) or spec.tp_degree < 1:
        return []
    platform = PLATFORMS[opts.platform]
    cores = platform.logical_cores_per_device(opts.lnc) * platform.devices_per_node
    if spec.tp_degree > cores:
        return [f"tp_degree={spec.tp_degree} exceeds the {cores} logical NeuronCores of one {platform.instance_type} "
                f"at logical_nc_config={opts.lnc}; NxDI serves a model on one node: use tp_degree <= {cores}"]
    return []


def _override_problems(spec: BuildSpec, extra: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for name in sorted(extra):
        if name in OWNED_FIELDS:
            problems.append(f"NeuronConfig field {name!r} is set by fusedspec; change {OWNED_FIELDS[name]} instead")
        elif name in OTHER_SPECULATION:
            problems.append(f"NeuronConfig field {name!r} selects another speculation method; the neuron "
                            "backend builds draft-model fused speculation only")
        elif name in UNSERVED_FEATURES and _turned_on(extra[name], UNSERVED_FEATURES[name][1]):
            problems.append(f"NeuronConfig field {name!r} turns on {UNSERVED_FEATURES[name][0]}, which the vLLM "
                            "recipe these artifacts are served with does not use; remove it")
    if extra.get("token_generation_batches") is not None:
        # NxDI 0.9.0 raises ValueError for batch bucketing with speculation; 0.6.0 does not know the field
        # and would drop it. Either way the build would not be what was asked for.
        problems.append("batch bucketing (token_generation_batches) cannot be combined with speculation: NxDI "
                        "rejects it (models/config.py, _validate_batch_bucketing_compatibility); remove it")
    bucketing = extra.get("enable_bucketing", True)
    if not isinstance(bucketing, bool):
        problems.append(f"enable_bucketing must be true or false, not {bucketing!r}")
    for name, _limit_name in BUCKET_FIELDS:
        if name in extra:
            problems.extend(_bucket_problems(name, extra[name], spec, bucketing is not False))
    if (bucketing is True and "token_generation_buckets" not in extra and isinstance(spec.seq_len, int)
            and isinstance(spec.speculation_length, int) and spec.seq_len > spec.speculation_length):
        small = [b for b in default_buckets(spec.seq_len) if b <= spec.speculation_length]
        if small:
            problems.append(f"NxDI's default token_generation_buckets {small} leave no room for a fused step of "
                            f"k={spec.speculation_length} tokens; give token_generation_buckets above k")
    known = [n for n in extra if n not in OWNED_FIELDS and n not in OTHER_SPECULATION
             and n != "token_generation_batches"]
    problems.extend(field_problems(known, "NeuronConfig", where="option neuron_config"))
    return problems


def _turned_on(value: Any, off: Any) -> bool:
    # NxDI tests these fields for truth (booleans), for None (configs) or against 1 (degrees).
    if off is None:
        return value is not None
    if isinstance(off, bool):
        return bool(value)
    return bool(value != off)


def _bucket_problems(name: str, buckets: Any, spec: BuildSpec, bucketing: bool) -> list[str]:
    if not bucketing:  # modules/autobucketing.py reads the lists only with enable_bucketing
        return [f"{name} is ignored when enable_bucketing is false; remove one of them"]
    if (not isinstance(buckets, list) or not buckets
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in buckets)):
        return [f"{name} must be a non-empty list of positive integers, not {buckets!r}"]
    limit = spec.seq_len  # max_context_length = seq_len here
    if not isinstance(limit, int):
        return []
    problems = []
    if max(buckets) > limit:
        problems.append(f"{name} {sorted(buckets)}: the largest must be <= seq_len={limit} (NxDI asserts it)")
    elif max(buckets) < limit:
        # vLLM admits up to max_model_len = seq_len; NxDI has no bucket for anything longer than the largest.
        problems.append(f"{name} {sorted(buckets)}: the largest must be seq_len={limit}, or vLLM accepts "
                        "sequences the compiled model has no bucket for")
    if name == "token_generation_buckets" and isinstance(spec.speculation_length, int):
        small = [b for b in buckets if b <= spec.speculation_length]
        if small:
            problems.append(f"token_generation_buckets {small} leave no room for a fused step of "
                            f"k={spec.speculation_length} tokens")
    return problems


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
    set is_continuous_batching and ctx_batch_size 1 for every batch size, so one artifact layout serves all."""
    return {"is_continuous_batching": True, "ctx_batch_size": 1, "tkg_batch_size": spec.batch_size}


def bucketing_fields(spec: BuildSpec, extra: dict[str, Any]) -> dict[str, Any]:
    """Bucketing on (as the fork and the plugin default) with NxDI's own buckets for seq_len, unless the
    options turn it off or give lists."""
    if extra.get("enable_bucketing", True) is False:
        return {"enable_bucketing": False}
    return {"enable_bucketing": True,
            "context_encoding_buckets": default_buckets(spec.seq_len),
            "token_generation_buckets": default_buckets(spec.seq_len)}


def target_neuron_config(spec: BuildSpec, opts: NeuronOptions) -> dict[str, Any]:
    """The target's NeuronConfig keyword arguments."""
    config: dict[str, Any] = {
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
        **bucketing_fields(spec, opts.neuron_config),
        "logical_nc_config": opts.lnc,
        "target": opts.platform,
    }
    config.update(copy.deepcopy(opts.neuron_config))
    return config


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

    The fork loads NEURON_COMPILED_ARTIFACTS with `Cls(path)` (the artifact's neuron_config.json wins) and then
    sets each --override-neuron-config item on the loaded config, so the override repeats the tutorial's two
    fields with the artifact's own values and nothing else. The tutorial passes method "eagle" with a plain
    Qwen3 draft; on the fork that only shapes vLLM's draft config, while NxDI builds draft-model fused
    speculation from neuron_config.json (enable_eagle_speculation stays false).
    """
    platform = PLATFORMS[opts.platform]
    cores = platform.logical_cores_per_device(opts.lnc)
    return {
        "recipe": "Neuron SDK 2.26 Qwen3 fused speculation: aws-neuron/aws-neuron-sdk "
                  "libraries/nxd-inference/tutorials/sd-inference-tutorial.rst (db1586c)",
        "env": {"VLLM_USE_V1": "0", "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
                "NEURON_LOGICAL_NC_CONFIG": str(opts.lnc)},
        "tensor_parallel_size": spec.tp_degree,
        "max_model_len": spec.seq_len,
        "max_num_seqs": spec.batch_size,
        "dtype": spec.dtype,
        "override_neuron_config": {name: target_nc[name] for name in ("save_sharded_checkpoint",
                                                                      "enable_fused_speculation")},
        "speculative_config": {"num_speculative_tokens": spec.speculation_length, "max_model_len": spec.seq_len,
                               "method": "eagle"},
        "platform": opts.platform,
        "instance_type": platform.instance_type,
        "logical_nc_config": opts.lnc,
        "neuron_devices": math.ceil(spec.tp_degree / cores),
        "notes": [SAMPLING_NOTE],
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
) -> dict[str, Any]:
    """The complete NxDI configuration of one fused build, or ConfigError listing every problem.

    Every NeuronConfig / OnDeviceSamplingConfig / FusedSpecNeuronConfig key in the result is in the
    accepted field list of every supported NxDI version (checked here, so the invariant holds for any options).
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
    field_check = {
        "NeuronConfig": unknown_per_version(target_nc, "NeuronConfig"),
        "OnDeviceSamplingConfig": unknown_per_version(GREEDY_SAMPLING, "OnDeviceSamplingConfig"),
        "FusedSpecNeuronConfig": unknown_per_version([*fused, "draft_config"], "FusedSpecNeuronConfig"),
    }
    # Invariant: the translation never emits a name any supported NxDI would drop.
    assert not any(names for per_class in field_check.values() for names in per_class.values()), field_check
    assert set(target_nc) <= accepted_fields("NeuronConfig")
    tp = spec.tp_degree
    return {
        "nxdi_versions": supported_versions(),
        "unknown_fields_per_nxdi_version": field_check,
        "platform": opts.platform,
        "model_type": target.model_type,
        "classes": {name: classes.ref(name) for name in ("causal_lm", "inference_config", "neuron_config", "model")},
        "target": {"model_path": str(target_path), "neuron_config": target_nc,
                   "inference_config_overrides": inference_overrides(target)},
        "draft": {"model_path": str(draft_path), "neuron_config": draft_nc,
                  "neuron_config_changes_from_target": draft_changes(),
                  "inference_config_overrides": inference_overrides(draft)},
        "fused_spec_config": fused,
        "env": compile_env(opts, compile_work_dir, neuron_cc_flags),
        "compile": {"compiled_model_path": str(compiled_model_path), "compile_work_dir": str(compile_work_dir),
                    "calls": _calls(classes)},
        "expected_files": expected_files(tp),
        "serving": serving(spec, opts, target_nc),
    }


def target_only(plan: dict[str, Any], compiled_model_path: Path) -> dict[str, Any]:
    """The target alone, same shapes and sampling, no speculation: NxDI's own greedy reference build."""
    neuron_config = {**copy.deepcopy(plan["target"]["neuron_config"]), **draft_changes()}
    reference = copy.deepcopy(plan)
    reference["target"]["neuron_config"] = neuron_config
    del reference["draft"], reference["fused_spec_config"], reference["serving"]
    reference["compile"]["compiled_model_path"] = str(compiled_model_path)
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
        # NxDI's scratch (HLOs, NEFFs per bucket) defaults to /tmp/nxd_model/; keep it in our work dir.
        "BASE_COMPILE_WORK_DIR": str(compile_work_dir),
    }
    if neuron_cc_flags:
        env["NEURON_CC_FLAGS"] = neuron_cc_flags
    return env


def expected_files(tp_degree: int) -> list[str]:
    return [*EXPECTED_FILES, *(f"weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(tp_degree))]


def _calls(classes: ModelClasses) -> list[str]:
    # What device.py does with the data above, in order, for people reading a dry run.
    return [
        f"neuron_config = {classes.neuron_config}(**target.neuron_config)",
        f"config = {classes.inference_config}(neuron_config, load_config=load_pretrained_config(target.model_path),"
        " **target.inference_config_overrides)",
        "draft_neuron_config = copy.deepcopy(neuron_config); apply draft.neuron_config_changes_from_target",
        f"draft_config = {classes.inference_config}(draft_neuron_config, "
        "load_config=load_pretrained_config(draft.model_path), **draft.inference_config_overrides)",
        f"config.fused_spec_config = FusedSpecNeuronConfig({classes.model}, draft_config=draft_config, "
        "draft_model_path=draft.model_path)",
        f"model = {classes.causal_lm}(target.model_path, config)",
        "model.compile(compile.compiled_model_path)",
    ]
