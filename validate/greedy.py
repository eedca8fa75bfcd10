"""The greedy equivalence gate: at temperature 0 a fused artifact must produce exactly what the target alone
produces (the reference of `validate.reference`).

Every token of every prompt is compared. The artifact runs on the prompts; where its tokens first leave
the reference's (`validate.divergence`), the difference is one of:

    near-tie   the reference's top-2 logit margin there is within the tolerance and the artifact's token
               is one of the tied ones: its reference logit is at most the tolerance below the chosen one's
               (the runner-up, or another token of a multi-way tie, which coarse bfloat16 logits make
               common). Two implementations may legitimately round such a tie either way. Reported,
               counted and warned about (every one), never silent; it does not fail the gate.
    mismatch   any other difference, or a length difference over identical tokens: the gate fails with
               GreedyMismatchError carrying the report (prompt id and text, position, both tokens decoded,
               the margin).

After a near-tie the two sequences go different ways, so the comparison continues on the reference's
path: the artifact is run again from the prompt plus the reference's tokens through the tie (teacher
forcing), and its continuation is compared with the reference's remaining tokens by the same rule,
again and again past every further near-tie (`continue_past_ties`). A difference after a tie that is not
itself a near-tie is a mismatch. The report counts tokens compared out of tokens generated, per prompt
and in total; they are equal unless a continuation is longer than the artifact's max_context_length,
which is then reported (and warned about, CoverageWarning) as tokens not compared, with why.

Default tolerances are logit-rounding bounds per dtype (settable with `tolerance=`). Greedy logits have
magnitudes of about 8..32; a logit computed in another arithmetic order (sharded partial sums, fused
kernels) differs by a few units in the last place (ULP) at that magnitude, and the final rounding of
each logit alone can move a margin by one ULP:
    float32   ULP ~1e-6 at 8..16; 1e-4 is ~100 ULPs of headroom and still ten times below NxDI's own
              divergence tolerance (1e-3, `check_accuracy_logits_v2`)
    float16   ULP 0.0078 at 8..16; 0.03 is 4 ULPs
    bfloat16  ULP 0.0625 at 8..16, 0.125 at 16..32, 0.25 at 32..64, so margins come in those steps.
              1-ULP flips were seen between two correct implementations on the tiny test models, and
              more with tensor parallelism: each rank's partial sum is rounded to bf16 before the
              all-reduce (as in NxDI), so logits move by several ULPs. The real 1.5B + 0.5B pair flipped
              a margin of 0.25 (batch-4 AOTInductor build, tp 1) and one of 0.3125 (5 or more ULPs, its
              logits being below 16; tp 2, export programs). 0.5 is 8 ULPs at 8..16, 4 at 16..32 and 2
              at 32..64, within NxDI's own bf16 logit check (rtol 0.01-0.05 on top-k logits: up to 0.5
              at a logit of 10)
A gap up to these (inclusive: margins are whole ULPs) is a tie at the precision the artifact computes in;
above, a flip is a real bug.

`validate_artifact` is the whole gate for one artifact directory: reference (cached), runner, comparison,
for batch > 1 the continuous-batching check (`validate.staggered_gate`: requests arriving at staggered
steps must get the same tokens; it runs even when the comparison failed, so the report says all), and,
when the gate passes, the acceptance check (predicted fused steps at the artifact's k must equal the
runner's measured steps) and the k advice plot. The caller hands it everything in one
`validate.request.ValidationRequest` (its build description, the downloaded models and their parsed
configs, the loaded prompt set, the settings): nothing is resolved or re-read here. Everything that needs
transformers (the reference, the draft's agreement, the host's cost forwards when the advice needs them)
runs before the artifact is loaded, on one load of each model (`validate.hf_models`), whose models are
released before the runner loads. The artifact's files are hashed by the loader as it reads them
(compile.trust): the report's content hash is of the bytes that ran (`ran_content_hash`), and a file
changed since is refused, never hashed anew. `validation.json` (a
`compile.documents.validation.ValidationDocument`, and `advice.png`) is written into the artifact
atomically; `passed` is true only when both checks passed.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusedspec.compile.artifact_files import artifact_files, artifact_paths
from fusedspec.compile.backend import (
    BuildDescription,
    Generation,
    Runner,
    get_backend,
)
from fusedspec.compile.documents.validation import (
    ADVICE_FILE,
    GATE_VERSION,
    VALIDATION_FILE,
    AcceptanceSection,
    GreedyCounts,
    GreedySection,
    PromptResult,
    PromptRow,
    ReferenceRecord,
    StaggeredSection,
    StepsRow,
    ValidationDocument,
    content_hash,
)
from fusedspec.compile.modelconfig import ModelArch, read_model_config
from fusedspec.compile.runconfig import MAX_NEW_TOKENS, MIN_NEW_TOKENS
from fusedspec.compile.spec import canonical_dtype
from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, GreedyMismatchError, PromptError
from fusedspec.core.files import FileHasher, atomic_write, unchanged
from fusedspec.core.settings import Settings
from fusedspec.validate.divergence import Divergence, first_divergence
from fusedspec.validate.hf_models import HfModels
from fusedspec.validate.prompts import RenderedPrompt, load_tokenizer, render_prompts
from fusedspec.validate.reference import PromptReference, Reference, get_reference
from fusedspec.validate.request import ValidationRequest
from fusedspec.validate.staggered_gate import check_staggered

if TYPE_CHECKING:  # imported where used: the advice's modules load only when it is asked for
    from fusedspec.validate.acceptance import PromptAgreement
    from fusedspec.validate.advice import CostMeasurement

__all__ = ["VALIDATION_FILE", "ArtifactValidation", "CoverageWarning", "GreedyReport", "NearTieWarning",
           "PromptResult", "StepsMismatchWarning", "ValidationRequest", "check_greedy", "compare",
           "continue_past_ties", "default_tolerance", "prompt_limit", "validate_artifact"]
DEFAULT_TOLERANCES = {"float32": 1e-4, "float16": 0.03, "bfloat16": 0.5}


class NearTieWarning(UserWarning):
    """An artifact diverged from the reference at a near-tie: tolerated, but never silent."""


class CoverageWarning(UserWarning):
    """Some of a prompt's tokens could not be compared (a continuation past a near-tie does not fit the
    artifact): the gate still passes on what was compared, but says what was not."""


class StepsMismatchWarning(UserWarning):
    """Measured fused steps differ from the prediction (output still correct): worth a look, not a failure."""


def default_tolerance(dtype: str) -> float:
    return DEFAULT_TOLERANCES[canonical_dtype(dtype)]


@dataclass
class Coverage:
    """How much of one prompt's reference the artifact's tokens were compared with."""

    generated: int  # new tokens of the reference
    compared: int  # of them, compared with the artifact's (a near-tie and a mismatch count as compared)
    not_compared: str | None = None  # why the rest was not compared, when it was not


@dataclass
class GreedyReport:
    tolerance: float
    dtype: str
    max_new_tokens: int
    reference_key: str
    # per prompt: its mismatch, else its first near-tie
    prompts: list[PromptResult] = field(default_factory=list)
    # every near-tie, several per prompt when continued
    ties: list[PromptResult] = field(default_factory=list)
    coverage: dict[str, Coverage] = field(default_factory=dict)  # per prompt id
    # artifact output per prompt (run from the prompt)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    accepted: dict[str, list[int]] = field(default_factory=dict)  # Generation.accepted per prompt

    @property
    def mismatches(self) -> list[PromptResult]:
        return [p for p in self.prompts if p.status == "mismatch"]

    @property
    def near_ties(self) -> list[PromptResult]:
        return list(self.ties)

    @property
    def passed(self) -> bool:
        return not self.mismatches

    @property
    def tokens_generated(self) -> int:
        return sum(c.generated for c in self.coverage.values())

    @property
    def tokens_compared(self) -> int:
        return sum(c.compared for c in self.coverage.values())

    def summary(self) -> str:
        tied_prompts = len({t.id for t in self.ties})
        head = (f"greedy equivalence {'passed' if self.passed else 'FAILED'}: {len(self.prompts)} prompts, "
                f"{sum(p.status == 'match' for p in self.prompts)} exact, {len(self.ties)} near-tie(s) in "
                f"{tied_prompts} prompt(s), {len(self.mismatches)} mismatch(es); tokens compared "
                f"{self.tokens_compared} of {self.tokens_generated} generated (tolerance {self.tolerance:g}, "
                f"{self.dtype})")
        details = [p.describe() for p in self.mismatches + self.ties]
        details += [f"{pid}: {c.generated - c.compared} of {c.generated} tokens not compared: "
                    f"{c.not_compared}"
                    for pid, c in self.coverage.items() if c.not_compared]
        return "\n".join([head] + [f"  - {d}" for d in details])

    def section(self, runner_seconds: float | None = None) -> GreedySection:
        return GreedySection(
            passed=self.passed, summary=self.summary().splitlines()[0], tolerance=self.tolerance,
            dtype=self.dtype, max_new_tokens=self.max_new_tokens, reference_key=self.reference_key,
            counts=GreedyCounts(prompts=len(self.prompts),
                                exact=sum(p.status == "match" for p in self.prompts),
                                near_ties=len(self.ties), mismatches=len(self.mismatches),
                                tokens_generated=self.tokens_generated, tokens_compared=self.tokens_compared),
            mismatches=self.mismatches, near_ties=self.ties,
            prompts=[PromptRow(id=p.id, cls=p.cls, status=p.status, n_tokens=p.n_got, steps=p.steps,
                               tokens_generated=self.coverage[p.id].generated,
                               tokens_compared=self.coverage[p.id].compared,
                               not_compared=self.coverage[p.id].not_compared)
                     for p in self.prompts],
            runner_seconds=runner_seconds)


# ---- comparison ---------------------------------------------------------------------------------


def compare(generation: Generation, reference: Reference, *, tolerance: float, tokenizer: Any = None,
            prompt_texts: dict[str, str] | None = None) -> GreedyReport:
    """Classify every prompt of `reference` against the artifact's `generation` (same order), up to its
    first difference. A prompt that diverged at a near-tie is compared only through that token here;
    `check_greedy` continues it on the reference's path."""
    if len(generation.tokens) != len(reference.prompts):
        raise ArtifactError(f"the runner returned {len(generation.tokens)} outputs for "
                            f"{len(reference.prompts)} prompts; the backend breaks the Runner contract")
    _check_token_ids(generation)
    report = GreedyReport(tolerance=tolerance, dtype=reference.dtype, max_new_tokens=reference.max_new_tokens,
                          reference_key=reference.key)
    describe = _Describer(tokenizer, prompt_texts or {})
    for ref, got, accepted in zip(reference.prompts, generation.tokens, generation.accepted, strict=True):
        report.tokens[ref.id], report.accepted[ref.id] = list(got), list(accepted)
        base = describe.base(ref, n_got=len(got), steps=len(accepted))
        divergence = first_divergence(ref, got, tolerance=tolerance)
        if divergence is None:
            report.prompts.append(PromptResult(status="match", **base))
            report.coverage[ref.id] = Coverage(generated=len(ref.tokens), compared=len(ref.tokens))
            continue
        result = describe.divergence(divergence, base)
        report.prompts.append(result)
        if divergence.tie:
            report.ties.append(result)
        report.coverage[ref.id] = Coverage(generated=len(ref.tokens),
                                           compared=min(divergence.position + 1, len(ref.tokens)))
    return report


def _check_token_ids(generation: Generation) -> None:
    """ArtifactError for an output token that is not an integer id: 8.0 would compare equal to 8."""
    for output in generation.tokens:
        bad = next((t for t in output if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
        if bad is not None:
            raise ArtifactError(f"the runner returned {bad!r} ({type(bad).__name__}), not an integer token "
                                "id; the backend breaks the Runner contract")


class _Describer:
    """PromptResult fields for a prompt and a divergence, tokens decoded when a tokenizer is given."""

    def __init__(self, tokenizer: Any, prompt_texts: dict[str, str]):
        self.tokenizer, self.prompt_texts = tokenizer, prompt_texts

    def decode(self, token: int | None) -> str | None:
        if token is None:
            return None
        if self.tokenizer is None:
            return f"<id {token}>"
        # a tokenizer cannot decode it (OverflowError): say what it is
        if not 0 <= token < len(self.tokenizer):
            return f"<id {token}: not in the vocabulary of {len(self.tokenizer)}>"
        return self.tokenizer.decode([token])

    def base(self, ref: PromptReference, *, n_got: int, steps: int) -> dict[str, Any]:
        return {"id": ref.id, "cls": ref.cls, "n_expected": len(ref.tokens), "n_got": n_got, "steps": steps,
                "prompt_text": self.prompt_texts.get(ref.id, "")}

    def divergence(self, d: Divergence, base: dict[str, Any],
                   continued_from: int | None = None) -> PromptResult:
        return PromptResult(status="near-tie" if d.tie else "mismatch", position=d.position,
                            expected=d.expected, got=d.got, expected_text=self.decode(d.expected),
                            got_text=self.decode(d.got),
                            margin=d.margin, runner_up=d.runner_up, gap=d.gap, continued_from=continued_from,
                            **base)


def continue_past_ties(runner: Runner, reference: Reference, report: GreedyReport, *,
                       context_limit: int | None = None, seq_len: int | None = None, tokenizer: Any = None,
                       prompt_texts: dict[str, str] | None = None) -> None:
    """Compare every prompt that diverged at a near-tie for the rest of its tokens, in `report`.

    The artifact is run again from the prompt plus the reference's tokens through the tie (teacher
    forcing), so it continues on the reference's path, and its continuation is compared with the
    reference's remaining tokens by the same rule; a further near-tie is continued the same way, any
    other difference is the prompt's mismatch. A continuation whose prompt is longer than `context_limit`
    (the artifact's max_context_length) cannot run: its tokens are recorded as not compared, with why.

    The continuations of one round share generate calls (`_calls`): each call asks for its longest
    continuation's new tokens and cuts the others' output to their own count. Greedy tokens do not
    depend on how many more are asked for, so this compares exactly what a call of their own would.
    """
    by_id = reference.by_id()
    describe = _Describer(tokenizer, prompt_texts or {})
    pending = {t.id: t.position + 1 for t in report.ties if t.position is not None}  # id -> next new token
    while pending:
        runs: list[_Continuation] = []
        for pid, start in pending.items():
            ref, coverage = by_id[pid], report.coverage[pid]
            if start >= len(ref.tokens):  # the tie was the reference's last token: nothing left to compare
                continue
            prompt = list(ref.prompt_ids) + list(ref.tokens[:start])
            if context_limit is not None and len(prompt) > context_limit:
                coverage.not_compared = (f"new tokens {start}..{len(ref.tokens) - 1} follow a near-tie, and "
                                         "the prompt plus the reference's tokens through it is "
                                         f"{len(prompt)} tokens, more than the "
                                         f"artifact's max_context_length {context_limit}")
                continue
            runs.append(_Continuation(pid, start, prompt, reference.max_new_tokens - start))
        pending = {}
        for new_tokens, call in _calls(runs, seq_len):
            generation = runner.generate([c.prompt for c in call], new_tokens,
                                         eos_token_ids=list(reference.eos_token_ids))
            if len(generation.tokens) != len(call):
                raise ArtifactError(f"the runner returned {len(generation.tokens)} outputs for {len(call)} "
                                    "prompts; the backend breaks the Runner contract")
            _check_token_ids(generation)
            for c, got, accepted in zip(call, generation.tokens, generation.accepted, strict=True):
                ref, coverage = by_id[c.id], report.coverage[c.id]
                # Cut to its own count only what the call asked for: tokens past the call's own ask break
                # the Runner contract, and are compared (a mismatch), never cut away.
                got = got[: c.new_tokens] if len(got) <= new_tokens else got
                divergence = first_divergence(ref, got, start=c.start, tolerance=report.tolerance)
                if divergence is None:
                    coverage.compared = len(ref.tokens)
                    continue
                coverage.compared = min(divergence.position + 1, len(ref.tokens))
                base = describe.base(ref, n_got=c.start + len(got), steps=len(accepted))  # new tokens in all
                result = describe.divergence(divergence, base, continued_from=c.start)
                if divergence.tie:
                    report.ties.append(result)
                    pending[c.id] = divergence.position + 1
                else:  # a real difference after a tolerated one: the prompt's verdict
                    index = next(i for i, p in enumerate(report.prompts) if p.id == c.id)
                    report.prompts[index] = result


@dataclass(frozen=True)
class _Continuation:
    id: str
    start: int  # the new token it starts at
    prompt: list[int]  # the prompt plus the reference's tokens before `start`
    new_tokens: int  # tokens to compare: max_new_tokens - start


def _calls(runs: Sequence[_Continuation], seq_len: int | None) -> list[tuple[int, list[_Continuation]]]:
    """Continuations grouped into generate calls, each with the new tokens it asks for: the longest
    continuation first, joined by every other whose prompt fits seq_len with that many new tokens (with
    seq_len unknown, only by those asking for as many)."""
    calls: list[tuple[int, list[_Continuation]]] = []
    for run in sorted(runs, key=lambda r: -r.new_tokens):
        call = next((c for n, c in calls
                     if (len(run.prompt) + n <= seq_len if seq_len is not None else n == run.new_tokens)),
                    None)
        if call is None:
            calls.append((run.new_tokens, [run]))
        else:
            call.append(run)
    return calls


def check_greedy(runner: Runner, reference: Reference, tolerance: float | None = None, *,
                 tokenizer: Any = None, prompt_texts: dict[str, str] | None = None,
                 context_limit: int | None = None) -> GreedyReport:
    """Run the loaded artifact on the reference's prompts and compare every token: past a near-tie the
    artifact is run again on the reference's path (`continue_past_ties`).

    Returns the report when no token differs except at near-ties (each near-tie also raises a
    NearTieWarning, each prompt not compared to the end a CoverageWarning); raises GreedyMismatchError
    carrying the report otherwise. context_limit: the longest prompt the artifact takes (None: its
    build description says).
    """
    tolerance = default_tolerance(reference.dtype) if tolerance is None else float(tolerance)
    if tolerance < 0:
        raise PromptError(f"tolerance {tolerance} must not be negative")
    if context_limit is None:
        context_limit = prompt_limit(runner.description)
    seq_len = runner.description.spec.seq_len
    generation = runner.generate([list(p.prompt_ids) for p in reference.prompts], reference.max_new_tokens,
                                 eos_token_ids=list(reference.eos_token_ids))
    report = compare(generation, reference, tolerance=tolerance, tokenizer=tokenizer,
                     prompt_texts=prompt_texts)
    continue_past_ties(runner, reference, report, context_limit=context_limit, seq_len=seq_len,
                       tokenizer=tokenizer, prompt_texts=prompt_texts)
    for tie in report.ties:
        warnings.warn(f"near-tie tolerated: {tie.describe()}", NearTieWarning, stacklevel=2)
    for pid, coverage in report.coverage.items():
        if coverage.not_compared:
            warnings.warn(f"{pid}: {coverage.generated - coverage.compared} of {coverage.generated} tokens "
                          f"not compared: {coverage.not_compared}", CoverageWarning, stacklevel=2)
    if not report.passed:
        raise GreedyMismatchError(report.summary(), report=report)
    return report


# ---- the gate for one artifact directory -------------------------------------------------------


@dataclass
class ArtifactValidation:
    """What `validate_artifact` found; `document` is what validation.json holds, `sha256` the sha256 of the
    bytes it was written as (what publishing must find there: compile.validated.HeldValidation)."""

    artifact_dir: Path
    greedy: GreedyReport
    document: ValidationDocument
    reference: Reference
    advice: Any = None  # validate.advice.PairAdvice when computed
    sha256: str = ""

    @property
    def passed(self) -> bool:
        return self.greedy.passed


def prompt_limit(description: BuildDescription) -> int:
    """The longest prompt the artifact takes (its max_context_length, else its seq_len)."""
    return int(description.options.get("max_context_length")  # type: ignore[arg-type]
               or description.spec.seq_len)


def check_prompt_lengths(rendered: Sequence[RenderedPrompt], description: BuildDescription,
                         max_new_tokens: int) -> None:
    """PromptError naming the first prompt that does not fit the artifact's compiled context."""
    spec = description.spec
    context = prompt_limit(description)
    for prompt in rendered:
        if len(prompt.ids) > context:
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens but the artifact takes "
                              f"prompts of at most {context} (max_context_length); shorten it or build with "
                              "a larger seq_len")
        if len(prompt.ids) + max_new_tokens > spec.seq_len:
            raise PromptError(f"prompt {prompt.id} has {len(prompt.ids)} tokens and --max-new-tokens is "
                              f"{max_new_tokens}: {len(prompt.ids) + max_new_tokens} > "
                              f"seq_len={spec.seq_len} of the artifact; ask for fewer new tokens or build "
                              "with a larger seq_len")


def validate_artifact(request: ValidationRequest, settings: Settings) -> ArtifactValidation:
    """The greedy gate for `request`'s artifact; writes validation.json (and advice.png); raises
    GreedyMismatchError (after writing validation.json with passed=false) when the gate fails. Bad inputs
    (no tokenizer in the artifact, a prompt too long for it, settings out of bounds, a build.json that is
    not the one the request hands over) raise InputErrors before anything is written."""
    artifact_dir = Path(request.artifact_dir)
    # before anything of the artifact is read: a file the loader does not hash as it reads (the tokenizer's)
    # must be this file still when the content hash reads it
    before = {rel: path.stat() for rel, path in artifact_paths(artifact_dir)}
    description = request.description
    spec = description.spec
    max_new_tokens = request.max_new_tokens
    if not MIN_NEW_TOKENS <= max_new_tokens <= MAX_NEW_TOKENS:
        raise PromptError(f"max_new_tokens={max_new_tokens} must be in {MIN_NEW_TOKENS}..{MAX_NEW_TOKENS} "
                          "(the first new token comes from context encoding, so a fused step needs a second)")
    given = request.near_tie_tolerance
    tolerance = default_tolerance(spec.dtype) if given is None else float(given)
    if tolerance < 0:
        raise PromptError(f"tolerance {tolerance} must not be negative")
    tokenizer = load_tokenizer(artifact_dir)
    rendered = render_prompts(request.prompt_set, tokenizer, request.variants)
    check_prompt_lengths(rendered, description, max_new_tokens)
    target_config = request.target_config or read_model_config(request.target_dir)
    reference, transformers = _transformers_side(request, rendered, settings, target_config.arch)
    # The loader hashes every file it reads into `hasher` and keeps what it read (trust.loaded): the content
    # hash takes those digests, reads only the files it did not, and publishing finds them all hashed.
    hasher = FileHasher(settings.cache_dir)
    trust = replace(request.trust or LoadTrust.for_directory(artifact_dir, settings.builds_dir),
                    hasher=hasher, loaded={})
    runner = get_backend(description.backend).load(artifact_dir, trust)
    if runner.description != description:
        raise ArtifactError(f"{artifact_dir}: its build.json is not the one its build handed over (changed "
                            f"since); validate it again (`fusedspec validate {artifact_dir}`)")
    content = ran_content_hash(artifact_dir, trust, hasher, before)
    started = time.perf_counter()
    texts = {r.id: r.text for r in rendered}
    try:
        greedy = check_greedy(runner, reference, tolerance, tokenizer=tokenizer, prompt_texts=texts,
                              context_limit=prompt_limit(description))
    except GreedyMismatchError as exc:
        greedy = exc.report  # the staggered check still runs: a failed gate's report says all it found
    seconds = time.perf_counter() - started
    staggered = check_staggered(runner, reference, tolerance=tolerance, alone=greedy.tokens)
    prompt_hash = request.prompt_set.hash
    if not (greedy.passed and staggered.passed):
        document = _document(artifact_dir, description, prompt_hash, greedy, reference, staggered=staggered,
                             runner_seconds=seconds, content=content)
        _write(document, artifact_dir)
        # left from an earlier run: not this validation's
        (artifact_dir / ADVICE_FILE).unlink(missing_ok=True)
        failed = [] if greedy.passed else [greedy.summary()]
        if not staggered.passed:
            failed.append("\n".join([staggered.summary] + [f"  - {d}" for d in staggered.details]))
        raise GreedyMismatchError("\n".join(failed), report=document)
    pair = steps = None
    if request.advice:
        pair, steps = _acceptance(request, rendered, reference, greedy, settings, runner, transformers)
    document = _document(artifact_dir, description, prompt_hash, greedy, reference, staggered=staggered,
                         steps=steps, pair=pair, runner_seconds=seconds, content=content)
    return ArtifactValidation(artifact_dir=artifact_dir, greedy=greedy, document=document,
                              reference=reference, advice=pair, sha256=_write(document, artifact_dir))


def _write(document: ValidationDocument, artifact_dir: Path) -> str:
    """Write validation.json; the sha256 of the bytes written."""
    data = document.to_bytes()
    atomic_write(artifact_dir / VALIDATION_FILE, data)
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Transformers:
    """What the advice needs of transformers, computed before the artifact loads (None: not needed)."""

    models: HfModels  # closed: anything asking it for a model now is a bug, refused
    agreement: list[PromptAgreement] | None = None
    host_costs: CostMeasurement | None = None


def _transformers_side(request: ValidationRequest, rendered: Sequence[RenderedPrompt], settings: Settings,
                       target_arch: ModelArch) -> tuple[Reference, _Transformers]:
    """The reference and, for the advice, the draft's teacher-forced agreement and (when the cost model will
    come from them) the host's transformers forwards: one load of the target for all, and the models
    released before the caller loads the artifact (for a 32B target the transformers copy is ~64 GB)."""
    from fusedspec.validate.acceptance import get_agreement
    from fusedspec.validate.advice import measure_costs
    from fusedspec.validate.step_costs import HOST_FORWARDS_PLANNED, planned_cost_model

    description = request.description
    dtype = description.spec.dtype
    identity = {"commit": description.target.commit, "files": description.target.files}
    models = HfModels()
    result = _Transformers(models)
    try:
        reference = get_reference(request.target_dir, identity, rendered,
                                  max_new_tokens=request.max_new_tokens, dtype=dtype,
                                  eos_token_ids=list(target_arch.eos_token_id), cache_dir=settings.cache_dir,
                                  models=models)
        if request.advice:
            draft_identity = {"commit": description.draft.commit, "files": description.draft.files}
            result.agreement = get_agreement(request.target_dir, request.draft_dir, draft_identity, reference,
                                             dtype=dtype, cache_dir=settings.cache_dir, models=models)
            # advise_pair's order of cost sources, as a dry run states it from build.json
            draft_arch = (request.draft_config or read_model_config(request.draft_dir)).arch
            planned = planned_cost_model(description.backend, description.spec, target_arch, draft_arch,
                                         description.options, request.cost_ratio)
            if request.step_times is None and planned["source"] == HOST_FORWARDS_PLANNED:
                result.host_costs = measure_costs(request.target_dir, request.draft_dir, dtype=dtype,
                                                  models=models)
    finally:
        models.close()
    return reference, result


def _acceptance(request: ValidationRequest, rendered: Sequence[RenderedPrompt], reference: Reference,
                greedy: GreedyReport, settings: Settings, runner: Runner,
                transformers: _Transformers) -> tuple[Any, AcceptanceSection]:
    """Predicted steps at the artifact's k against the runner's measured steps, and the advice plot."""
    from fusedspec.validate.acceptance import DEFAULT_K_RANGE
    from fusedspec.validate.advice import advise_pair, plot_advice

    description, artifact_dir = request.description, Path(request.artifact_dir)
    spec = description.spec
    identity = {"commit": description.target.commit, "files": description.target.files}
    ks = sorted(set(DEFAULT_K_RANGE) | {spec.k})
    configs = (request.target_config, request.draft_config)
    archs = (configs[0].arch, configs[1].arch) if configs[0] is not None and configs[1] is not None else None
    pair = advise_pair(request.target_dir, request.draft_dir, identity, rendered,
                       max_new_tokens=reference.max_new_tokens, dtype=spec.dtype,
                       cache_dir=settings.cache_dir, ks=ks, cost_ratio=request.cost_ratio,
                       eos_token_ids=reference.eos_token_ids,
                       runner=runner,  # else times its own programs
                       step_times=request.step_times, reference=reference, models=transformers.models,
                       archs=archs, agreement=transformers.agreement, host_costs=transformers.host_costs)
    exact = {p.id for p in greedy.prompts if p.status == "match"}  # after a near-tie the paths differ
    rows = [StepsRow(id=pid, predicted=pair.table.steps(pid, spec.k), measured=len(greedy.accepted[pid]),
                     predicted_accepted=pair.table.per_prompt[pid][spec.k],
                    measured_accepted=greedy.accepted[pid])
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
              reference: Reference, *, staggered: StaggeredSection | None = None,
              steps: AcceptanceSection | None = None, pair: Any = None,
              runner_seconds: float | None = None, content: str | None = None) -> ValidationDocument:
    """validation.json's content. Its summary is the greedy comparison's, or the staggered check's when
    only that failed; details list both checks' findings."""
    summary = greedy.summary().splitlines()
    details = summary[1:]
    passed = greedy.passed and (staggered is None or staggered.passed)
    if staggered is not None:
        details += [staggered.summary] + [f"  - {d}" for d in staggered.details]
    head = (staggered.summary if greedy.passed and staggered is not None and not staggered.passed
            else summary[0])
    return ValidationDocument(
        passed=passed, summary=head, details=details, key=description.key, spec=description.spec,
        prompt_set_hash=prompt_hash, tokenizer_hash=artifact_tokenizer_hash(artifact_dir),
        reference=ReferenceRecord(key=reference.key, implementation=reference.implementation,
                                  dtype=reference.dtype, from_cache=reference.from_cache),
        greedy=greedy.section(None if runner_seconds is None else round(runner_seconds, 3)),
        staggered=staggered,
        acceptance=steps, advice=pair.advice.record() if pair is not None else None,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), gate_version=GATE_VERSION,
        content_hash=content)


def artifact_content_hash(artifact_dir: Path, settings: Settings) -> str:
    """`content_hash` of the artifact's files as publishing lists them, through the work dir's file hashes
    (a file hashed before and unchanged since is not read again)."""
    files = artifact_files(artifact_dir, FileHasher(settings.cache_dir))
    return content_hash((f.rel, f.sha256) for f in files)


def ran_content_hash(artifact_dir: Path, trust: LoadTrust, hasher: FileHasher,
                     before: Mapping[str, os.stat_result]) -> str:
    """`content_hash` of the artifact as a validation ran it: each file its loader read, by the digest of
    the bytes read (compile.trust: a file changed since is refused, naming it); each other file through
    `hasher`, and only while it is the file it was in `before` (stats taken before anything of the artifact
    was read), so what is hashed is what ran. A file that appeared or went since is refused too."""
    artifact_dir = Path(artifact_dir)
    paths = artifact_paths(artifact_dir)
    gone = sorted(set(trust.loaded) - {rel for rel, _ in paths})
    if gone:
        trust.loaded_sha256(artifact_dir, gone[0])  # the error naming it
    files = []
    for rel, path in paths:
        if rel in (VALIDATION_FILE, ADVICE_FILE):
            continue  # what validation writes: never part of what it is of
        digest = trust.loaded_sha256(artifact_dir, rel)
        if digest is None:
            then = before.get(rel)
            if then is None or not unchanged(then, path.stat()):
                raise ArtifactError(f"{path}: {'appeared' if then is None else 'changed'} while it was being "
                                    f"validated; validate it again (`fusedspec validate {artifact_dir}`)")
            digest = hasher.sha256(path)
        files.append((rel, digest))
    return content_hash(files)
