"""A matrix limited to the k advice's top N (draft, k) per prompt class, before any compile (the run config's
`matrix.top_per_class`).

    advice_key(...) -> str                 what one draft's advice before compiling depends on
    cached_advice(cache_dir, key)          that advice from the work dir's cache (`matrix-advice/<key>.json`),
    store_advice(cache_dir, key, record)   so a plan or a dry run can say what a run would leave out
    limit_matrix(builds, advice, top, stated) -> MatrixLimit      which builds to keep, and why the others go

Each draft's advice is validate.advice.advise_pair on the downloaded target and draft (what `fusedspec
advise` runs), at every k of the matrix and each dtype of it, with its cost model from where the advice takes
one before a build exists: a given cost ratio, else the stated bytes model of a backend that states one (per
build: it depends on TP, seq_len, batch and dtype), else transformers forwards on this host.

The rule: builds that differ only in k serve the same way (a setup: TP, seq_len, batch, dtype). Per setup,
every (draft, k) is ranked per class as validate.draft_choice ranks them, and a build is kept when its
(draft, k) is among the first N of some class, so a (draft, k) that several classes keep is built once. The
first N are kept whether or not they are predicted faster than the target alone: validation then measures
them, and the summary says "do not speculate" where it should. A (draft, k) that the prediction ranked lower
is never built, even if it would have measured best: the run's summary ranks only what was built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from fusedspec.compile.documents.base import Document
from fusedspec.compile.documents.validation import AdviceRecord, Part
from fusedspec.compile.spec import BuildSpec
from fusedspec.validate.advice import rescore
from fusedspec.validate.cost_model import CostModel
from fusedspec.validate.draft_choice import DraftRanking, Option, rank_drafts
from fusedspec.validate.prompts import RenderedPrompt, rendered_hash
from fusedspec.validate.reference import implementation_versions, model_content

ADVICE_SCHEMA = 2  # bump when what the cached advice holds or how it is computed changes
CACHE_FOLDER = "matrix-advice"


class Pick(Part):
    """One (draft, k) a class keeps in one setup: its place in the class's ranking and its prediction."""

    setup: str  # the builds' slug but for k: tp1-seq64-bs1-float32
    cls: str = Field(alias="class")
    place: int  # 1 for the best
    draft: str
    k: int
    speedup: float


class LeftOut(Part):
    """A build the limit leaves out, and why: where its (draft, k) stood in the class that ranked it best."""

    draft: str
    slug: str
    reason: str


class MatrixLimit(Part):
    """What `matrix.top_per_class` keeps of a run's builds,
    decided from each draft's advice before compiling."""

    top_per_class: int
    kept: dict[str, list[str]]  # draft -> the slugs of its builds that are kept (empty: none of its builds)
    left_out: list[LeftOut]
    picks: list[Pick]  # per setup and class, its first top_per_class (draft, k), best first
    advice: dict[str, AdviceRecord]  # draft -> its advice before compiling (of the first setup), for display
    cost_sources: dict[str, str]  # draft -> where its c and b came from

    def keeps(self, draft: str, slug: str) -> bool:
        return slug in self.kept.get(draft, [])

    def left_out_of(self, draft: str, slug: str) -> LeftOut | None:
        return next((o for o in self.left_out if (o.draft, o.slug) == (draft, slug)), None)


class CachedAdvice(Document):
    """One draft's advice before compiling, as the cache file `matrix-advice/<key>.json` holds it."""

    FIX = "it is computed again"

    key: str
    record: AdviceRecord


def advice_key(target: Mapping[str, Any], draft: Mapping[str, Any], rendered: Sequence[RenderedPrompt], *,
               max_new_tokens: int, dtype: str, ks: Sequence[int], cost_ratio: float | None,
               stated: bool) -> str:
    """sha256 over what a draft's advice before compiling depends on: both models' content (commits and file
    hashes, never paths), the rendered prompts, the length, dtype and ks, and where its cost model comes from
    (the given c; or stated: the bytes model, applied per setup; or else host forwards, measured once and kept
    with the advice, so a plan, a dry run and the run that follows all see the same prediction)."""
    inputs = {"schema": ADVICE_SCHEMA, "target": model_content(target), "draft": model_content(draft),
              "prompts": rendered_hash(rendered), "max_new_tokens": max_new_tokens, "dtype": dtype,
              "ks": sorted(ks), "cost_ratio": cost_ratio, "stated": stated,
              "implementation": implementation_versions()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def cached_advice(cache_dir: Path, key: str) -> AdviceRecord | None:
    found = CachedAdvice.read_cached(Path(cache_dir) / CACHE_FOLDER / f"{key}.json")
    return found.record if found is not None and found.key == key else None


def store_advice(cache_dir: Path, key: str, record: AdviceRecord) -> None:
    CachedAdvice(key=key, record=record).write(Path(cache_dir) / CACHE_FOLDER / f"{key}.json")


def setup_of(spec: BuildSpec) -> str:
    """What builds that differ only in k share: `tp1-seq64-bs1-float32`."""
    return f"tp{spec.tp_degree}-seq{spec.seq_len}-bs{spec.batch_size}-{spec.dtype}"


def first_per_class(ranking: DraftRanking, top: int) -> dict[str, list[Option]]:
    """What the limit keeps of one ranking: per class, its first `top` (draft, k), best first."""
    return {cls: ranking.first(cls, top) for cls in ranking.classes}


def limit_matrix(builds: Sequence[tuple[str, BuildSpec]], advice: Mapping[tuple[str, str], AdviceRecord],
                 top: int, stated: Callable[[str, BuildSpec], CostModel | None]) -> MatrixLimit:
    """The builds (draft, spec) kept by the first `top` (draft, k) of each class, per setup (module
    docstring). `advice[draft, dtype]` is each draft's advice at the matrix's ks; `stated(draft, spec)` the
    cost model stated for a setup (None: the advice's own, given or measured, holds for every setup)."""
    setups: dict[str, list[tuple[str, BuildSpec]]] = {}
    for draft, spec in builds:
        setups.setdefault(setup_of(spec), []).append((draft, spec))
    drafts = list(dict.fromkeys(draft for draft, _ in builds))
    kept: dict[str, list[str]] = {draft: [] for draft in drafts}
    left_out: list[LeftOut] = []
    picks: list[Pick] = []
    shown: dict[str, AdviceRecord] = {}
    for setup, members in setups.items():
        spec = members[0][1]
        records = {}
        for draft in drafts:
            record = advice[draft, spec.dtype]
            model = stated(draft, spec)
            records[draft] = rescore(record, model) if model is not None else record
            shown.setdefault(draft, records[draft])
        ranking = rank_drafts(records)
        by_class = first_per_class(ranking, top)
        chosen = {(option.draft, option.k) for options in by_class.values() for option in options}
        picks += [Pick(setup=setup, cls=cls, place=place, draft=option.draft, k=option.k,
                       speedup=option.speedup)
                  for cls, options in by_class.items() for place, option in enumerate(options, 1)]
        for draft, build in members:
            if (draft, build.k) in chosen:
                kept[draft].append(build.slug)
                continue
            places = [(place, cls, o.speedup, ranking.options[cls][top - 1].speedup)
                      for cls in ranking.classes for place, o in enumerate(ranking.options[cls], 1)
                      if (o.draft, o.k) == (draft, build.k)]
            left_out.append(LeftOut(draft=draft, slug=build.slug, reason=_why_left_out(places, top)))
    return MatrixLimit(top_per_class=top, kept=kept, left_out=left_out, picks=picks, advice=shown,
                       cost_sources={draft: record.cost_model.source for draft, record in shown.items()})


def _why_left_out(places: list[tuple[int, str, float, float]], top: int) -> str:
    """'not among the first 2 of any class: at best 3rd in prose (predicted 1.12x; the 2nd 1.30x)'."""
    if not places:
        return f"not among the first {top} of any class: the advice predicts nothing at its k"
    place, cls, speedup, last = min(places, key=lambda found: found[0])  # a tie: the class named first
    return (f"not among the first {top} of any class: at best {_ordinal(place)} in {cls} (predicted "
            f"{speedup:.2f}x; the {_ordinal(top)} {last:.2f}x)")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
