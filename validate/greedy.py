"""The greedy equivalence gate: at temperature 0 a fused artifact must produce exactly what the target alone
produces (the reference of `validate.reference`).

Per prompt, the artifact's tokens are compared with the reference's up to the first difference:

    match      identical tokens and identical length (EOS at the same place, or both at max_new_tokens)
    near-tie   at the first differing position the reference's top-2 logit margin is below the tolerance
               and the artifact's token is one of the tied ones: its reference logit is within the
               tolerance of the chosen token's (the runner-up, or another token of a multi-way tie, which
               coarse bfloat16 logits make common). Two implementations may legitimately round such a
               tie either way. Reported, counted and warned about, never silent; it does not fail the
               gate. (After it the sequences continue differently and are not compared.)
    mismatch   any other difference, or a length difference over identical tokens: the gate fails with
               GreedyMismatchError carrying the report (prompt id and text, position, both tokens decoded,
               the margin).

Default tolerances are logit-rounding bounds per dtype (settable with `tolerance=`). Greedy logits have
magnitudes of about 8..32; a logit computed in another arithmetic order (sharded partial sums, fused
kernels) differs by a few units in the last place (ULP) at that magnitude, and the final rounding of
each logit alone can move a margin by one ULP:
    float32   ULP ~1e-6 at 8..16; 1e-4 is ~100 ULPs of headroom and still ten times below NxDI's own
              divergence tolerance (1e-3, `check_accuracy_logits_v2`)
    float16   ULP 0.0078 at 8..16; 0.03 is 4 ULPs
    bfloat16  ULP 0.0625 at 8..16 (0.125 at 16..32), so margins come in steps of 0.0625 and 1-ULP flips
              were seen between two correct implementations on the tiny test models; 0.25 is 4 ULPs
              at 8..16 (2 at 16..32), in line with NxDI's bf16 logit check (rtol 0.01-0.05 on top-k logits)
A gap below these is a tie at the precision the artifact computes in; above, a flip is a real bug.

`validate_artifact` is the whole gate for one artifact directory: reference (cached), runner, comparison,
and, when the gate passes, the acceptance check (predicted fused steps at the artifact's k must equal the
runner's measured steps) and the k advice plot. The caller hands it what it needs (the downloaded target
and draft, the loaded prompt set): nothing is resolved again here. `validation.json` (a
`compile.documents.validation.ValidationDocument`, and `advice.png`) is written into the artifact
atomically; `passed` is true only when the gate passed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compile.backend import BuildDescription, Generation, Runner, get_backend, read_build_description
from compile.documents.validation import (
    VALIDATION_FILE,
    AcceptanceSection,
    GreedyCounts,
    GreedySection,
    PromptResult,
    PromptRow,
    ReferenceRecord,
    StepsRow,
    ValidationDocument,
)
from compile.errors import ArtifactError, GreedyMismatchError, PromptError
from compile.modelconfig import read_arch
from compile.settings import Settings
from compile.spec import canonical_dtype
from compile.tokenizer_content import artifact_tokenizer_hash
from validate.prompts import VARIANTS, PromptSet, RenderedPrompt, load_tokenizer, render_prompts
from validate.reference import Reference, get_reference

__all__ = ["VALIDATION_FILE", "ArtifactValidation", "GreedyReport", "NearTieWarning", "PromptResult",
           "StepsMismatchWarning", "check_greedy", "compare", "default_tolerance", "validate_artifact"]
DEFAULT_TOLERANCES = {"float32": 1e-4, "float16": 0.03, "bfloat16": 0.25}
ADVICE_FILE = "advice.png"
DEFAULT_MAX_NEW_TOKENS = 32


class NearTieWarning(UserWarning):
    """An artifact diverged from the reference at a near-tie: tolerated, but never silent."""


class StepsMismatchWarning(UserWarning):
    """Measured fused steps differ from the prediction (output still correct): worth a look, not a failure."""


def default_tolerance(dtype: str) -> float:
    return DEFAULT_TOLERANCES[canonical_dtype(dtype)]


@dataclass
class GreedyReport:
    tolerance: float
    dtype: str
    max_new_tokens: int
    reference_key: str
    prompts: list[PromptResult] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)  # artifact output per prompt
    accepted: dict[str, list[int]] = field(default_factory=dict)  # Generation.accepted per prompt

    @property
    def mismatches(self) -> list[PromptResult]:
        return [p for p in self.prompts if p.status == "mismatch"]

    @property
    def near_ties(self) -> list[PromptResult]:
        return [p for p in self.prompts if p.status == "near-tie"]

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        head = (f"greedy equivalence {'passed' if self.passed else 'FAILED'}: {len(self.prompts)} prompts, "
                f"{sum(p.status == 'match' for p in self.prompts)} exact, {len(self.near_ties)} near-tie(s), "
                f"{len(self.mismatches)} mismatch(es) (tolerance {self.tolerance:g}, {self.dtype})")
        details = [p.describe() for p in self.mismatches + self.near_ties]
        return "\n".join([head] + [f"  - {d}" for d in details])

    def section(self, runner_seconds: float | None = None) -> GreedySection:
        return GreedySection(
            passed=self.passed, summary=self.summary().splitlines()[0], tolerance=self.tolerance, dtype=self.dtype,
            max_new_tokens=self.max_new_tokens, reference_key=self.reference_key,
            counts=GreedyCounts(prompts=len(self.prompts), exact=sum(p.status == "match" for p in self.prompts),
                                near_ties=len(self.near_ties), mismatches=len(self.mismatches)),
            mismatches=self.mismatches, near_ties=self.near_ties,
            prompts=[PromptRow(id=p.id, cls=p.cls, status=p.status, n_tokens=p.n_got, steps=p.steps)
                     for p in self.prompts],
            runner_seconds=runner_seconds)


# ---- comparison ---------------------------------------------------------------------------------


def compare(generation: Generation, reference: Reference, *, tolerance: float, tokenizer: Any = None,
            prompt_texts: dict[str, str] | None = None) -> GreedyReport:
    """Classify every prompt of `reference` against the artifact's `generation` (same order)."""
    if len(generation.tokens) != len(reference.prompts):
        raise ArtifactError(f"the runner returned {len(generation.tokens)} outputs for "
                            f"{len(reference.prompts)} prompts; the backend breaks the Runner contract")
    report = GreedyReport(tolerance=tolerance, dtype=reference.dtype, max_new_tokens=reference.max_new_tokens,
                          reference_key=reference.key)
    texts = prompt_texts or {}

    def decode(token: int | None) -> str | None:
        if token is None:
            return None
        return tokenizer.decode([token]) if tokenizer is not None else f"<id {token}>"

    for ref, got, accepted in zip(reference.prompts, generation.tokens, generation.accepted, strict=True):
        report.tokens[ref.id], report.accepted[ref.id] = list(got), list(accepted)
        base: dict[str, Any] = {"id": ref.id, "cls": ref.cls, "n_expected": len(ref.tokens), "n_got": len(got),
                                "steps": len(accepted), "prompt_text": texts.get(ref.id, "")}
        position = next((i for i, (a, b) in enumerate(zip(ref.tokens, got, strict=False)) if a != b), None)
        if position is None and len(got) == len(ref.tokens):
            report.prompts.append(PromptResult(status="match", **base))
            continue
        if position is None:  # identical tokens, but one stopped early: an EOS or length bug, never a tie
            position = min(len(got), len(ref.tokens))
        expected = ref.tokens[position] if position < len(ref.tokens) else None
        token = got[position] if position < len(got) else None
        margin = ref.margins[position] if expected is not None else None
        runner_up = ref.runner_up[position] if expected is not None else None
        gap = ref.gap(position, token) if expected is not None and token is not None else None
        tie = gap is not None and gap < tolerance  # gap >= margin, so the top-2 margin is below it too
        report.prompts.append(PromptResult(
            status="near-tie" if tie else "mismatch", position=position, expected=expected, got=token,
            expected_text=decode(expected), got_text=decode(token), margin=margin, runner_up=runner_up,
            gap=gap, **base))
    return report


def check_greedy(source: Path | Runner, reference: Reference, tolerance: float | None = None, *,
                 tokenizer: Any = None, prompt_texts: dict[str, str] | None = None) -> GreedyReport:
    """Run the artifact (a directory, or a loaded runner) on the reference's prompts and compare.

    Returns the report when every prompt matches or diverges only at a near-tie (each near-tie also
    raises a NearTieWarning); raises GreedyMismatchError carrying the report otherwise.
    """
    if isinstance(source, str | Path):
        description = read_build_description(Path(source))
        runner = get_backend(description.backend).load(Path(source))
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(Path(source))
    else:
        runner = source
    tolerance = default_tolerance(reference.dtype) if tolerance is None else float(tolerance)
    if tolerance < 0:
        raise PromptError(f"tolerance {tolerance} must not be negative")
    generation = runner.generate([list(p.prompt_ids) for p in reference.prompts], reference.max_new_tokens,
                                 eos_token_ids=list(reference.eos_token_ids))
    report = compare(generation, reference, tolerance=tolerance, tokenizer=tokenizer, prompt_texts=prompt_texts)
    for tie in report.near_ties:
        warnings.warn(f"near-tie tolerated: {tie.describe()}", NearTieWarning, stacklevel=2)
    if not report.passed:
        raise GreedyMismatchError(report.summary(), report=report)
    return report


# ---- the gate for one artifact directory -------------------------------------------------------


@dataclass
class ArtifactValidation:
    """What `validate_artifact` found; `document` is what validation.json holds."""

    artifact_dir: Path
    greedy: GreedyReport
    document: ValidationDocument
    reference: Reference
    advice: Any = None  # validate.advice.PairAdvice when computed

    @property
    def passed(self) -> bool:
        return self.greedy.passed


def check_prompt_lengths(rendered: Sequence[RenderedPrompt], description: BuildDescription,
                         max_new_tokens: int) -> None:
    """PromptError naming the first prompt that does not fit the artifact's compiled context."""
    spec = description.spec
    context = description.options.get("max_context_length") or spec.seq_len
    for prompt in rendered:
        if len(prompt.ids) > int(context):  # type: ignore[arg-type]
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens but the artifact takes prompts of "
                              f"at most {context} (max_context_length); shorten it or build with a larger seq_len")
        if len(prompt.ids) + max_new_tokens > spec.seq_len:
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens and --max-new-tokens is "
                              f"{max_new_tokens}: {len(prompt.ids) + max_new_tokens} > seq_len={spec.seq_len} of "
                              "the artifact; ask for fewer new tokens or build with a larger seq_len")


def validate_artifact(artifact_dir: Path, settings: Settings, *, target_dir: Path, draft_dir: Path,
                      prompt_set: PromptSet, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                      tolerance: float | None = None, variants: Sequence[str] = VARIANTS, advice: bool = True,
                      cost_ratio: float | None = None) -> ArtifactValidation:
    """The greedy gate for one artifact; writes validation.json (and advice.png); raises
    GreedyMismatchError (after writing validation.json with passed=false) when the gate fails.

    `target_dir` and `draft_dir` hold the downloaded models the artifact was built from (the caller
    pins them to the artifact's recorded content). Bad inputs (no artifact, no tokenizer in it, a prompt
    too long for the artifact) raise InputErrors before anything is written.
    """
    artifact_dir = Path(artifact_dir)
    description = read_build_description(artifact_dir)
    spec = description.spec
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens={max_new_tokens} must be at least 1")
    tolerance = default_tolerance(spec.dtype) if tolerance is None else float(tolerance)
    if tolerance < 0:
        raise PromptError(f"tolerance {tolerance} must not be negative")
    tokenizer = load_tokenizer(artifact_dir)
    rendered = render_prompts(prompt_set, tokenizer, variants)
    check_prompt_lengths(rendered, description, max_new_tokens)
    identity = {"commit": description.target.commit, "files": description.target.files}
    reference = get_reference(target_dir, identity, rendered, max_new_tokens=max_new_tokens, dtype=spec.dtype,
                              eos_token_ids=list(read_arch(target_dir).eos_token_id), cache_dir=settings.cache_dir)
    runner = get_backend(description.backend).load(artifact_dir)
    started = time.perf_counter()
    texts = {r.id: r.text for r in rendered}
    try:
        greedy = check_greedy(runner, reference, tolerance, tokenizer=tokenizer, prompt_texts=texts)
    except GreedyMismatchError as exc:
        document = _document(artifact_dir, description, prompt_set.hash, exc.report, reference, None, None, None)
        document.write(artifact_dir / VALIDATION_FILE)
        (artifact_dir / ADVICE_FILE).unlink(missing_ok=True)  # left from an earlier run: not this validation's
        raise GreedyMismatchError(str(exc), report=document) from None
    seconds = time.perf_counter() - started
    pair = steps = None
    if advice:
        pair, steps = _acceptance(artifact_dir, description, target_dir, draft_dir, rendered, reference, greedy,
                                  settings, cost_ratio, runner)
    document = _document(artifact_dir, description, prompt_set.hash, greedy, reference, steps, pair, seconds)
    document.write(artifact_dir / VALIDATION_FILE)
    return ArtifactValidation(artifact_dir=artifact_dir, greedy=greedy, document=document, reference=reference,
                              advice=pair)


def _acceptance(artifact_dir: Path, description: BuildDescription, target_dir: Path, draft_dir: Path,
                rendered: Sequence[RenderedPrompt], reference: Reference, greedy: GreedyReport,
                settings: Settings, cost_ratio: float | None, runner: Runner) -> tuple[Any, AcceptanceSection]:
    """Predicted steps at the artifact's k against the runner's measured steps, and the advice plot."""
    from validate.acceptance import DEFAULT_K_RANGE
    from validate.advice import advise_pair, plot_advice

    spec = description.spec
    identity = {"commit": description.target.commit, "files": description.target.files}
    ks = sorted(set(DEFAULT_K_RANGE) | {spec.k})
    pair = advise_pair(target_dir, draft_dir, identity, rendered, max_new_tokens=reference.max_new_tokens,
                       dtype=spec.dtype, cache_dir=settings.cache_dir, ks=ks, cost_ratio=cost_ratio,
                       eos_token_ids=reference.eos_token_ids, runner=runner)  # times its own programs
    exact = {p.id for p in greedy.prompts if p.status == "match"}  # after a near-tie the paths differ
    rows = [StepsRow(id=pid, predicted=pair.table.steps(pid, spec.k), measured=len(greedy.accepted[pid]),
                     predicted_accepted=pair.table.per_prompt[pid][spec.k], measured_accepted=greedy.accepted[pid])
            for pid in greedy.accepted if pid in exact]
    differing = [r.id for r in rows if r.predicted_accepted != r.measured_accepted]
    if differing:
        # Output is still correct: the draft's argmax sits on a near-tie of its own somewhere.
        warnings.warn(f"{artifact_dir.name}: measured fused steps differ from the prediction for "
                      f"{', '.join(differing)}", StepsMismatchWarning, stacklevel=3)
    steps = AcceptanceSection(k=spec.k, steps_match=not differing, differing=differing, compared=len(rows),
                              prompts=rows)
    names = [record.repo_id or record.store_name for record in (description.target, description.draft)]
    plot_advice(pair.advice, artifact_dir / ADVICE_FILE, mark_k=spec.k,
                title=f"Predicted speedup vs k: target {names[0]}, draft {names[1]}")
    return pair, steps


def _document(artifact_dir: Path, description: BuildDescription, prompt_hash: str, greedy: GreedyReport,
              reference: Reference, steps: AcceptanceSection | None, pair: Any,
              runner_seconds: float | None) -> ValidationDocument:
    summary = greedy.summary().splitlines()
    return ValidationDocument(
        passed=greedy.passed, summary=summary[0], details=summary[1:], key=description.key, spec=description.spec,
        prompt_set_hash=prompt_hash, tokenizer_hash=artifact_tokenizer_hash(artifact_dir),
        reference=ReferenceRecord(key=reference.key, implementation=reference.implementation,
                                  dtype=reference.dtype, from_cache=reference.from_cache),
        greedy=greedy.section(None if runner_seconds is None else round(runner_seconds, 3)),
        acceptance=steps, advice=pair.advice.record() if pair is not None else None,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
