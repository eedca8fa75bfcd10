"""The device layer: the only module that imports Neuron packages, each time inside a function.

It turns translate.py's plain data into NxDI objects and calls NxDI, nothing more:
  compile_plan(plan)                 NxDI's fused-speculation recipe (inference_demo.py run_inference)
  shard_plan(plan)                   the same model, only its config and weights written next to the
                                     programs of its graph key (a new revision: no trace, no compile)
  load_compiled(path, plan)          `Cls(path)` reads neuron_config.json, as vLLM does; then `load(path)`
  greedy_generate(model, ...)        HuggingFaceGenerationAdapter, greedy, with per-step acceptance counts
  load_session / session_generate    the same two, shaped for compile.neuron.isolation.IsolatedSession
A target-only plan (translate.target_only) goes through the same functions: NxDI's own greedy reference.
backend.py runs every one of them in a process of its own (compile.neuron.isolation), started with the
plan's environment, so nothing here sets os.environ and no NxDI class state outlives one build.
Needs the Neuron SDK; without it `require_sdk` raises InputError saying so.
Cited: aws-neuron/neuronx-distributed-inference 0.9.0 (commit c63afe0) and 0.6.0 (tag v0.6.10598).
"""

from __future__ import annotations

import copy
import importlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusedspec.compile.neuron.steps import request_budget, truncate
from fusedspec.core.errors import ConfigError, InputError

SDK_MISSING = (
    "the neuron backend needs the AWS Neuron SDK (neuronx-cc, torch-neuronx, neuronx-distributed-inference), "
    "which is not installed here; run this on a Trainium host or compile node with the Neuron DLC image, or "
    "see what would be compiled with `fusedspec compile CONFIG --dry-run` (any machine)"
)


def require_sdk() -> None:
    """InputError unless NxDI can be imported. (The PyPI packages of those names off the Neuron repository
    are placeholders whose import fails: that counts as absent.)"""
    try:
        importlib.import_module("neuronx_distributed_inference")
    except ImportError as exc:
        raise InputError(SDK_MISSING) from exc


def _class(ref: dict[str, str]) -> Any:
    module = importlib.import_module(ref["__module__"])
    try:
        return getattr(module, ref["__name__"])
    except AttributeError as exc:
        raise ConfigError(f"the installed NxDI has no {ref['__module__']}.{ref['__name__']}; the translation "
                          "names classes of NxDI 0.6.0 to 0.9.0") from exc


def _inference_config(model_cls: Any, neuron_config: Any, model_path: str, overrides: dict[str, Any]) -> Any:
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    return model_cls.get_config_cls()(
        neuron_config, load_config=load_pretrained_config(model_path), **overrides
    )


def build_model(plan: dict[str, Any]) -> Any:
    """The NxDI application object for a fused plan (or a target-only plan, which has no "draft")."""
    require_sdk()
    model_cls = _class(plan["classes"]["causal_lm"])
    worker = _class(plan["classes"]["model"])
    if model_cls._model_cls is not worker:
        raise ConfigError(f"{model_cls.__name__}._model_cls is {model_cls._model_cls.__name__}, not the "
                          f"{worker.__name__} the translation records; the installed NxDI differs")
    neuron_config_cls = model_cls.get_config_cls().get_neuron_config_cls()
    target = plan["target"]
    neuron_config = neuron_config_cls(**copy.deepcopy(target["neuron_config"]))
    config = _inference_config(model_cls, neuron_config, target["model_path"],
                               target["inference_config_overrides"])
    if "draft" in plan:
        from neuronx_distributed_inference.models.config import FusedSpecNeuronConfig

        draft = plan["draft"]
        # NxDI's recipe: a deep copy of the target's neuron config, so derived fields (kv_cache_tiling, set
        # because fused speculation is on) stay identical for both halves of the fused graph.
        draft_neuron_config = copy.deepcopy(config.neuron_config)
        for name, value in draft["neuron_config_changes_from_target"].items():
            setattr(draft_neuron_config, name, value)
        draft_config = _inference_config(model_cls, draft_neuron_config, draft["model_path"],
                                         draft["inference_config_overrides"])
        config.fused_spec_config = FusedSpecNeuronConfig(
            worker, draft_config=draft_config, draft_model_path=plan["fused_spec_config"]["draft_model_path"]
        )
    return model_cls(target["model_path"], config)


def compile_plan(plan: dict[str, Any]) -> Path:
    """Compile into plan["compile"]["compiled_model_path"]; NxDI writes neuron_config.json, model.pt and
    weights/tp{r}_sharded_checkpoint.safetensors there (application_base.py compile/shard_weights)."""
    out = Path(plan["compile"]["compiled_model_path"])
    Path(plan["compile"]["compile_work_dir"]).mkdir(parents=True, exist_ok=True)
    model = build_model(plan)
    model.compile(str(out))
    return out


def shard_plan(plan: dict[str, Any]) -> Path:
    """Write neuron_config.json and weights/tp{r}_sharded_checkpoint.safetensors for this revision of the
    models into plan["compile"]["compiled_model_path"], beside the model.pt compiled for its graph key:
    compile() without its trace (translate.shard_calls names the NxDI source)."""
    out = Path(plan["compile"]["compiled_model_path"])
    model = build_model(plan)
    model.config.save(str(out))
    model.shard_weights(str(out))
    return out


def load_compiled(artifact_dir: Path, plan: dict[str, Any]) -> Any:
    """Load a compiled artifact onto the Neuron devices, configured only by its own neuron_config.json."""
    require_sdk()
    model_cls = _class(plan["classes"]["causal_lm"])
    model = model_cls(str(artifact_dir))
    model.load(str(artifact_dir))
    return model


def load_session(artifact_dir: str, plan: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(loaded model, what the parent needs of it) for an IsolatedSession: the model stays in that process."""
    model = load_compiled(Path(artifact_dir), plan)
    eos = model.config.eos_token_id
    return model, {"eos_token_id": eos, "pad_token_id": getattr(model.config, "pad_token_id", None)}


def session_generate(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     eos_token_ids: Sequence[int],
                     pad_token_id: int) -> tuple[list[list[int]], list[list[int]] | None, list[float]]:
    return greedy_generate(model, prompts, max_new_tokens, eos_token_ids, pad_token_id)


class _StepRecorder:
    """Forward hooks on the adapter: per call after the first (context encoding), the tokens the fused step
    accepted, `fused_outputs[3] - position_ids`, the quantity hf_adapter.py's loop calls n_matches; and
    for every decode call, fused or target-only, its seconds on the device (pre-hook to hook), which
    the k advice's cost model is measured from (validate.step_costs.device_step_times)."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        self.calls = 0
        self.counts: list[int] = []
        self.seconds: list[float] = []
        self._started = 0.0

    def started(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self._started = time.perf_counter()

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        elapsed = time.perf_counter() - self._started
        self.calls += 1
        if self.calls == 1:
            return
        self.seconds.append(elapsed)
        if self.fused:
            next_pos = output.fused_outputs[3]  # [1, 1] next position id
            self.counts.append(int((next_pos - kwargs["position_ids"]).reshape(-1)[0]))


def greedy_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
) -> tuple[list[list[int]], list[list[int]] | None, list[float]]:
    """Greedy tokens per prompt, for a fused model per-step accepted counts (None for target-only), and
    the seconds of every decode step (all prompts, context encoding excluded).

    One prompt per generate() call: the adapter's fused loop handles one sequence (see steps.py), and NxDI
    pads the batch to the compiled batch size."""
    import torch
    from neuronx_distributed_inference.utils.hf_adapter import HuggingFaceGenerationAdapter

    nc = model.config.neuron_config
    fused = bool(nc.enable_fused_speculation)
    k = int(nc.speculation_length) if fused else 0
    adapter = HuggingFaceGenerationAdapter(model)
    tokens_out: list[list[int]] = []
    accepted_out: list[list[int]] = []
    step_seconds: list[float] = []
    for prompt in prompts:
        budget = request_budget(len(prompt), max_new_tokens, k, nc.seq_len, nc.max_context_length)
        recorder = _StepRecorder(fused)
        before = adapter.register_forward_pre_hook(recorder.started, with_kwargs=True)
        handle = adapter.register_forward_hook(recorder, with_kwargs=True)
        try:
            ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, prompt_len]
            kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "max_new_tokens": budget,
                                      "do_sample": False, "top_k": 1, "eos_token_id": list(eos_token_ids),
                                      "pad_token_id": pad_token_id}
            if fused:
                # What NxDI's accuracy utilities pass to select the fused path (utils/accuracy.py).
                kwargs["prompt_lookup_num_tokens"] = k
            out = adapter.generate(ids, **kwargs)  # [1, prompt_len + new]
        finally:
            handle.remove()
            before.remove()
        step_seconds += recorder.seconds
        new = out[0, ids.shape[1]:].tolist()
        if fused:
            tokens, accepted = truncate(new, recorder.counts, max_new_tokens, eos_token_ids)
            accepted_out.append(accepted)
        else:
            tokens, _ = truncate(new, [1] * max(len(new) - 1, 0), max_new_tokens, eos_token_ids)
        tokens_out.append(tokens)
    return tokens_out, (accepted_out if fused else None), step_seconds
