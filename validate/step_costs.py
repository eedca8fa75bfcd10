"""Where the cost model's c and b come from, for the artifact and the hardware the advice is about.

  Runner.step_times       an artifact that can time its own steps apart (a cpu artifact built with
                          target-alone programs: target_step, target_verify and fused_step, timed in
                          the validation run; compile.backend.Runner)
  device_step_times       a neuron artifact on a device host: its fused steps and the target-only
                          reference build's steps, from their own generate runs (needs the device)
  read_step_times         step times recorded elsewhere (e.g. on a Trainium host), as a JSON file
  cost_model_from_times   c and b from any of those step times
  stated_bytes_model      a backend whose decode is memory-bound on hardware this host is not
                          (Backend.stated_step_bytes): a stated model of bytes read per step, never a
                          timing of other code (a CPU forward says nothing about a device step)

From step times, per the cost model (validate.cost_model), with medians t_T (target step), t_V
(target verifying k positions) and t_F (fused step at k):
    b = (t_V / t_T - 1) / (k - 1)          c = (t_F - t_V) / (k * t_T)
Where verify cannot be timed apart (a Neuron fused step is one graph), b = 0 is stated, not measured,
and c = (t_F / t_T - 1) / k.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusedspec.compile.backend import DECODE_STEPS, DECODE_STEPS_S, Runner, get_backend
from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.documents.validation import StepTimesRecord
from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ArtifactError, ConfigError
from fusedspec.validate.cost_model import CostModel

MIN_COST_RATIO = 1e-4  # a draft never costs nothing; a negative difference of medians is noise
ARTIFACT_PROGRAMS_PLANNED = ("measured in validation on the artifact's own programs (target step, target "
                             "verify at k, fused step)")
TARGET_ALONE_HINT = "build with compile option target_alone: true to measure on the artifact's own programs"
HOST_FORWARDS_PLANNED = ("measured in validation with transformers forwards on the validating host, not the "
                         f"artifact's programs ({TARGET_ALONE_HINT})")
BYTES_MODEL_SOURCE = ("stated model: bytes read per step (weights / TP + KV cache at seq_len), memory-bound "
                      "decode as NxDI decode on Trainium is; not a timing")


# ---- a neuron artifact on its device --------------------------------------------------------------


def device_step_times(runner: Runner, reference_runner: Runner, prompts: Sequence[Sequence[int]],
                      max_new_tokens: int, *, repeats: int = 3) -> StepTimesRecord:
    """Per-step seconds of the fused artifact and of its target-only reference build (NeuronBackend
    .compile_reference / .load_reference), each from generate runs on the device, interleaved. Needs
    a Trainium host: both runners hold NxDI models. Each run contributes its mean step time."""
    fused: list[float] = []
    target: list[float] = []
    for _ in range(repeats):
        for source, out in ((runner, fused), (reference_runner, target)):
            timings = source.generate(prompts, max_new_tokens).timings
            if not timings.get(DECODE_STEPS):
                raise ArtifactError("the neuron runner reported no decode step times; its NxDI adapter "
                                    "hook did not run")
            out.append(timings[DECODE_STEPS_S] / timings[DECODE_STEPS])
    return StepTimesRecord(where="this artifact and its target-only build on the Neuron device",
                           k=runner.spec.k, target_step_s=target, fused_step_s=fused, verify_step_s=None)


# ---- recorded step times --------------------------------------------------------------------------


MAX_STEP_TIMES_BYTES = 1 << 20  # 1000 samples of 3 steps is ~60 KB; a bigger file is not step times
STEP_TIMES_FORMAT = ("expected one JSON object: where (text), k (2..32), target_step_s and fused_step_s "
                     "(lists of seconds per step, 1e-7..3600, at most 1000 each), optional verify_step_s")


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
        raise ConfigError(f"step times {path}: " + "; ".join(describe_errors(exc))
                          + f" ({STEP_TIMES_FORMAT})") from None
    t_target, t_fused = statistics.median(record.target_step_s), statistics.median(record.fused_step_s)
    if t_fused < t_target:
        raise ConfigError(f"step times {path}: fused_step_s median {t_fused:g} s is below target_step_s "
                          f"median {t_target:g} s, but a fused step runs a target verify and k draft steps; "
                          "check that the two lists are not swapped and share a unit (seconds)")
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


def stated_bytes_model(backend: str, spec: BuildSpec, target: ModelArch,
                       draft: ModelArch) -> CostModel | None:
    """c = draft bytes / target bytes per step, b = 0, for a backend that states its step costs from bytes
    read (Backend.stated_step_bytes; None for one whose steps are measured here): in the memory-bound
    regime a step's time is the bytes it reads, and verifying k positions reads the same weights and cache
    as decoding one."""
    stated = get_backend(backend)
    draft_bytes, target_bytes = stated.stated_step_bytes(draft, spec), stated.stated_step_bytes(target, spec)
    if draft_bytes is None or target_bytes is None:
        return None
    return CostModel(draft_bytes / target_bytes, 0.0, source=BYTES_MODEL_SOURCE)


def planned_cost_model(backend: str, spec: BuildSpec, target: ModelArch, draft: ModelArch,
                       options: dict[str, Any], given: float | None = None) -> dict[str, Any]:
    """What a dry run says about the k advice's cost model: the cost ratio the run gives the draft; else, for
    a backend that states it (neuron), the stated model's numbers and source (validation on a device host
    measures instead); else where validation will measure it."""
    if given is not None:
        return {"cost_ratio": given, "verify_slope": 0.0, "source": "given"}
    model = stated_bytes_model(backend, spec, target, draft)
    if model is not None:
        return {"cost_ratio": round(model.cost_ratio, 4), "verify_slope": model.verify_slope,
                "source": model.source,
                "on_a_device_host": "measured from the artifact's and its target-only build's device step "
                                    "times"}
    planned = ARTIFACT_PROGRAMS_PLANNED if options.get("target_alone") else HOST_FORWARDS_PLANNED
    return {"cost_ratio": None, "verify_slope": None, "source": planned}
