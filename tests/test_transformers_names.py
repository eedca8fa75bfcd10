"""Two builds validating side by side in a fresh process resolve transformers' names at once; without
the lock (core/transformers_names.py) some threads got "cannot import name ... from 'transformers'"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What two validations do at once: load the artifact's tokenizer, and resolve the model classes.
SCRIPT = """
import json, sys, threading
from fusedspec.core.transformers_names import transformers_names
from fusedspec.validate.prompts import load_tokenizer

failures, loaded = [], {}
def run(job):
    try:
        if job == "tokenizer":
            loaded[job] = type(load_tokenizer(sys.argv[1])).__name__
        else:
            loaded[job] = [c.__name__ for c in transformers_names(*job.split("+"))]
    except Exception as exc:
        failures.append(repr(exc))
jobs = ["tokenizer", "AutoModelForCausalLM+GenerationConfig", "AutoConfig", "tokenizer",
        "GenerationConfig+AutoTokenizer"]
threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"failures": failures, "loaded": loaded}))
"""


def test_threads_of_a_fresh_process_resolve_transformers_names_at_once(qwen3_tokenizer: Path) -> None:
    for _ in range(3):  # the race hit every try without the lock; three fresh processes to be sure
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(qwen3_tokenizer)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["failures"] == []
        assert result["loaded"]["AutoModelForCausalLM+GenerationConfig"] == ["AutoModelForCausalLM",
                                                                              "GenerationConfig"]
        assert "Tokenizer" in result["loaded"]["tokenizer"]  # a transformers tokenizer class
