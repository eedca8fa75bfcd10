"""The Hugging Face models a validation runs beside the artifact, each loaded once.

The greedy reference, the teacher-forced agreement and the host's cost measurement all run the target
(the last two the draft too) through transformers. For a 32B target each load is minutes and tens of GB,
so one validation hands all three one `HfModels`, and each model is loaded by the first that needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusedspec.compile.spec import DTYPES, canonical_dtype
from fusedspec.core.transformers_names import transformers_names


class HfModels:
    """transformers causal LMs by (directory, dtype), loaded on first use and held until this object goes:
    its holder's peak memory is every model it asked for (a validation's: the target and the draft)."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[Path, str], Any] = {}

    def causal_lm(self, directory: Path, dtype: str) -> Any:
        """The model in `directory` in `dtype`, in eval mode, offline, never remote code."""
        import torch
        (AutoModelForCausalLM,) = transformers_names("AutoModelForCausalLM")

        key = (Path(directory).resolve(), canonical_dtype(dtype))
        if key not in self._loaded:
            model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=getattr(torch, DTYPES[key[1]]),
                                                         local_files_only=True, trust_remote_code=False)
            model.eval()
            self._loaded[key] = model
        return self._loaded[key]
