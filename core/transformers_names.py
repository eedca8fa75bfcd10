"""Names from transformers, resolved under one process-wide lock.

transformers (5.x) resolves `from transformers import X` through a lazy module that is not
thread-safe: when threads of a fresh process import from it at once, some get "ImportError: cannot
import name 'GenerationConfig' from 'transformers'" (6 runs of 6 with 4 threads here). fusedspec does
that when two builds validate side by side in one process (a local fan-out with max_workers 2): the
2-worker run of bench/pipeline_cost.py failed so. vllm-project/vllm#40442 reports the same race.
Once the names are resolved, loading models and tokenizers from several threads is fine.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()


def transformers_names(*names: str) -> tuple[Any, ...]:
    """The transformers attributes `names` (classes such as "AutoTokenizer"), in order."""
    with _LOCK:
        import transformers

        return tuple(getattr(transformers, name) for name in names)
