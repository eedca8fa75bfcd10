"""Where the cost model's c and b come from, for the artifact and the hardware the advice is about.

  time_artifact_steps     a cpu artifact built with target-alone programs: its own target_step,
                          target_verify and fused_step programs, timed in the validation run
                          (interleaved repeats, medians, the spread kept)
  device_step_times       a neuron artifact on a device host: its fused steps and the target-only
                          reference build's steps, from their own generate runs (needs the device)
  read_step_times         step times recorded elsewhere (e.g. on a Trainium host), as a JSON file
  cost_model_from_times   c and b from any of those step times
  stated_bytes_model      no device here: a stated model of bytes read per step, never a timing of
                          other code (a CPU forward says nothing about a memory-bound device step)

From step times, per the cost model (validate.cost_model), with medians t_T (target step), t_V
(target verifying k positions) and t_F (fused step at k):
    b = (t_V / t_T - 1) / (k - 1)          c = (t_F - t_V) / (k * t_T)
Where verify cannot be timed apart (a Neuron fused step is one graph), b = 0 is stated, not measured,
and c = (t_F / t_T - 1) / k.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.documents.validation import StepTimesRecord
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError, ConfigError
from fusedspec.validate.cost_model import CostModel

ARTIFACT_PROGRAMS = "this artifact's programs"
TIMED_PROGRAMS = ("target_step", "target_verify", "fused_step")
DEFAULT_REPEATS = 9
CALLS_PER_SAMPLE = 3  # a tiny model's step is ~0.1 ms: one sample averages a few calls
TIMED_POSITION = 64  # where in the cache the timed steps write (clamped to the artifact's seq_len)
MIN_COST_RATIO = 1e-4  # a draft never costs nothing; a negative difference of medians is noise
ARTIFACT_PROGRAMS_PLANNED = ("measured in validation on the artifact's own programs (target step, target verify "
                             "at k, fused step)")
TARGET_ALONE_HINT = "build with compile option target_alone: true to measure on the artifact's own programs"
HOST_FORWARDS_PLANNED = ("measured in validation with transformers forwards on the validating host, not the "
                         f"artifact's programs ({TARGET_ALONE_HINT})")
BYTES_MODEL_SOURCE = ("stated model: bytes read per step (weights / TP + KV cache at seq_len), memory-bound "
                      "decode as NxDI decode on Trainium is; not a timing")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---- a cpu artifact's own programs ----------------------------------------------------------------


def time_artifact_steps(runner: Any, *, repeats: int = DEFAULT_REPEATS) -> StepTimesRecord | None:
    """Seconds per call of the artifact's target_step, target_verify (k positions) and fused_step over
    all its lines; None when the artifact has no target-alone programs (built without target_alone).

    The three are interleaved (one sample of each per repeat, the order rotating) so a host getting busier
    halfway through slows all three alike. The caches are taken over: whatever the timed steps write is
    overwritten by the next prefill."""
    import torch

    if not set(TIMED_PROGRAMS) <= set(getattr(runner, "programs", {})):
        return None
    lay = runner.layout
    k = lay.k
    runner.claim_caches(object())  # a batcher made earlier must not decode from what the timing wrote
    pos = torch.full((lay.batch,), min(TIMED_POSITION, lay.seq_len - 1), dtype=torch.int64)  # [B]
    cur = torch.full((lay.batch,), 1, dtype=torch.int64)  # [B]; token values do not change the work
    window = torch.ones(lay.batch, k, dtype=torch.int64)  # [B, k]
    steps: dict[str, Callable[[], Any]] = {
        "target_step": lambda: runner.target_step(cur, pos),
        "target_verify": lambda: runner.target_verify(window, pos),
        "fused_step": lambda: runner.fused_step(cur, pos),
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    with runner.compute_threads(), torch.no_grad():
        for repeat in range(repeats + 1):
            order = names[repeat % len(names):] + names[: repeat % len(names)]
            for name in order:
                started = time.perf_counter()
                for _ in range(CALLS_PER_SAMPLE):
                    steps[name]()
                elapsed = (time.perf_counter() - started) / CALLS_PER_SAMPLE
                if repeat:  # the first round warms allocators and caches up
                    samples[name].append(elapsed)
    return StepTimesRecord(where=ARTIFACT_PROGRAMS, k=k, target_step_s=samples["target_step"],
                           fused_step_s=samples["fused_step"], verify_step_s=samples["target_verify"])


# ---- a neuron artifact on its device --------------------------------------------------------------


def device_step_times(runner: Any, reference_runner: Any, prompts: Sequence[Sequence[int]],
                      max_new_tokens: int, *, repeats: int = 3) -> StepTimesRecord:
    """Per-step seconds of the fused artifact and of its target-only reference build (NeuronBackend
    .compile_reference / .load_reference), each from generate runs on the device, interleaved. Needs
    a Trainium host: both runners hold NxDI models. Each run contributes its mean step time."""
    fused: list[float] = []
    target: list[float] = []
    for _ in range(repeats):
        for source, out in ((runner, fused), (reference_runner, target)):
            timings = source.generate(prompts, max_new_tokens).timings
            if not timings.get("decode_steps"):
                raise ArtifactError("the neuron runner reported no decode step times; its NxDI adapter "
                                    "hook did not run")
            out.append(timings["decode_steps_s"] / timings["decode_steps"])
    return StepTimesRecord(where="this artifact and its target-only build on the Neuron device",
                           k=runner.spec.k, target_step_s=target, fused_step_s=fused, verify_step_s=None)


# ---- recorded step times --------------------------------------------------------------------------


MAX_STEP_TIMES_BYTES = 1 << 20  # 1000 samples of 3 steps is ~60 KB; a bigger file is not step times
STEP_TIMES_FORMAT = ("expected one JSON object: where (text), k (2..32), target_step_s and fused_step_s (lists of "
                     "seconds per step, 1e-7..3600, at most 1000 each), optional verify_step_s")


def read_step_times(path: Path) -> StepTimesRecord:
    """A step-times JSON file (StepTimesRecord's fields); ConfigError saying what is wrong and what is
    expected otherwise. Besides the schema's bounds, a fused step faster than a target step is refused: it
    runs the target's verify and k draft steps, so such a file has its columns swapped or its units mixed."""
    from pydantic import ValidationError

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"step times {path}: no such file")
    if not path.is_file():  # a directory, FIFO or device: reading it could block or never end
        raise ConfigError(f"step times {path}: not a regular file; give the JSON file of recorded step times")
    try:
        size = path.stat().st_size
        if size > MAX_STEP_TIMES_BYTES:
            raise ConfigError(f"step times {path}: {size} bytes, more than {MAX_STEP_TIMES_BYTES}; "
                              f"{STEP_TIMES_FORMAT}")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"step times {path}: cannot be read ({exc.strerror})") from None
    try:
        record = StepTimesRecord.model_validate_json(data)
    except ValidationError as exc:
        raise ConfigError(f"step times {path}: " + "; ".join(describe_errors(exc)) + f" ({STEP_TIMES_FORMAT})") from None
    t_target, t_fused = statistics.median(record.target_step_s), statistics.median(record.fused_step_s)
    if t_fused < t_target:
        raise ConfigError(f"step times {path}: fused_step_s median {t_fused:g} s is below target_step_s median "
                          f"{t_target:g} s, but a fused step runs a target verify and k draft steps; check that "
                          "the two lists are not swapped and share a unit (seconds)")
    return record.model_copy(update={"where": f"{record.where} (recorded in {path.name})"})


# ---- from step times to c and b -------------------------------------------------------------------


def spread(samples: Sequence[float]) -> float:
    """(max - min) / median: how far apart the repeats of one measurement are."""
    return (max(samples) - min(samples)) / statistics.median(samples)


def cost_model_from_times(times: StepTimesRecord) -> CostModel:
    """c and b from step medians (module docstring); the source names what was timed, how often, and the
    largest spread of the timed steps."""
    t_target = statistics.median(times.target_step_s)
    t_fused = statistics.median(times.fused_step_s)
    timed = [times.target_step_s, times.fused_step_s]
    k = times.k
    if times.verify_step_s:
        t_verify = statistics.median(times.verify_step_s)
        timed.append(times.verify_step_s)
        slope = max(0.0, (t_verify / t_target - 1.0) / (k - 1))
        how_b = "b measured"
    else:
        t_verify, slope = t_target, 0.0
        how_b = "b = 0 stated (verify not timed apart from the fused step)"
    ratio = max(MIN_COST_RATIO, (t_fused - t_verify) / (k * t_target))
    samples = min(len(s) for s in timed)
    worst = max(spread(s) for s in timed)
    return CostModel(ratio, slope, source=f"measured on {times.where} at k={k} (median of {samples}, "
                                          f"spread {worst:.0%}; {how_b})")


# ---- no device here: a stated model ---------------------------------------------------------------


def bytes_per_step(arch: ModelArch, spec: BuildSpec) -> float:
    """Bytes one rank reads in one decode step: its share of the weights and of the KV cache at seq_len."""
    from fusedspec.compile.neuron.backend import parameters_all_ranks
    from fusedspec.compile.neuron.heads import sharded_heads

    tp, itemsize = spec.tp_degree, ITEMSIZE[spec.dtype]
    weights = parameters_all_ranks(arch, tp) * itemsize / tp
    # NxDI replicates KV heads when TP exceeds them, or converts to MHA when TP fits neither way
    kv_heads_per_rank = sharded_heads(arch.num_attention_heads, arch.num_key_value_heads, tp).kv_per_rank(tp)
    kv = 2 * arch.num_hidden_layers * kv_heads_per_rank * arch.head_dim * spec.seq_len * itemsize * spec.batch_size
    return weights + kv


def stated_bytes_model(spec: BuildSpec, target: ModelArch, draft: ModelArch) -> CostModel:
    """c = draft bytes / target bytes per step, b = 0: in the memory-bound regime a step's time is the
    bytes it reads, and verifying k positions reads the same weights and cache as decoding one."""
    return CostModel(bytes_per_step(draft, spec) / bytes_per_step(target, spec), 0.0, source=BYTES_MODEL_SOURCE)


def planned_cost_model(backend: str, spec: BuildSpec, target: ModelArch, draft: ModelArch,
                       options: dict[str, Any]) -> dict[str, Any]:
    """What a dry run says about the k advice's cost model: for neuron the stated model's numbers and
    source (validation on a device host measures instead); for cpu where validation will measure it."""
    if backend == "neuron":
        model = stated_bytes_model(spec, target, draft)
        return {"cost_ratio": round(model.cost_ratio, 4), "verify_slope": model.verify_slope, "source": model.source,
                "on_a_device_host": "measured from the artifact's and its target-only build's device step times"}
    planned = ARTIFACT_PROGRAMS_PLANNED if options.get("target_alone") else HOST_FORWARDS_PLANNED
    return {"cost_ratio": None, "verify_slope": None, "source": planned}
