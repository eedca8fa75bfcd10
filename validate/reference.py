"""The greedy reference: what the target alone generates at temperature 0, by an independent implementation.

The fused artifact is checked against Hugging Face transformers (`generate(do_sample=False)`) on the
target checkpoint alone, one prompt at a time (batch 1, no padding). Besides the tokens, the reference
records at every generated position the top-2 logit margin (chosen logit minus the best other logit),
the runner-up token, and the next closest tokens with their gaps, which the near-tie rule of
`validate.greedy` needs (in bfloat16, logits are coarse enough that three-way ties happen).

A reference depends only on the target's content, the rendered prompts, max_new_tokens, the dtype, the
EOS ids and the implementation's versions, never on the build config, so it is cached on disk under
`settings.cache_dir/reference/<key>.json` and a whole matrix computes it once. A file lock makes that hold
across processes (parallel workers); `Reference.from_cache` says which way a caller got it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from fusedspec.compile.documents.base import Document
from fusedspec.compile.spec import canonical_dtype
from fusedspec.core.errors import CheckpointError, ConfigError
from fusedspec.core.files import file_lock
from fusedspec.core.transformers_names import transformers_names
from fusedspec.validate.hf_models import HfModels
from fusedspec.validate.prompts import RenderedPrompt, rendered_hash

REFERENCE_SCHEMA = 2  # bump when what a reference holds or how it is computed changes
CANDIDATES = 8  # other tokens recorded per position, closest first: enough for multi-way ties


class PromptReference(Document):
    """The target's greedy continuation of one rendered prompt.

    tokens[j]: the j-th new token (EOS included when reached). margins[j]: logit of tokens[j] minus the
    best other logit at that position (>= 0 for greedy). runner_up[j]: the best other token there.
    candidates[j]: the CANDIDATES closest other tokens as (token, gap to tokens[j]'s logit), closest first.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    id: str
    cls: str = Field(alias="class")
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    runner_up: tuple[int, ...]
    candidates: tuple[tuple[tuple[int, float], ...], ...] = ()

    def gap(self, position: int, token: int) -> float | None:
        """How far `token`'s logit was below the chosen one at `position`; None when it was not among
        the recorded candidates (then it was not close)."""
        if token == self.runner_up[position]:
            return self.margins[position]
        if position < len(self.candidates):
            return next((g for t, g in self.candidates[position] if t == token), None)
        return None


class Reference(Document):
    """A computed reference, and its cache file `reference/<key>.json` (`from_cache` is not stored)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)
    FIX: ClassVar[str] = "it is computed again"

    schema_version: int = Field(default=REFERENCE_SCHEMA, alias="schema")
    key: str
    dtype: str
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    implementation: dict[str, str]
    prompts: tuple[PromptReference, ...]
    seconds: float  # time the computation took (when it was computed, not loaded)
    from_cache: bool = Field(default=False, exclude=True)

    def by_id(self) -> dict[str, PromptReference]:
        return {p.id: p for p in self.prompts}


def implementation_versions() -> dict[str, str]:
    """The independent implementation and the versions that can change its floating-point results."""
    return {"name": "transformers-greedy", "transformers": metadata.version("transformers"),
            "torch": metadata.version("torch")}


def model_content(identity: Mapping[str, Any]) -> dict[str, Any]:
    """What keys a model's content in a cache: its commit and file hashes, never a path (both empty: a model
    that cannot be keyed)."""
    return {"commit": identity.get("commit"), "files": dict(sorted((identity.get("files") or {}).items()))}


def keyable(content: Mapping[str, Any]) -> bool:
    """Whether a model_content can key a cache: it has a commit or file hashes."""
    return bool(content["commit"] or content["files"])


def reference_key(target_identity: dict[str, Any], rendered: Sequence[RenderedPrompt], *, max_new_tokens: int,
                  dtype: str, eos_token_ids: Sequence[int]) -> str:
    """sha256 over everything a reference depends on: target content (commit or file hashes, never a path),
    rendered prompts, length, dtype, EOS ids, implementation versions."""
    target = model_content(target_identity)
    if not keyable(target):
        raise ConfigError("the target has neither a commit nor file hashes; a reference cannot be keyed "
                          "(resolve the model with registry.hub.resolve_model first)")
    inputs = {
        "schema": REFERENCE_SCHEMA,
        "target": target,
        "prompts": rendered_hash(rendered),
        "max_new_tokens": max_new_tokens,
        "dtype": dtype,
        "eos_token_ids": sorted(eos_token_ids),
        "implementation": implementation_versions(),
    }
    payload = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def get_reference(target_dir: Path, target_identity: dict[str, Any], rendered: Sequence[RenderedPrompt], *,
                  max_new_tokens: int, dtype: str, eos_token_ids: Sequence[int], cache_dir: Path,
                  models: HfModels | None = None) -> Reference:
    """The reference for these inputs: from `cache_dir` when present, else computed once and stored (the
    target taken from `models`, where the caller's other checks find it loaded).

    Concurrent callers (threads or processes) with the same key wait on one lock file, so only the first
    computes; the others read its result.
    """
    dtype = canonical_dtype(dtype)
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be at least 1")
    key = reference_key(target_identity, rendered, max_new_tokens=max_new_tokens, dtype=dtype,
                        eos_token_ids=eos_token_ids)
    folder = Path(cache_dir) / "reference"
    path = folder / f"{key}.json"
    with file_lock(folder / f"{key}.lock"):
        cached = Reference.read_cached(path)  # a damaged or foreign entry is computed again
        if cached is not None and cached.key == key:
            return cached.model_copy(update={"from_cache": True})
        reference = compute_reference(target_dir, rendered, max_new_tokens=max_new_tokens, dtype=dtype,
                                      eos_token_ids=eos_token_ids, key=key, models=models)
        reference.write(path)
        return reference


def compute_reference(target_dir: Path, rendered: Sequence[RenderedPrompt], *, max_new_tokens: int,
                      dtype: str, eos_token_ids: Sequence[int], key: str = "",
                      models: HfModels | None = None) -> Reference:
    """Greedy-generate every prompt with transformers on the target alone (from `models`, or loaded for
    this call) and record the margins.

    The model's own generation_config.json is replaced by a bare one: a checkpoint's defaults (a
    repetition penalty, say) would change greedy output, and the fused artifact applies none of them.
    """
    import torch
    (GenerationConfig,) = transformers_names("GenerationConfig")

    if not eos_token_ids:
        raise CheckpointError(f"{target_dir}: no EOS token id; config.json must name eos_token_id")
    started = time.perf_counter()
    model = (models or HfModels()).causal_lm(target_dir, dtype)
    eos = [int(e) for e in eos_token_ids]
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[0])
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, eos_token_id=eos,
                              pad_token_id=eos[0], repetition_penalty=1.0, output_logits=True,
                              return_dict_in_generate=True)
    results = []
    with torch.inference_mode():
        for prompt in rendered:
            ids = torch.tensor([prompt.ids], dtype=torch.long)  # [1, L]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            tokens = out.sequences[0, ids.shape[1]:]  # [T]
            logits = torch.stack(out.logits)[:, 0, :].float()  # [T, vocab]
            chosen = logits.gather(1, tokens[:, None])[:, 0]  # [T]
            others = logits.scatter(1, tokens[:, None], float("-inf"))  # [T, vocab]
            close, close_ids = others.topk(CANDIDATES, dim=1)  # [T, C], [T, C]: closest first
            gaps = chosen[:, None] - close  # [T, C]
            # No logits processor may act: every token must be the argmax of the raw logits.
            assert bool((gaps >= 0).all()), f"{prompt.id}: generate() did not pick the argmax"
            candidates = tuple(tuple((int(t), float(g)) for t, g in zip(ids_row, gap_row, strict=True))
                               for ids_row, gap_row in zip(close_ids.tolist(), gaps.tolist(), strict=True))
            results.append(PromptReference(id=prompt.id, cls=prompt.cls, prompt_ids=tuple(prompt.ids),
                                           tokens=tuple(int(t) for t in tokens),
                                           margins=tuple(row[0][1] for row in candidates),
                                           runner_up=tuple(row[0][0] for row in candidates),
                                           candidates=candidates))
    return Reference(key=key, dtype=dtype, max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos),
                     implementation=implementation_versions(), prompts=tuple(results),
                     seconds=round(time.perf_counter() - started, 3))
