"""The Hugging Face models a validation runs before the artifact, each loaded once.

The greedy reference, the teacher-forced agreement and the host's cost measurement all run the target
(the last two the draft too) through transformers. For a 32B target each load is minutes and tens of GB,
so one validation hands all three one `HfModels`, and each model is loaded by the first that needs it.
The validation computes all three before it loads the artifact and then closes the `HfModels`, so the
transformers copies are never held beside the artifact's runner.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fusedspec.compile.spec import DTYPES, canonical_dtype
from fusedspec.core.memory import release_freed_memory
from fusedspec.core.transformers_names import transformers_names

# transformers' from_pretrained swaps class attributes for the length of a load and puts back what it found
# (initialization.no_tie_weights sets PreTrainedModel.tie_weights to a no-op, no_init_weights the init
# functions): two loads at once in one process (a run's builds validate side by side in threads) can put the
# no-op back for good, and every later load in that process leaves lm_head untied, on the meta device.
FROM_PRETRAINED_LOCK = threading.Lock()


class HfModels:
    """transformers causal LMs by (directory, dtype), loaded on first use and held until `close`: its
    holder's peak memory is every model it asked for (a validation's: the target and the draft)."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[Path, str], Any] = {}
        self._closed = False

    def causal_lm(self, directory: Path, dtype: str) -> Any:
        """The model in `directory` in `dtype`, in eval mode, offline, never remote code."""
        import torch
        (AutoModelForCausalLM,) = transformers_names("AutoModelForCausalLM")

        key = (Path(directory).resolve(), canonical_dtype(dtype))
        if self._closed:
            # a load now would sit beside the artifact's runner (a second copy of a 32B target)
            raise RuntimeError(f"transformers model {directory} asked for after its holder released its "
                               "models; compute what needs it before the artifact is loaded")
        if key not in self._loaded:
            torch_dtype = getattr(torch, DTYPES[key[1]])
            with FROM_PRETRAINED_LOCK:
                model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch_dtype,
                                                             local_files_only=True, trust_remote_code=False)
            model.eval()
            self._loaded[key] = model
        return self._loaded[key]

    def close(self) -> None:
        """Release every model held (their memory is freed once nothing else refers to them) and refuse to
        load another."""
        models = list(self._loaded.values())
        self._loaded.clear()
        self._closed = True
        tensors = {id(t): t for model in models for t in (*model.parameters(), *model.buffers())}  # tied once
        held = sum(t.numel() * t.element_size() for t in tensors.values())
        del models, tensors
        release_freed_memory(held)  # transformers modules hold reference cycles: large ones are freed now
