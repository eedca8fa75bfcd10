"""Acceptance along the target's greedy sequence, and the fused steps it implies for every k.

With greedy drafting and greedy verification, a fused step accepts the draft's proposals exactly as
long as they equal the target's own greedy tokens. So one teacher-forced forward pass of the draft over
prompt + y_1..y_N (the reference) tells, for every position, whether the draft agrees, and that decides
every step for every k:

    agree[j] (j >= 2): the draft's argmax given prompt + y_1..y_{j-1} equals y_j
    p = 1; while p < N: c = consecutive agreeing j = p+1, p+2, ... (at most k-1, j <= N)
                        a = min(c + 1, N - p); record a; p += a

y_1 comes from context encoding and is not a step. The target is also run teacher-forced once, as a
check that its argmax along its own greedy sequence reproduces the reference (`target_flips` counts the
positions where it does not: near-ties of the target itself, which make predictions unreliable there).

Definitions used in every table:
    steps             fused steps, summed over prompts
    tokens            tokens those steps produced, sum of (N - 1) over prompts
    tokens_per_step   tokens / steps  (1.0 means no gain; at most k)
    acceptance_rate   accepted draft tokens / proposed draft tokens, where each step proposes k-1 draft
                      tokens and keeps a-1 of them
    agreement         fraction of positions j >= 2 where agree[j] (independent of k)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, StrictBool

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.validation import KRow
from fusedspec.compile.spec import MAX_K, canonical_dtype
from fusedspec.core.errors import ConfigError
from fusedspec.core.files import file_lock
from fusedspec.validate.hf_models import HfModels
from fusedspec.validate.reference import Reference, implementation_versions, keyable, model_content

DEFAULT_K_RANGE = range(2, 17)
OVERALL = "overall"
AGREEMENT_SCHEMA = 1  # bump when what a cached agreement holds or how it is computed changes


@dataclass(frozen=True)
class PromptAgreement:
    """Teacher-forced agreement for one prompt of a reference.

    draft_hits[i] is True when the draft's argmax after prompt + y_1..y_i equals y_{i+1} (i = 0..N-1),
    so agree[j] of the contract is draft_hits[j-1]; draft_hits[0] (predicting y_1) is never used.
    """

    id: str
    cls: str
    n_tokens: int
    draft_hits: tuple[StrictBool, ...]  # read from a cache: true and false only, no "yes" or 1 taken as a hit
    target_flips: int

    def agree(self, j: int) -> bool:
        return self.draft_hits[j - 1]

    @property
    def agreement(self) -> float | None:
        used = self.draft_hits[1:]
        return sum(used) / len(used) if used else None


def parse_k_range(text: str) -> list[int]:
    """'2..16' (inclusive), '4' or '2,4,8' -> sorted ks, each in 2..MAX_K (what a backend builds)."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            if hi - lo > MAX_K:  # checked before the range is made: 2..100000000 must not take memory or time
                raise ConfigError(f"k range {text!r}: every k must be at most "
                                  f"{MAX_K} (the largest k a backend builds)")
            ks = list(range(lo, hi + 1))
        else:
            ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"k range {text!r}: write LO..HI (e.g. 2..16) "
                          "or a comma list (e.g. 4,7,9)") from exc
    if not ks:  # 3..2, or a list of commas
        raise ConfigError(f"k range {text!r} holds no k: write LO..HI with LO <= HI (e.g. 2..16) or a comma "
                          "list (e.g. 4,7,9)")
    if ks[0] < 2:
        raise ConfigError(f"k range {text!r}: every k must be at least 2 (k=1 is plain decoding)")
    if ks[-1] > MAX_K:
        raise ConfigError(f"k range {text!r}: every k must be at most "
                          f"{MAX_K} (the largest k a backend builds)")
    return ks


# ---- the teacher-forced passes ------------------------------------------------------------------


def teacher_forced_agreement(target_dir: Path, draft_dir: Path, reference: Reference, *,
                             dtype: str = "float32", models: HfModels | None = None) -> list[PromptAgreement]:
    """One forward pass of each model (from `models`, or loaded for this call) per prompt over
    prompt + y_1..y_{N-1}; agreement per position."""
    import torch

    models = models or HfModels()
    argmaxes: dict[str, list[list[int]]] = {}
    for role, path in (("target", target_dir), ("draft", draft_dir)):
        model = models.causal_lm(path, dtype)
        per_prompt: list[list[int]] = []
        with torch.inference_mode():
            for ref in reference.prompts:
                if not ref.tokens:
                    per_prompt.append([])
                    continue
                seq = list(ref.prompt_ids) + list(ref.tokens[:-1])
                ids = torch.tensor([seq], dtype=torch.long)  # [1, L + N - 1]
                # Only the last N positions predict y_1..y_N: keep just their logits.
                logits = model(ids, logits_to_keep=len(ref.tokens)).logits[0]  # [N, vocab]
                per_prompt.append(logits.argmax(dim=-1).tolist())
        argmaxes[role] = per_prompt
    results = []
    for ref, target_pred, draft_pred in zip(reference.prompts, argmaxes["target"], argmaxes["draft"],
                                            strict=True):
        hits = tuple(d == y for d, y in zip(draft_pred, ref.tokens, strict=True))
        flips = sum(t != y for t, y in zip(target_pred, ref.tokens, strict=True))
        results.append(PromptAgreement(id=ref.id, cls=ref.cls, n_tokens=len(ref.tokens), draft_hits=hits,
                                       target_flips=flips))
    return results


class _CachedAgreement(Document):
    """A computed agreement, in its cache file `agreement/<key>.json`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)
    FIX: ClassVar[str] = "it is computed again"

    schema_version: int = Field(default=AGREEMENT_SCHEMA, alias="schema")
    key: str
    prompts: tuple[PromptAgreement, ...]


def get_agreement(target_dir: Path, draft_dir: Path, draft_identity: dict[str, Any], reference: Reference, *,
                  dtype: str, cache_dir: Path, models: HfModels | None = None) -> list[PromptAgreement]:
    """teacher_forced_agreement, computed once per pair and reference and then read from `cache_dir`.

    It depends only on the reference (its key holds the target's content, the prompts, the length, the
    dtype and the implementation), the draft's content and the dtype, never on the build: the builds of a
    matrix (every TP and k of one pair) share it, and only the first loads the two models for it (for a
    32B target, minutes and tens of GB each time). A reference without a key, or a draft with neither a
    commit nor file hashes, cannot be keyed: then it is computed, not cached. Concurrent callers with the
    same key wait on one lock file, as for the reference."""
    dtype = canonical_dtype(dtype)
    draft = model_content(draft_identity)
    if not reference.key or not keyable(draft):
        return teacher_forced_agreement(target_dir, draft_dir, reference, dtype=dtype, models=models)
    inputs = {"schema": AGREEMENT_SCHEMA, "reference": reference.key, "draft": draft, "dtype": dtype,
              "implementation": implementation_versions()}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    folder = Path(cache_dir) / "agreement"
    path = folder / f"{key}.json"
    with file_lock(folder / f"{key}.lock"):
        cached = _CachedAgreement.read_cached(path)  # a damaged or foreign entry is computed again
        shape = [(r.id, r.cls, len(r.tokens), len(r.tokens)) for r in reference.prompts]  # a hit per token
        if cached is not None and cached.key == key \
                and [(p.id, p.cls, p.n_tokens, len(p.draft_hits)) for p in cached.prompts] == shape:
            return list(cached.prompts)
        agreement = teacher_forced_agreement(target_dir, draft_dir, reference, dtype=dtype, models=models)
        _CachedAgreement(key=key, prompts=tuple(agreement)).write(path)
        return agreement


# ---- steps for every k --------------------------------------------------------------------------


def accepted_per_step(prompt: PromptAgreement, k: int) -> list[int]:
    """Tokens each fused step adds for this prompt at speculation length k (contract semantics)."""
    if k < 2:
        raise ConfigError(f"k={k} must be at least 2")
    n = prompt.n_tokens
    steps: list[int] = []
    p = 1
    while p < n:
        c = 0
        while c < k - 1 and p + c + 1 <= n and prompt.agree(p + c + 1):
            c += 1
        a = min(c + 1, n - p)
        steps.append(a)
        p += a
    return steps


@dataclass(frozen=True)
class KStats:
    """Totals over a group of prompts at one k (see the module docstring for the definitions)."""

    k: int
    prompts: int
    steps: int
    tokens: int
    proposed: int
    accepted: int

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def record(self, speedup: float | None = None) -> KRow:
        return KRow(k=self.k, prompts=self.prompts, steps=self.steps, tokens=self.tokens,
                    proposed_draft_tokens=self.proposed, accepted_draft_tokens=self.accepted,
                    tokens_per_step=self.tokens_per_step, acceptance_rate=self.acceptance_rate,
                    speedup=speedup)


@dataclass(frozen=True)
class AcceptanceTable:
    """Predicted steps per prompt and totals per class (and `overall`) for every k of `ks`."""

    ks: tuple[int, ...]
    prompts: tuple[PromptAgreement, ...]
    per_prompt: dict[str, dict[int, list[int]]]  # prompt id -> k -> accepted per step
    per_class: dict[str, dict[int, KStats]]  # class (and "overall") -> k -> totals

    def steps(self, prompt_id: str, k: int) -> int:
        return len(self.per_prompt[prompt_id][k])

    def agreement(self, cls: str) -> float | None:
        """Fraction of agreeing positions (j >= 2) over the class's prompts, or overall."""
        group = [p for p in self.prompts if cls == OVERALL or p.cls == cls]
        total = sum(max(p.n_tokens - 1, 0) for p in group)
        return sum(sum(p.draft_hits[1:]) for p in group) / total if total else None

    def to_json(self) -> dict[str, Any]:
        return {
            "ks": list(self.ks),
            "classes": {cls: {"agreement": self.agreement(cls),
                              "by_k": [s.record().model_dump(mode="json") for s in by_k.values()]}
                        for cls, by_k in self.per_class.items()},
            "prompts": [{"id": p.id, "class": p.cls, "n_tokens": p.n_tokens, "agreement": p.agreement,
                         "target_flips": p.target_flips,
                         "steps": {str(k): len(v) for k, v in self.per_prompt[p.id].items()}}
                        for p in self.prompts],
        }


def predict(prompts: Sequence[PromptAgreement], ks: Iterable[int] = DEFAULT_K_RANGE) -> AcceptanceTable:
    """Steps per prompt for every k, and totals per class and overall."""
    ks = tuple(sorted(set(ks)))
    per_prompt = {p.id: {k: accepted_per_step(p, k) for k in ks} for p in prompts}
    classes = list(dict.fromkeys(p.cls for p in prompts)) + [OVERALL]
    per_class: dict[str, dict[int, KStats]] = {}
    for cls in classes:
        group = [p for p in prompts if cls == OVERALL or p.cls == cls]
        per_class[cls] = {}
        for k in ks:
            runs = [per_prompt[p.id][k] for p in group]
            steps = sum(len(r) for r in runs)
            per_class[cls][k] = KStats(k=k, prompts=len(group), steps=steps, tokens=sum(sum(r) for r in runs),
                                       proposed=steps * (k - 1),
                                       accepted=sum(sum(a - 1 for a in r) for r in runs))
    return AcceptanceTable(ks=ks, prompts=tuple(prompts), per_prompt=per_prompt, per_class=per_class)
