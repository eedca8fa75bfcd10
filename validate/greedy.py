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
runner's measured steps) and the k advice plot. `validation.json` (and `advice.png`) are written into
the artifact atomically; `passed` is true only when the gate passed.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compile.backend import Generation, Runner, get_backend, read_build_description
from compile.errors import ArtifactError, GreedyMismatchError, PromptError
from compile.modelconfig import read_arch
from compile.settings import Settings
from compile.spec import BuildSpec, canonical_dtype
from validate.prompts import VARIANTS, RenderedPrompt, load_prompt_set, load_tokenizer, render_prompts
from validate.reference import Reference, get_reference

DEFAULT_TOLERANCES = {"float32": 1e-4, "float16": 0.03, "bfloat16": 0.25}
VALIDATION_FILE = "validation.json"
ADVICE_FILE = "advice.png"
DEFAULT_MAX_NEW_TOKENS = 32


class NearTieWarning(UserWarning):
    """An artifact diverged from the reference at a near-tie: tolerated, but never silent."""


class StepsMismatchWarning(UserWarning):
    """Measured fused steps differ from the prediction (output still correct): worth a look, not a failure."""


def default_tolerance(dtype: str) -> float:
    return DEFAULT_TOLERANCES[canonical_dtype(dtype)]


@dataclass(frozen=True)
class PromptResult:
    """The comparison of one prompt. `position` is 0-based among the new tokens; None for a match."""

    id: str
    cls: str
    status: str  # "match" | "near-tie" | "mismatch"
    n_expected: int
    n_got: int
    steps: int  # fused steps the artifact took (Generation.accepted)
    position: int | None = None
    expected: int | None = None  # reference token id at `position` (None: the reference had ended)
    got: int | None = None  # artifact token id at `position` (None: the artifact had ended)
    expected_text: str | None = None
    got_text: str | None = None
    margin: float | None = None  # reference top-2 margin at `position`
    runner_up: int | None = None
    gap: float | None = None  # reference logit gap of the artifact's token (None: not among the close ones)
    prompt_text: str = ""

    def describe(self) -> str:
        if self.status == "match":
            return f"{self.id}: match ({self.n_got} tokens)"
        margin = "n/a" if self.margin is None else f"{self.margin:.3g}"
        gap = "not close" if self.gap is None else f"{self.gap:.3g}"

        def token(tid: int | None, text: str | None) -> str:
            return "(output ended)" if tid is None else f"{tid} {text!r}"

        return (f"{self.id} [{self.cls}] {self.status} at new token {self.position}: reference "
                f"{token(self.expected, self.expected_text)}, artifact {token(self.got, self.got_text)}, "
                f"reference top-2 margin {margin}, artifact token's gap {gap}; prompt {_clip(self.prompt_text)!r}")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


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

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "summary": self.summary().splitlines()[0], "tolerance": self.tolerance,
                "dtype": self.dtype, "max_new_tokens": self.max_new_tokens, "reference_key": self.reference_key,
                "counts": {"prompts": len(self.prompts), "exact": sum(p.status == "match" for p in self.prompts),
                           "near_ties": len(self.near_ties), "mismatches": len(self.mismatches)},
                "mismatches": [p.to_json() for p in self.mismatches],
                "near_ties": [p.to_json() for p in self.near_ties],
                "prompts": [{"id": p.id, "class": p.cls, "status": p.status, "n_tokens": p.n_got, "steps": p.steps}
                            for p in self.prompts]}


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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
        runner = get_backend(description["backend"]).load(Path(source))
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
    document: dict[str, Any]
    reference: Reference
    advice: Any = None  # validate.advice.PairAdvice when computed

    @property
    def passed(self) -> bool:
        return self.greedy.passed


def model_dir(description: dict[str, Any], role: str, settings: Settings) -> Path:
    """The directory of the artifact's target or draft, pinned to the content recorded in build.json:
    a Hub model by its recorded commit (downloaded once), a local directory whose files must still hash
    to what was built."""
    from compile.modelref import parse_model_ref
    from registry.hub import download_model, resolve_model

    recorded = description[role]
    if recorded.get("commit"):
        ref = parse_model_ref(f"hf://{recorded['repo_id']}@{recorded['commit']}")
        return download_model(resolve_model(ref, settings), settings)
    path = Path(recorded["ref"])
    if not path.is_dir():
        raise ArtifactError(f"the {role} this artifact was built from ({recorded['ref']}) is not a directory "
                            "here; run validate where that checkpoint is, or build from hf://ORG/NAME@COMMIT")
    resolved = resolve_model(str(path), settings)
    changed = sorted(n for n, h in recorded.get("files", {}).items() if resolved.file_hashes.get(n) != h)
    if changed:
        raise ArtifactError(f"the {role} at {path} changed since this artifact was built ({', '.join(changed[:3])} "
                            "differ from build.json); validating against it would prove nothing: rebuild")
    return resolved.local_dir


def check_prompt_lengths(rendered: Sequence[RenderedPrompt], description: dict[str, Any], spec: BuildSpec,
                         max_new_tokens: int) -> None:
    """PromptError naming the first prompt that does not fit the artifact's compiled context."""
    context = int((description.get("options") or {}).get("max_context_length") or spec.seq_len)
    for prompt in rendered:
        if len(prompt.ids) > context:
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens but the artifact takes prompts of "
                              f"at most {context} (max_context_length); shorten it or build with a larger seq_len")
        if len(prompt.ids) + max_new_tokens > spec.seq_len:
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens and --max-new-tokens is "
                              f"{max_new_tokens}: {len(prompt.ids) + max_new_tokens} > seq_len={spec.seq_len} of "
                              "the artifact; ask for fewer new tokens or build with a larger seq_len")


def validate_artifact(artifact_dir: Path, settings: Settings, *, prompts: str | Path | None = "default",
                      max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, tolerance: float | None = None,
                      variants: Sequence[str] = VARIANTS, advice: bool = True,
                      cost_ratio: float | None = None) -> ArtifactValidation:
    """The greedy gate for one artifact; writes validation.json (and advice.png); raises
    GreedyMismatchError (after writing validation.json with passed=false) when the gate fails.

    Bad inputs (no artifact, no tokenizer in it, a bad prompt file, a prompt too long for the
    artifact) raise InputErrors before anything is written.
    """
    artifact_dir = Path(artifact_dir)
    description = read_build_description(artifact_dir)
    spec = BuildSpec.from_json(description["spec"])
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens={max_new_tokens} must be at least 1")
    tolerance = default_tolerance(spec.dtype) if tolerance is None else float(tolerance)
    if tolerance < 0:
        raise PromptError(f"tolerance {tolerance} must not be negative")
    tokenizer = load_tokenizer(artifact_dir)
    prompt_set = load_prompt_set(prompts)
    rendered = render_prompts(prompt_set, tokenizer, variants)
    check_prompt_lengths(rendered, description, spec, max_new_tokens)
    target_dir = model_dir(description, "target", settings)
    identity = {"commit": description["target"].get("commit"), "files": description["target"].get("files", {})}
    reference = get_reference(target_dir, identity, rendered, max_new_tokens=max_new_tokens, dtype=spec.dtype,
                              eos_token_ids=list(read_arch(target_dir).eos_token_id), cache_dir=settings.cache_dir)
    runner = get_backend(description["backend"]).load(artifact_dir)
    started = time.perf_counter()
    texts = {r.id: r.text for r in rendered}
    try:
        greedy = check_greedy(runner, reference, tolerance, tokenizer=tokenizer, prompt_texts=texts)
    except GreedyMismatchError as exc:
        document = _document(description, prompt_set.hash, exc.report, reference, None, None)
        _write_json(artifact_dir / VALIDATION_FILE, document)
        (artifact_dir / ADVICE_FILE).unlink(missing_ok=True)  # left from an earlier run: not this validation's
        raise
    seconds = time.perf_counter() - started
    pair = steps = None
    if advice:
        pair, steps = _acceptance(artifact_dir, description, spec, target_dir, rendered, reference, greedy,
                                  settings, cost_ratio)
    document = _document(description, prompt_set.hash, greedy, reference, steps, pair)
    document["greedy"]["runner_seconds"] = round(seconds, 3)
    _write_json(artifact_dir / VALIDATION_FILE, document)
    return ArtifactValidation(artifact_dir=artifact_dir, greedy=greedy, document=document, reference=reference,
                              advice=pair)


def _acceptance(artifact_dir: Path, description: dict[str, Any], spec: BuildSpec, target_dir: Path,
                rendered: Sequence[RenderedPrompt], reference: Reference, greedy: GreedyReport,
                settings: Settings, cost_ratio: float | None) -> tuple[Any, dict[str, Any]]:
    """Predicted steps at the artifact's k against the runner's measured steps, and the advice plot."""
    from validate.acceptance import DEFAULT_K_RANGE
    from validate.advice import advise_pair, plot_advice

    draft_dir = model_dir(description, "draft", settings)
    identity = {"commit": description["target"].get("commit"), "files": description["target"].get("files", {})}
    ks = sorted(set(DEFAULT_K_RANGE) | {spec.k})
    pair = advise_pair(target_dir, draft_dir, identity, rendered, max_new_tokens=reference.max_new_tokens,
                       dtype=spec.dtype, cache_dir=settings.cache_dir, ks=ks, cost_ratio=cost_ratio,
                       eos_token_ids=reference.eos_token_ids)
    exact = {p.id for p in greedy.prompts if p.status == "match"}  # after a near-tie the paths differ
    rows = [{"id": pid, "predicted": pair.table.steps(pid, spec.k), "measured": len(greedy.accepted[pid]),
             "predicted_accepted": pair.table.per_prompt[pid][spec.k], "measured_accepted": greedy.accepted[pid]}
            for pid in greedy.accepted if pid in exact]
    differing = [str(r["id"]) for r in rows if r["predicted_accepted"] != r["measured_accepted"]]
    if differing:
        # Output is still correct: the draft's argmax sits on a near-tie of its own somewhere.
        warnings.warn(f"{artifact_dir.name}: measured fused steps differ from the prediction for "
                      f"{', '.join(differing)}", StepsMismatchWarning, stacklevel=3)
    steps = {"k": spec.k, "steps_match": not differing, "differing": differing, "compared": len(rows),
             "prompts": rows}
    names = [description[role].get("repo_id") or Path(description[role]["ref"]).name for role in ("target", "draft")]
    plot_advice(pair.advice, artifact_dir / ADVICE_FILE, mark_k=spec.k,
                title=f"Predicted speedup vs k: target {names[0]}, draft {names[1]}")
    return pair, steps


def _document(description: dict[str, Any], prompt_hash: str, greedy: GreedyReport, reference: Reference,
              steps: dict[str, Any] | None, pair: Any) -> dict[str, Any]:
    # Scalars first: the manifest copies the short top-level fields into its validation summary.
    return {
        "passed": greedy.passed,
        "summary": greedy.summary().splitlines()[0],
        "details": greedy.summary().splitlines()[1:],
        "prompts": len(greedy.prompts),
        "near_ties": len(greedy.near_ties),
        "mismatches": len(greedy.mismatches),
        "tolerance": greedy.tolerance,
        "dtype": greedy.dtype,
        "max_new_tokens": greedy.max_new_tokens,
        "steps_match": steps["steps_match"] if steps is not None else None,
        "recommended_k": pair.advice.recommended_k if pair is not None else None,
        "key": description["key"],
        "spec": description["spec"],
        "prompt_set_hash": prompt_hash,
        "reference": {"key": reference.key, "implementation": reference.implementation,
                      "dtype": reference.dtype, "from_cache": reference.from_cache},
        "greedy": greedy.to_json(),
        "acceptance": steps,
        "advice": pair.advice.to_json() if pair is not None else None,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True))
    tmp.replace(path)
