"""What one greedy gate checks, handed over whole by its caller (validate.greedy.validate_artifact).

The caller holds everything already: the artifact's build description as its build returned it, the
downloaded models with their parsed config.json (a plan's), the loaded prompt set, and the run config's
validation section. Nothing of it is resolved, parsed or re-read from disk by the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.documents.validation import StepTimesRecord
from fusedspec.compile.modelconfig import ModelConfig
from fusedspec.compile.runconfig import DEFAULT_MAX_NEW_TOKENS, ValidationConfig
from fusedspec.compile.trust import LoadTrust
from fusedspec.validate.prompts import VARIANTS, PromptSet


@dataclass(frozen=True)
class ValidationRequest:
    """One artifact's gate. Its settings carry the names of the run config's validation section
    (`for_run`), so a new validation setting is a field there and here, and nothing between changes.

    `target_dir` and `draft_dir` hold the downloaded models the artifact was built from (the caller pins
    them to its recorded content); `target_config` and `draft_config` are their parsed config.json (None:
    parsed from those directories when needed). `cost_ratio` or `step_times` (recorded on the hardware the
    artifact serves on) set the advice's cost model, else validate.advice.advise_pair picks it. `trust`
    (compile.trust) is what loading may believe about the artifact's bytes; None: a build of this work dir
    when the artifact is under its builds/ (native code anywhere else is refused before it loads)."""

    artifact_dir: Path
    description: BuildDescription  # the artifact's build.json, as its build handed it over
    target_dir: Path
    draft_dir: Path
    prompt_set: PromptSet
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    near_tie_tolerance: float | None = None  # None: the artifact's dtype's default (validate.greedy)
    cost_ratio: float | None = None
    variants: tuple[str, ...] = VARIANTS
    advice: bool = True
    step_times: StepTimesRecord | None = None
    trust: LoadTrust | None = None
    target_config: ModelConfig | None = None
    draft_config: ModelConfig | None = None

    @classmethod
    def for_run(cls, validation: ValidationConfig, **handed: Any) -> ValidationRequest:
        """The gate a run config's validation section asks for; the prompt file comes loaded (`prompt_set`)
        with the rest of what the caller hands over."""
        return cls(**validation.model_dump(exclude={"prompts"}), **handed)
