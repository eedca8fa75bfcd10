"""BuildSpec + both model configs -> the complete NxDI configuration for a fused-speculation build, as plain
data. Pure: no Neuron import, no file access, the same answer on any machine, so it is tested here and
printed by `fusedspec compile --dry-run`; device.py turns it into NxDI objects on a Neuron host.

Sources (aws-neuron/neuronx-distributed-inference, read at NxDI 0.9.0 / SDK 2.29, commit c63afe0, and
0.6.0 / SDK 2.26, tag v0.6.10598):
  - models/config.py: NeuronConfig fields and defaults; `_validate_batch_bucketing_compatibility` (0.9.0)
    rejects `token_generation_batches` with speculation; context/token-generation buckets must fit
    max_context_length / max_length; `_get_lnc` lets NEURON_LOGICAL_NC_CONFIG win over the field;
    FusedSpecNeuronConfig(worker_cls, draft_config, draft_model_path[, draft_model_cls in 0.9.0 only]).
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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compile.errors import ConfigError
from compile.matrix import tp_problem
from compile.modelconfig import ModelArch
from compile.neuron.fields import accepted_fields, field_problems, supported_versions
from compile.spec import BuildSpec

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

# Platform -> its default logical NeuronCore config (NxDI get_platform_lnc: 2 on trn2/trn3, else 1).
PLATFORMS = {"trn2": 2, "trn1": 1}
DEFAULT_PLATFORM = "trn2"

# Greedy on-device sampling. Fused speculation asserts that on-device sampling is configured, and
# greedy (do_sample False, top_k 1) is what makes the fused output equal to the target's greedy output.
GREEDY_SAMPLING = {"do_sample": False, "top_k": 1, "top_p": 1.0, "temperature": 1.0, "dynamic": False,
                   "deterministic": False, "global_topk": 256}

# Fields set from the BuildSpec and the options; an override of one of them is refused with the right knob.
OWNED_FIELDS = {
    "tp_degree": "the matrix's tp_degree", "batch_size": "the matrix's batch_size",
    "seq_len": "the matrix's seq_len", "max_context_length": "the matrix's seq_len",
    "torch_dtype": "the matrix's dtype", "speculation_length": "the matrix's speculation_length (k)",
    "enable_fused_speculation": "nothing: the neuron backend always builds fused speculation",
    "on_device_sampling_config": "nothing: greedy on-device sampling is required for the greedy check",
    "save_sharded_checkpoint": "nothing: artifacts must carry their sharded weights",
    "skip_sharding": "nothing: artifacts must carry their sharded weights",
    "logical_nc_config": "the option logical_nc_config", "logical_neuron_cores": "the option logical_nc_config",
    "target": "the option platform",
}
# Features that turn this into something other than draft-model fused speculation.
OTHER_SPECULATION = ("enable_eagle_speculation", "is_eagle_draft", "is_eagle3", "is_medusa",
                     "medusa_speculation_length", "num_medusa_heads", "medusa_tree", "token_tree_config")
OPTION_NAMES = ("platform", "logical_nc_config", "neuron_config")
EXPECTED_FILES = ("neuron_config.json", "model.pt")


@dataclass(frozen=True)
class NeuronOptions:
    """Backend options (they enter the content key): platform, LNC, extra NeuronConfig fields."""

    platform: str = DEFAULT_PLATFORM
    logical_nc_config: int | None = None  # None: the platform's default
    neuron_config: dict[str, Any] = field(default_factory=dict)

    @property
    def lnc(self) -> int:
        return self.logical_nc_config if self.logical_nc_config is not None else PLATFORMS[self.platform]


def parse_options(options: dict[str, Any] | None) -> NeuronOptions:
    """Options for the neuron backend, or ConfigError naming each bad one."""
    options = dict(options or {})
    problems = [f"unknown neuron backend option {name!r} (known: {', '.join(OPTION_NAMES)})"
                for name in sorted(options) if name not in OPTION_NAMES]
    platform = options.get("platform", DEFAULT_PLATFORM)
    if platform not in PLATFORMS:
        problems.append(f"platform {platform!r} is not one of {', '.join(PLATFORMS)}")
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
    """Everything NxDI would reject, or silently ignore, for this build. Empty when it is fine."""
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
        # FusedSpecNeuronConfig.draft_model_cls exists only from NxDI 0.9.0; without it NxDI builds the draft
        # with the target's worker class, so a draft of another family would load into the wrong model.
        problems.append(f"the draft's model_type {draft.model_type!r} differs from the target's "
                        f"{target.model_type!r}; NxDI builds the draft with the target's model class")
    problems.extend(_override_problems(spec, opts.neuron_config))
    return problems


def _override_problems(spec: BuildSpec, extra: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for name in sorted(extra):
        if name in OWNED_FIELDS:
            problems.append(f"NeuronConfig field {name!r} is set by fusedspec; change {OWNED_FIELDS[name]} instead")
        elif name in OTHER_SPECULATION:
            problems.append(f"NeuronConfig field {name!r} selects another speculation method; the neuron "
                            "backend builds draft-model fused speculation only")
    if extra.get("token_generation_batches") is not None:
        # NxDI 0.9.0 raises ValueError for batch bucketing with speculation; 0.6.0 does not know the field
        # and would drop it. Either way the build would not be what was asked for.
        problems.append("batch bucketing (token_generation_batches) cannot be combined with speculation: NxDI "
                        "rejects it (models/config.py, _validate_batch_bucketing_compatibility); remove it")
    for name, limit, what in (("context_encoding_buckets", spec.seq_len, "max_context_length"),
                              ("token_generation_buckets", spec.seq_len, "seq_len")):
        buckets = extra.get(name)
        if buckets is None:
            continue
        if (not isinstance(buckets, list) or not buckets
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in buckets)):
            problems.append(f"{name} must be a non-empty list of positive integers, not {buckets!r}")
        elif max(buckets) > limit:
            problems.append(f"{name} {sorted(buckets)}: the largest must be <= {what}={limit} (NxDI asserts it)")
        elif not extra.get("enable_bucketing", False):  # modules/autobucketing.py reads them only then
            problems.append(f"{name} is ignored unless enable_bucketing is true; set both or neither")
    if "token_generation_buckets" in extra and isinstance(extra["token_generation_buckets"], list):
        small = [b for b in extra["token_generation_buckets"] if isinstance(b, int) and b <= spec.speculation_length]
        if small:
            problems.append(f"token_generation_buckets {small} leave no room for a fused step of "
                            f"k={spec.speculation_length} tokens")
    known = [n for n in extra if n not in OWNED_FIELDS and n not in OTHER_SPECULATION
             and n != "token_generation_batches"]
    problems.extend(field_problems(known, "NeuronConfig", where="option neuron_config"))
    return problems


def target_neuron_config(spec: BuildSpec, opts: NeuronOptions) -> dict[str, Any]:
    """The target's NeuronConfig keyword arguments."""
    config: dict[str, Any] = {
        "tp_degree": spec.tp_degree,
        "batch_size": spec.batch_size,
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
        # One context-encoding bucket (max_context_length) and one fused bucket (seq_len), no batch buckets:
        # the simplest layout NxDI accepts with speculation. Users may enable length bucketing via options.
        "enable_bucketing": False,
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
    accepted field list (checked here, so the invariant holds for any options).
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
    # Invariants: the translation never emits a name NxDI would drop.
    assert set(target_nc) <= accepted_fields("NeuronConfig"), set(target_nc) - accepted_fields("NeuronConfig")
    assert set(GREEDY_SAMPLING) <= accepted_fields("OnDeviceSamplingConfig")
    assert set(fused) | {"draft_config"} <= accepted_fields("FusedSpecNeuronConfig")
    tp = spec.tp_degree
    return {
        "nxdi_versions": supported_versions(),
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
    }


def target_only(plan: dict[str, Any], compiled_model_path: Path) -> dict[str, Any]:
    """The target alone, same shapes and sampling, no speculation: NxDI's own greedy reference build."""
    neuron_config = {**copy.deepcopy(plan["target"]["neuron_config"]), **draft_changes()}
    reference = copy.deepcopy(plan)
    reference["target"]["neuron_config"] = neuron_config
    del reference["draft"], reference["fused_spec_config"]
    reference["compile"]["compiled_model_path"] = str(compiled_model_path)
    return reference


def compile_env(opts: NeuronOptions, compile_work_dir: Path, neuron_cc_flags: str | None) -> dict[str, str]:
    """Environment to set before the first Neuron import (NxDI and the compiler read it at import/compile)."""
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
