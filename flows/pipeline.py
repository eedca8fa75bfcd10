"""One build of a run, end to end, as plain functions: find it in the store, or claim it, compile it,
check its greedy output, and publish it. The flows wrap these in Prefect tasks; nothing here needs
Prefect, so the same code runs in-process, on a Dask worker, or in a compile-one flow run on a pod.

    find_published     the version of a build when an intact one is in the store (a listing, no bytes read)
    planned_work       per build: reuse the version, finish the build in the work dir, reuse the programs of
                       its graph key (work dir or store), or compile (what `fusedspec plan` and the run show)
    process_build      reuse, or claim -> download -> compile (or shard weights only, when the programs of
                       the build's graph key exist) -> validate -> publish; never raises: any failure (a
                       failed gate, bad input, an unexpected error) is a failed outcome naming the stage and
                       the reason, and nothing is published for it
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from fusedspec.compile import program_cache
from fusedspec.compile.backend import read_build_description
from fusedspec.compile.build import BuiltArtifact, build_artifact, graph_lock, is_complete, planned_work
from fusedspec.compile.documents.build import BuildDescription
from fusedspec.compile.documents.manifest import Manifest
from fusedspec.compile.documents.validation import (
    AdviceRecord,
    ValidationDocument,
    ValidationSummary,
)
from fusedspec.compile.spec import BuildSpec
from fusedspec.compile.validated import HeldValidation
from fusedspec.compile.workdir import mark_published, trim_published, validating
from fusedspec.core.errors import (
    ArtifactError,
    FusedspecError,
    GreedyMismatchError,
    StoreError,
    TransientError,
)
from fusedspec.core.files import file_lock
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import PlannedBuild, RunPlan
from fusedspec.flows.stages import StageClock, StageTime, megabytes, tree_size
from fusedspec.registry.claims import Claim, claim_or_wait, new_owner, renewing
from fusedspec.registry.download import download_model
from fusedspec.registry.graphs import fetch_programs, programs_in_store
from fusedspec.registry.publish import publish_artifact, read_published_validation, version_state
from fusedspec.registry.store import Store
from fusedspec.registry.stores import open_store
from fusedspec.validate.advice import rescore
from fusedspec.validate.cost_model import CostModel

log = logging.getLogger("fusedspec.pipeline")
GIVEN = "given"  # the source of a cost model whose c was given (validation.cost_ratio), not measured
BuildStatus = Literal["published", "reused", "failed"]
Stage = Literal["plan", "claim", "download", "compile", "validate", "publish", "worker"]


class ConfigOutcome(BaseModel):
    """What happened to one build of the matrix; one row of the run's summary."""

    model_config = ConfigDict(extra="forbid")

    slug: str
    key: str
    spec: BuildSpec
    draft: str  # the draft's reference, pinned (a run of several drafts has builds of each)
    status: BuildStatus
    version_uri: str | None = None  # the version a pod mounts (its attempt directory) or verify checks
    failed_stage: Stage | None = None
    reason: str | None = None
    compiled: bool = False  # this build compiled programs (not: its graph key's programs were reused)
    graph_key: str | None = None
    programs_from: str | None = None  # where reused programs came from (a work dir entry or a store version)
    repaired: bool = False  # the store held a damaged version of this build; publishing replaced it
    bytes_sent: int = 0
    files_uploaded: int = 0
    files_copied: int = 0
    tokens_per_step: float | None = None  # measured by the artifact's runner over the prompt set
    predicted_tokens_per_step: float | None = None  # from the draft's teacher-forced agreement
    near_ties: int = 0
    seconds: float = 0.0  # the build's wall time: the sum of its stages
    stages: list[StageTime] = []  # claim, download, compile, validate, publish: each with seconds and sizes
    compile_seconds: float | None = None
    validation: ValidationSummary | None = None
    advice: AdviceRecord | None = None  # the k advice computed with this build's validation

    @classmethod
    def of(cls, plan: RunPlan, planned: PlannedBuild, status: BuildStatus, **fields: Any) -> ConfigOutcome:
        """The outcome of `planned`, a build of `plan`, named by its spec, keys and draft."""
        return cls(slug=planned.slug, key=planned.key, spec=planned.spec, draft=plan.config.drafts[0],
                   status=status, graph_key=planned.graph_key, **fields)

    @property
    def work(self) -> str:
        """What the build did, in the plan's words (PlannedWork.action); "-" when it failed."""
        if self.status == "failed":
            return "-"
        if self.status == "reused":
            return "reuse version"
        if self.compiled:
            return "compile"
        return "reuse programs" if self.programs_from is not None else "publish build"


# the compile stage's line, by what build_artifact did (BuiltArtifact.work)
WORK_NOTES = {"compile": "compiled", "programs": "programs reused, weights sharded",
              "built": "built here before"}


def find_published(store: Store, plan: RunPlan, planned: PlannedBuild) -> Manifest | None:
    """The manifest of the build's version when it is in the store and intact by the listing (every file
    present with the size and etag the manifest records). A full byte-for-byte check is `fusedspec verify`;
    a re-run must not re-read gigabytes. A damaged version is not published: the build runs and repairs it."""
    state = version_state(store, plan.config_path(planned), planned.key)
    return state.manifest if state.intact else None


def _reused(store: Store, plan: RunPlan, planned: PlannedBuild, manifest: Manifest) -> ConfigOutcome:
    return ConfigOutcome.of(plan, planned, "reused",
                            version_uri=store.describe(f"{plan.config_path(planned)}/{planned.key}"),
                            validation=manifest.validation)


def process_build(plan: RunPlan, planned: PlannedBuild, settings: Settings, *,
                  owner: str | None = None) -> ConfigOutcome:
    """Make sure the build is published, doing only what is missing. Never raises for the build's own
    failures: they end as a failed outcome with the stage and the reason, and nothing published for it.
    A TransientError (the Hub or S3 did not answer) is raised instead, so the flow can try the build again;
    what the try before it finished is found again (downloads, the compiled build, a passed gate)."""
    clock = StageClock(planned.label)
    outcome = ConfigOutcome.of(plan, planned, "failed")
    stage: Stage = "claim"
    try:
        with clock.stage("claim") as note:
            store = open_store(plan.publish_uri, settings)
            manifest = find_published(store, plan, planned)
            claim = None
            if manifest is None:
                claim = claim_or_wait(store, planned.key, owner or new_owner(),
                                      plan.config.fan_out.claim_lease_seconds,
                                      lambda: find_published(store, plan, planned) is not None)
                if claim is None:  # another worker published it while we waited
                    manifest = _require(find_published(store, plan, planned))
            note("published already: reused" if manifest is not None else "claimed")
        if manifest is not None:
            outcome = _reused(store, plan, planned, manifest)
            if plan.validated:
                _advise_reused(plan, planned, settings, store, manifest, outcome, clock)
        else:
            assert claim is not None
            with renewing(claim):
                _build(plan, planned, settings, store, claim, outcome, clock)
    except TransientError as exc:
        exc.failed_stage = outcome.failed_stage or stage  # type: ignore[attr-defined]  # for the last try's outcome
        raise
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
    outcome.stages = clock.times
    outcome.seconds = round(sum(t.seconds for t in clock.times), 2)
    return outcome


def _build(plan: RunPlan, planned: PlannedBuild, settings: Settings, store: Store, claim: Claim,
           outcome: ConfigOutcome, clock: StageClock) -> None:
    """Download, compile, validate and publish under the claim. The stage under way is kept in
    `outcome.failed_stage` (cleared at the end), so an error raised here names it."""
    outcome.failed_stage = "download"
    with clock.stage("download") as note:
        target_dir, draft_dir = download_model(plan.target, settings), download_model(plan.draft, settings)
        note(f"target {megabytes(tree_size(target_dir)[0])}, draft {megabytes(tree_size(draft_dir)[0])}")
    outcome.failed_stage = "compile"
    with clock.stage("compile") as note:
        fetch_store_programs(store, plan, planned, settings)
        built = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options,
                               keys=planned.all_keys)
        artifact = built.path
        size, files = tree_size(artifact)
        note(f"{WORK_NOTES[built.work]}: {megabytes(size)} in {files} files")
    outcome.compiled = built.work == "compile"  # only once it succeeded: a crashed compile made nothing
    outcome.compile_seconds = clock.times[-1].seconds if built.work != "built" else None
    if built.work == "programs":
        outcome.programs_from = built.description.programs_from
    with validating(settings, artifact):  # validation.json stays what this build's validation wrote
        _validate_and_publish(plan, settings, store, claim, outcome, clock, built, target_dir, draft_dir)


def _validate_and_publish(plan: RunPlan, settings: Settings, store: Store, claim: Claim,
                          outcome: ConfigOutcome, clock: StageClock, built: BuiltArtifact, target_dir: Path,
                          draft_dir: Path) -> None:
    """The gate (unless this build passed it under the same settings) and the publish of `built`."""
    artifact = built.path
    held = None
    if plan.validated:
        outcome.failed_stage = "validate"
        with clock.stage("validate") as note:
            held = validate_build(artifact, built.description, plan, settings, target_dir, draft_dir)
            note(_validated(held.document))
        _record_validation(outcome, held.document, plan)
    outcome.failed_stage = "publish"
    with clock.stage("publish") as note:
        if claim.lost:  # another worker took the build over: it publishes, this one must not race it
            raise ArtifactError(f"the build claim on {artifact.name[:12]} was lost (not renewed within "
                                f"{claim.lease_seconds:.0f} s, then taken over); this worker stops before "
                                "publishing")
        # build.json and validation.json as this build and its validation handed them over: not read again
        result = publish_artifact(artifact, plan.publish_uri, settings, store=store,
                                  unvalidated=not plan.validated, description=built.description,
                                  validation=held)
        outcome.status, outcome.failed_stage = "published", None
        outcome.version_uri, outcome.repaired = result.version_uri, result.repaired
        mark_published(artifact, result.version_uri)
        for evicted in trim_published(settings, settings.builds_budget):
            log.info("removed published build %s from the work dir (%d MB; the store keeps it)",
                     evicted.path.name[:12], evicted.bytes >> 20)
        outcome.bytes_sent, outcome.files_uploaded, outcome.files_copied = (
            result.bytes_sent, result.files_uploaded, result.files_copied)
        note(f"{megabytes(result.bytes_sent)} sent, {result.files_uploaded} file(s) uploaded, "
             f"{result.files_copied} copied in the store")


def _advise_reused(plan: RunPlan, planned: PlannedBuild, settings: Settings, store: Store, manifest: Manifest,
                   outcome: ConfigOutcome, clock: StageClock) -> None:
    """A published version's figures under this run's settings: its validation.json when that was made with
    this run's prompts and lengths (the k advice re-scored at this run's cost ratio), else the version is
    validated again here (its files from the work dir's build or the store; nothing is published)."""
    document = read_published_validation(store, manifest)
    why = "it has no validation.json" if document is None else validated_differently(document, plan)
    if document is not None and why is None:
        _record_validation(outcome, document, plan)
        return
    log.info("%s: validating the published version again: %s", planned.slug, why)
    outcome.failed_stage = "download"
    with clock.stage("download") as note:
        target_dir, draft_dir = download_model(plan.target, settings), download_model(plan.draft, settings)
        note(f"target {megabytes(tree_size(target_dir)[0])}, draft {megabytes(tree_size(draft_dir)[0])}")
    outcome.failed_stage = "validate"
    with (clock.stage("validate") as note, _published_files(planned, settings, manifest, outcome) as artifact,
          validating(settings, artifact)):
        document = validate_build(artifact, read_build_description(artifact), plan, settings, target_dir,
                                  draft_dir).document
        note(f"the published version, again: {_validated(document)}")
    outcome.failed_stage = None
    _record_validation(outcome, document, plan)


@contextmanager
def _published_files(planned: PlannedBuild, settings: Settings, manifest: Manifest,
                     outcome: ConfigOutcome) -> Iterator[Path]:
    """A private copy of the build's artifact to validate (validation writes validation.json into it): the
    work dir's own build when it is there, else the published files, copied from the store."""
    local = settings.builds_dir / planned.key
    if is_complete(local):
        yield local
        return
    from fusedspec.serve.source import sync_version

    assert outcome.version_uri is not None
    version_dir, _ = sync_version(open_store(outcome.version_uri, settings), settings)
    attempt = version_dir / manifest.attempt
    copy = Path(tempfile.mkdtemp(prefix=f"revalidate-{planned.key[:12]}-", dir=settings.tmp_dir))
    try:
        # validation.json is replaced, not edited
        shutil.copytree(attempt, copy / "artifact", copy_function=os.link)
        yield copy / "artifact"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def validated_differently(document: ValidationDocument, plan: RunPlan) -> str | None:
    """Why a validation.json cannot give this run's figures (None when it can): its prompts or lengths
    differ from this run's, or this run measures the cost ratio that it was given."""
    v = plan.config.validation
    if document.prompt_set_hash != plan.prompt_set.hash:
        return "it was validated on other prompts"
    if document.greedy.max_new_tokens != v.max_new_tokens:
        return (f"it was validated with max_new_tokens {document.greedy.max_new_tokens}, "
                f"this run says {v.max_new_tokens}")
    if plan.cost_ratio is None and (document.advice is None or document.advice.cost_model.source == GIVEN):
        return "its k advice used a given cost ratio, and this run measures it"
    return None


def advice_for_run(document: ValidationDocument, plan: RunPlan) -> AdviceRecord | None:
    """The document's k advice under this run's cost ratio: re-scored when the run gives another one (the
    acceptance it was computed from does not depend on the cost ratio)."""
    given = plan.cost_ratio
    advice = document.advice
    if advice is None or given is None or (advice.cost_model.source == GIVEN
                                           and advice.cost_model.cost_ratio == given
                                           and advice.cost_model.verify_slope == 0.0):
        return advice
    return rescore(advice, CostModel(given, 0.0, source=GIVEN))


def _validated(document: ValidationDocument) -> str:
    counts = document.greedy.counts
    compared = f"{counts.tokens_compared} of {counts.tokens_generated} tokens compared, " \
        if counts.tokens_compared is not None else ""
    return f"{counts.prompts} prompts, {compared}{counts.near_ties} near-tie(s)"


def fetch_store_programs(store: Store, plan: RunPlan, planned: PlannedBuild, settings: Settings) -> None:
    """Put the programs of the build's graph key into the work dir from the store, when a trusted version
    there holds them and neither the build nor the programs are in the work dir already. A download that fails
    is logged and the build compiles: reuse saves time, it never decides what is built."""
    if planned_work(settings, planned.all_keys) != "compile":
        return
    with file_lock(graph_lock(settings, planned.graph_key)):
        if program_cache.find(settings, planned.graph_key) is not None:
            return
        try:
            fetched = fetch_programs(store, planned.graph_key, plan.config.backend, settings)
        except (ArtifactError, StoreError) as exc:
            log.warning("%s: programs of graph key %s not fetched from the store (%s); compiling",
                        planned.slug, planned.graph_key[:12], exc)
            return
    if fetched is not None:
        log.info("%s: programs of graph key %s fetched from %s", planned.slug, planned.graph_key[:12],
                 fetched.source)


Action = Literal["reuse version", "publish build", "reuse programs", "compile"]


class PlannedWork(BaseModel):
    """What a run would do for one build, as the plan and the run's table show it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    graph_key: str
    action: Action
    detail: str


def plan_work(plan: RunPlan, settings: Settings, store: Store | None = None) -> list[PlannedWork]:
    """Per build, in plan order: its intact version is in the store (reuse version), its artifact is in the
    work dir (publish build: validate and publish), the programs of its graph key are in the work dir or
    trusted in the store (reuse programs: shard the weights only), or compile. Reads listings and small
    documents only."""
    store = store or open_store(plan.publish_uri, settings)
    found: list[PlannedWork] = []
    for planned in plan.builds:
        graph = planned.graph_key[:12]
        local = planned_work(settings, planned.all_keys)
        if find_published(store, plan, planned) is not None:
            action, detail = "reuse version", f"in {store.describe(plan.config_path(planned))}"
        elif local == "built":
            action, detail = "publish build", f"built in {settings.builds_dir / planned.key}"
        elif local == "programs":
            action, detail = "reuse programs", f"of graph key {graph} in this work dir: shard weights only"
        else:
            in_store = programs_in_store(store, planned.graph_key, settings)
            if in_store.version is not None:
                action, detail = "reuse programs", (f"of graph key {graph} from "
                                                    f"{store.describe(in_store.version)}: shard weights only")
            else:
                action = "compile"
                detail = f"graph key {graph}" + (f" ({in_store.refusal})" if in_store.refusal else "")
        found.append(PlannedWork(key=planned.key, graph_key=planned.graph_key, action=action, detail=detail))
    return found


def _require(manifest: Manifest | None) -> Manifest:
    if manifest is None:
        raise ArtifactError("the build was reported done by another worker but its version is not in the "
                            "store; run again")
    return manifest


def _record_validation(outcome: ConfigOutcome, document: ValidationDocument, plan: RunPlan) -> None:
    if document.acceptance is not None:
        outcome.tokens_per_step, outcome.predicted_tokens_per_step = document.acceptance.tokens_per_step()
    outcome.near_ties = document.greedy.counts.near_ties
    outcome.validation = document.summary_record()
    outcome.advice = advice_for_run(document, plan)


def validate_build(artifact: Path, description: BuildDescription, plan: RunPlan, settings: Settings,
                   target_dir: Path, draft_dir: Path) -> HeldValidation:
    """The greedy gate of the run's validation settings, unless this artifact (of build.json `description`)
    already passed it under the same settings (a run that crashed between validating and publishing does
    not validate again): its validation.json as written or read, for publishing to find unchanged. Its
    warnings (near-ties, steps differing from the prediction) are Python warnings; a flow's build runs
    inside `flows.logs.run_logs`, which logs them to the run once each with a count."""
    from fusedspec.validate.greedy import validate_artifact
    from fusedspec.validate.request import ValidationRequest

    held = passed_validation(artifact, description, plan, settings)
    if held is not None:
        return held
    request = ValidationRequest.for_run(
        plan.config.validation, artifact_dir=artifact, description=description, target_dir=target_dir,
        draft_dir=draft_dir, prompt_set=plan.prompt_set, target_config=plan.target.config,
        draft_config=plan.draft.config)
    checked = validate_artifact(request, settings)
    staggered = checked.document.staggered
    if staggered is not None and checked.document.spec.batch_size > 1:  # ran, or why not: never silent
        log.info("%s: %s", checked.document.spec.slug, staggered.summary)
    return HeldValidation(checked.document, checked.sha256)


def passed_validation(artifact: Path, description: BuildDescription, plan: RunPlan,
                      settings: Settings) -> HeldValidation | None:
    """validation.json of `artifact` when it vouches for the artifact as it is now (the rule publishing
    applies too: compile.validated) and was written under this run's validation settings; else None
    (validate again). The tolerance is judged by the artifact's own dtype (its build.json, `description`),
    not the report's."""
    from fusedspec.compile.validated import read_passed_validation
    from fusedspec.validate.greedy import artifact_content_hash, default_tolerance

    try:
        held = read_passed_validation(artifact, description,
                                      lambda: artifact_content_hash(artifact, settings))
    except ArtifactError:
        return None  # damaged, of other rules, of another build or of other files: validate again
    if held is None:
        return None
    document = held.document
    v, given = plan.config.validation, plan.cost_ratio
    tolerance = (default_tolerance(description.spec.dtype) if v.near_tie_tolerance is None
                 else v.near_tie_tolerance)
    cost_model = document.advice.cost_model if document.advice is not None else None
    same = (document.prompt_set_hash == plan.prompt_set.hash
            and document.greedy.max_new_tokens == v.max_new_tokens
            and document.greedy.tolerance == tolerance
            and (given is None or (cost_model is not None and cost_model.cost_ratio == given)))
    return held if same else None
