"""One build of a run, end to end, as plain functions: find it in the store, or claim it, compile it,
check its greedy output, and publish it. The flows wrap these in Prefect tasks; nothing here needs
Prefect, so the same code runs in-process, on a Dask worker, or in a compile-one flow run on a pod.

    find_published     the version of a build when an intact one is in the store (a listing, no bytes read)
    process_build      reuse, or claim -> download -> compile -> validate -> publish; never raises: any
                       failure (a failed gate, bad input, an unexpected error) is a failed outcome naming
                       the stage and the reason, and nothing is published for it
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from fusedspec.compile.build import build_artifact, is_complete
from fusedspec.compile.documents.manifest import Manifest
from fusedspec.compile.documents.validation import (
    VALIDATION_FILE,
    AdviceRecord,
    ValidationDocument,
    ValidationSummary,
)
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.workdir import mark_published, trim_published
from fusedspec.core.errors import ArtifactError, FusedspecError, GreedyMismatchError
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import PlannedBuild, RunPlan
from fusedspec.registry.claims import Claim, claim_or_wait, new_owner, renewing
from fusedspec.registry.download import download_model
from fusedspec.registry.publish import publish_artifact, read_published_validation, version_state
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store

log = logging.getLogger("fusedspec.pipeline")
Status = Literal["published", "reused", "failed"]
Stage = Literal["plan", "claim", "download", "compile", "validate", "publish", "worker"]


class ConfigOutcome(BaseModel):
    """What happened to one build of the matrix; one row of the run's summary."""

    model_config = ConfigDict(extra="forbid")

    slug: str
    key: str
    spec: BuildSpec
    status: Status
    version_uri: str | None = None  # the version a pod mounts (its attempt directory) or verify checks
    failed_stage: Stage | None = None
    reason: str | None = None
    compiled: bool = False
    repaired: bool = False  # the store held a damaged version of this build; publishing replaced it
    bytes_sent: int = 0
    files_uploaded: int = 0
    files_copied: int = 0
    tokens_per_step: float | None = None  # measured by the artifact's runner over the prompt set
    predicted_tokens_per_step: float | None = None  # from the draft's teacher-forced agreement
    near_ties: int = 0
    seconds: float = 0.0
    compile_seconds: float | None = None
    validation: ValidationSummary | None = None
    advice: AdviceRecord | None = None  # the k advice computed with this build's validation


def find_published(store: Store, plan: RunPlan, planned: PlannedBuild) -> Manifest | None:
    """The manifest of the build's version when it is in the store and intact by the listing (every file
    present with the size and etag the manifest records). A full byte-for-byte check is `fusedspec verify`;
    a re-run must not re-read gigabytes. A damaged version is not published: the build runs and repairs it."""
    state = version_state(store, plan.config_path(planned), planned.key)
    return state.manifest if state.intact else None


def _reused(store: Store, plan: RunPlan, planned: PlannedBuild, manifest: Manifest) -> ConfigOutcome:
    """A published version: its figures come from the validation.json published with it."""
    outcome = ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec, status="reused",
                            version_uri=store.describe(f"{plan.config_path(planned)}/{planned.key}"),
                            validation=manifest.validation)
    document = read_published_validation(store, manifest)
    if document is not None:
        _record_validation(outcome, document)
    return outcome


def process_build(plan: RunPlan, planned: PlannedBuild, settings: Settings, *, owner: str | None = None) -> ConfigOutcome:
    """Make sure the build is published, doing only what is missing. Never raises for the build's own
    failures: they end as a failed outcome with the stage and the reason, and nothing published for it."""
    started = time.perf_counter()
    outcome = ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec, status="failed")
    stage: Stage = "claim"
    try:
        store = open_store(plan.publish_uri, settings)
        manifest = find_published(store, plan, planned)
        if manifest is not None:
            outcome = _reused(store, plan, planned, manifest)
        else:
            claim = claim_or_wait(store, planned.key, owner or new_owner(), plan.config.fan_out.claim_lease_seconds,
                                  lambda: find_published(store, plan, planned) is not None)
            if claim is None:  # another worker published it while we waited
                outcome = _reused(store, plan, planned, _require(find_published(store, plan, planned)))
            else:
                with renewing(claim):
                    _build(plan, planned, settings, store, claim, outcome)
    except GreedyMismatchError as exc:
        outcome.failed_stage, outcome.reason = outcome.failed_stage or stage, str(exc)
        if isinstance(exc.report, ValidationDocument):
            outcome.validation = exc.report.summary_record()
    except FusedspecError as exc:
        outcome.failed_stage, outcome.reason = outcome.failed_stage or stage, str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure of one build is that build's outcome, not the run's
        outcome.failed_stage = outcome.failed_stage or stage
        log.error("build %s failed in %s:\n%s", planned.slug, outcome.failed_stage, traceback.format_exc())
        outcome.reason = f"unexpected {type(exc).__name__}: {exc}"
    outcome.seconds = round(time.perf_counter() - started, 2)
    return outcome


def _build(plan: RunPlan, planned: PlannedBuild, settings: Settings, store: Store, claim: Claim,
           outcome: ConfigOutcome) -> None:
    """Download, compile, validate and publish under the claim. The stage under way is kept in
    `outcome.failed_stage` (cleared at the end), so an error raised here names it."""
    outcome.failed_stage = "download"
    target_dir, draft_dir = download_model(plan.target, settings), download_model(plan.draft, settings)
    outcome.failed_stage = "compile"
    compiles = not is_complete(settings.builds_dir / planned.key)  # else built here before
    started = time.perf_counter()
    artifact = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options, key=planned.key)
    outcome.compiled = compiles  # only once it succeeded: a crashed compile made nothing
    outcome.compile_seconds = round(time.perf_counter() - started, 2) if compiles else None
    if plan.validated:
        outcome.failed_stage = "validate"
        _record_validation(outcome, validate_build(artifact, plan, settings, target_dir, draft_dir))
    outcome.failed_stage = "publish"
    if claim.lost:  # another worker took the build over: it publishes, this one must not race it
        raise ArtifactError(f"the build claim on {planned.key[:12]} was lost (not renewed within "
                            f"{claim.lease_seconds:.0f} s, then taken over); this worker stops before publishing")
    result = publish_artifact(artifact, plan.publish_uri, settings, store=store, unvalidated=not plan.validated)
    outcome.status, outcome.failed_stage = "published", None
    outcome.version_uri, outcome.repaired = result.version_uri, result.repaired
    mark_published(artifact, result.version_uri)
    for evicted in trim_published(settings, settings.builds_budget):
        log.info("removed published build %s from the work dir (%d MB; the store keeps it)", evicted.path.name[:12],
                 evicted.bytes >> 20)
    outcome.bytes_sent, outcome.files_uploaded, outcome.files_copied = (result.bytes_sent, result.files_uploaded,
                                                                         result.files_copied)


def _require(manifest: Manifest | None) -> Manifest:
    if manifest is None:
        raise ArtifactError("the build was reported done by another worker but its version is not in the store; "
                            "run again")
    return manifest


def _record_validation(outcome: ConfigOutcome, document: ValidationDocument) -> None:
    if document.acceptance is not None:
        outcome.tokens_per_step, outcome.predicted_tokens_per_step = document.acceptance.tokens_per_step()
    outcome.near_ties = document.greedy.counts.near_ties
    outcome.validation = document.summary_record()
    outcome.advice = document.advice


def validate_build(artifact: Path, plan: RunPlan, settings: Settings, target_dir: Path,
                   draft_dir: Path) -> ValidationDocument:
    """The greedy gate, unless this artifact already passed it under the same settings (a run that crashed
    between validating and publishing does not validate again). Its warnings (near-ties, steps differing
    from the prediction) are Python warnings; a flow's build runs inside `flows.logs.run_logs`, which
    logs them to the run once each with a count."""
    from fusedspec.validate.greedy import validate_artifact

    v = plan.config.validation
    document = passed_validation(artifact, plan, settings)
    if document is not None:
        return document
    checked = validate_artifact(artifact, settings, target_dir=target_dir, draft_dir=draft_dir,
                                prompt_set=plan.prompt_set, max_new_tokens=v.max_new_tokens,
                                tolerance=v.near_tie_tolerance, cost_ratio=v.cost_ratio)
    staggered = checked.document.staggered
    if staggered is not None and checked.document.spec.batch_size > 1:  # ran, or why not: never silent
        log.info("%s: %s", checked.document.spec.slug, staggered.summary)
    return checked.document


def passed_validation(artifact: Path, plan: RunPlan, settings: Settings) -> ValidationDocument | None:
    """validation.json of `artifact` when it passed under this run's validation settings, by this gate's rules
    (GATE_VERSION), on this artifact's build, tokenizer and files as they are now, and says so consistently;
    else None (validate again). The document is trusted for nothing it could have been crafted to say: the
    tolerance is judged by the artifact's own dtype (build.json), not the document's."""
    from fusedspec.compile.backend import read_build_description
    from fusedspec.compile.documents.validation import GATE_VERSION
    from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
    from fusedspec.validate.greedy import artifact_content_hash, default_tolerance

    path = artifact / VALIDATION_FILE
    if not path.is_file():
        return None
    try:
        document = ValidationDocument.read(path)
        description = read_build_description(artifact)
    except ArtifactError:
        return None  # an older or damaged report: validate again
    v = plan.config.validation
    tolerance = default_tolerance(description.spec.dtype) if v.near_tie_tolerance is None else v.near_tie_tolerance
    cost_model = document.advice.cost_model if document.advice is not None else None
    same = (document.passed
            and not document.contradictions()
            and document.gate_version == GATE_VERSION  # else written under other rules
            and document.staggered is not None
            and document.key == description.key and document.spec == description.spec
            and document.prompt_set_hash == plan.prompt_set.hash
            and document.greedy.max_new_tokens == v.max_new_tokens
            and document.greedy.tolerance == tolerance
            and (v.cost_ratio is None or (cost_model is not None and cost_model.cost_ratio == v.cost_ratio))
            and document.tokenizer_hash == artifact_tokenizer_hash(artifact)
            and document.content_hash == artifact_content_hash(artifact, settings))
    return document if same else None


def run_advice(outcomes: list[ConfigOutcome]) -> AdviceRecord | None:
    """The k advice of the run: from the first build validated or reused with one (the advice depends on the
    model pair and prompts, not on the config)."""
    return next((o.advice for o in outcomes if o.status != "failed" and o.advice is not None), None)
