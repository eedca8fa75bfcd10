"""One build of a run, end to end, as plain functions: find it in the store, or claim it, compile it,
check its greedy output, and publish it. The flows wrap these in Prefect tasks; nothing here needs
Prefect, so the same code runs in-process, on a Dask worker, or in a compile-one flow run on a pod.

    find_published     the version for a key, when a complete one is in the store (cheap check)
    process_build      reuse, or claim -> download -> compile -> validate -> publish; never raises for
                       a failed gate: the outcome says what failed and nothing is published for it
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compile.build import build_artifact, is_complete
from compile.errors import FusedspecError, GreedyMismatchError
from compile.settings import Settings
from flows.planning import PlannedBuild, RunPlan
from registry.claims import claim_or_wait, new_owner, renewing
from registry.hub import download_model
from registry.manifest import MANIFEST, VALIDATION, decode, model_slug
from registry.publish import publish_artifact
from registry.store import NotFound, Store
from registry.stores import open_store
from registry.uri import join_key

STATUSES = ("published", "reused", "failed")
ADVICE_PLOT = "advice.png"


@dataclass
class ConfigOutcome:
    """What happened to one build of the matrix; one row of the run's summary."""

    slug: str
    key: str
    spec: dict[str, Any]
    status: str  # one of STATUSES
    version_uri: str | None = None
    failed_stage: str | None = None  # "compile" | "validate" | "publish" | "store"
    reason: str | None = None
    compiled: bool = False
    bytes_sent: int = 0
    files_uploaded: int = 0
    files_copied: int = 0
    tokens_per_step: float | None = None  # measured by the artifact's runner over the prompt set
    predicted_tokens_per_step: float | None = None  # from the draft's teacher-forced agreement
    near_ties: int = 0
    seconds: float = 0.0
    validation: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def config_path(plan: RunPlan, planned: PlannedBuild) -> str:
    """The store path of a build's config, as registry.publish lays it out."""
    return join_key(model_slug({"repo_id": plan.target.ref.repo_id, "ref": str(plan.target.local_dir)}),
                    model_slug({"repo_id": plan.draft.ref.repo_id, "ref": str(plan.draft.local_dir)}),
                    planned.slug)


def find_published(store: Store, plan: RunPlan, planned: PlannedBuild) -> dict[str, Any] | None:
    """The manifest of the build's version when it is complete in the store: the manifest exists (it is
    written only after every file was uploaded and checked) and every file it names is there with its
    size. A full byte-for-byte check is `fusedspec verify`; a re-run should not re-read gigabytes."""
    version = join_key(config_path(plan, planned), planned.key)
    try:
        manifest = decode(store.get(join_key(version, MANIFEST)), MANIFEST)
    except NotFound:
        return None
    present = {info.key[len(version) + 1:]: info.size for info in store.list(version)}
    files = manifest.get("files") or {}
    if all(present.get(name) == entry.get("size") for name, entry in files.items()):
        return manifest
    return None


def _acceptance(document: dict[str, Any]) -> tuple[float | None, float | None]:
    rows = (document.get("acceptance") or {}).get("prompts") or []
    measured = [a for row in rows for a in row.get("measured_accepted", [])]
    predicted = [a for row in rows for a in row.get("predicted_accepted", [])]

    def mean(values: list[int]) -> float | None:
        return round(sum(values) / len(values), 3) if values else None

    return mean(measured), mean(predicted)


def _reused(store: Store, plan: RunPlan, planned: PlannedBuild, manifest: dict[str, Any]) -> ConfigOutcome:
    """A published version: its acceptance figures come from the validation.json published with it."""
    version = join_key(config_path(plan, planned), planned.key)
    measured = predicted = None
    if VALIDATION in (manifest.get("files") or {}):
        measured, predicted = _acceptance(decode(store.get(join_key(version, VALIDATION)), VALIDATION))
    return ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec.to_json(), status="reused",
                         version_uri=store.describe(version), validation=manifest.get("validation") or {},
                         tokens_per_step=measured, predicted_tokens_per_step=predicted)


def injected_fault(settings: Settings, planned: PlannedBuild) -> str | None:
    """The test seam's fault for this build ("greedy" when FUSEDSPEC_TEST_FAULT=greedy:<its slug>)."""
    return "greedy" if settings.test_fault == f"greedy:{planned.slug}" else None


def process_build(plan: RunPlan, planned: PlannedBuild, settings: Settings, *, owner: str | None = None,
                  fault: str | None = None) -> ConfigOutcome:
    """Make sure the build is published, doing only what is missing. A gate that fails (greedy mismatch,
    a compile error of this config) ends as a failed outcome with nothing published for it.

    `fault` is a test seam: "greedy" perturbs the compiled artifact's first shard before validation, to
    show that a wrong artifact is caught and not published (a fault no real input can cause on demand).
    """
    started = time.perf_counter()
    config = plan.config
    store = open_store(config.publish.uri, settings)
    manifest = find_published(store, plan, planned)
    if manifest is not None:
        return _reused(store, plan, planned, manifest)

    def done() -> bool:
        return find_published(store, plan, planned) is not None

    claim = claim_or_wait(store, planned.key, owner or new_owner(), config.fan_out.claim_lease_seconds, done)
    if claim is None:  # another worker published it while we waited
        outcome = _reused(store, plan, planned, find_published(store, plan, planned) or {})
        outcome.seconds = round(time.perf_counter() - started, 2)
        return outcome
    outcome = ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec.to_json(), status="failed")
    with renewing(claim):
        stage = "compile"
        try:
            download_model(plan.target, settings)
            download_model(plan.draft, settings)
            outcome.compiled = not is_complete(settings.builds_dir / planned.key)  # else built here before
            artifact = build_artifact(planned.spec, plan.target, plan.draft, settings, options=plan.options,
                                      key=planned.key)
            stage = "validate"
            if fault == "greedy":
                artifact = _perturbed_copy(artifact, settings)
            if config.validation.enabled:
                _validate(artifact, plan, settings, outcome)
            stage = "publish"
            result = publish_artifact(artifact, config.publish.uri, settings, store=store)
            outcome.status = "published"
            outcome.version_uri = result.version_uri
            outcome.bytes_sent = result.bytes_sent
            outcome.files_uploaded, outcome.files_copied = result.files_uploaded, result.files_copied
        except GreedyMismatchError as exc:
            outcome.failed_stage, outcome.reason = stage, str(exc)
            outcome.validation = {"passed": False, "summary": str(exc)}
        except FusedspecError as exc:
            outcome.failed_stage, outcome.reason = stage, str(exc)
    outcome.seconds = round(time.perf_counter() - started, 2)
    return outcome


def _validate(artifact: Path, plan: RunPlan, settings: Settings, outcome: ConfigOutcome) -> None:
    """The greedy gate, unless this artifact already passed it with the same prompts, length and
    tolerance (a run that crashed between validating and publishing does not validate again)."""
    from validate.greedy import validate_artifact

    v = plan.config.validation
    document = _passed_validation(artifact, plan)
    near_ties = 0
    if document is None:
        checked = validate_artifact(artifact, settings, prompts=v.prompts, max_new_tokens=v.max_new_tokens,
                                    tolerance=v.near_tie_tolerance, cost_ratio=v.cost_ratio)
        document, near_ties = checked.document, len(checked.greedy.near_ties)
    measured, predicted = _acceptance(document)
    outcome.tokens_per_step, outcome.predicted_tokens_per_step = measured, predicted
    outcome.near_ties = near_ties or len((document.get("greedy") or {}).get("near_ties") or [])
    outcome.validation = {"passed": True, "summary": document.get("summary"),
                          "tokens_per_step": measured, "predicted_tokens_per_step": predicted}


def _passed_validation(artifact: Path, plan: RunPlan) -> dict[str, Any] | None:
    """validation.json of `artifact` when it passed under this run's validation settings, else None."""
    from validate.greedy import default_tolerance
    from validate.prompts import load_prompt_set

    path = artifact / VALIDATION
    if not path.is_file():
        return None
    document = decode(path.read_bytes(), str(path))
    greedy = document.get("greedy") or {}
    v = plan.config.validation
    tolerance = default_tolerance(plan.build(document.get("key", "")).spec.dtype) \
        if v.near_tie_tolerance is None else v.near_tie_tolerance
    cost_model = (document.get("advice") or {}).get("cost_model") or {}
    same = (document.get("passed") is True
            and document.get("prompt_set_hash") == load_prompt_set(v.prompts).hash
            and greedy.get("max_new_tokens") == v.max_new_tokens
            and greedy.get("tolerance") == tolerance
            and (v.cost_ratio is None or cost_model.get("cost_ratio") == v.cost_ratio))
    return document if same else None


def _perturbed_copy(artifact: Path, settings: Settings) -> Path:
    """Test seam only (see process_build): a copy of the artifact with one target weight of shard 0
    scaled, so its greedy output changes. The cached build itself stays intact."""
    import shutil
    import tempfile

    from safetensors.torch import load_file, save_file

    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="faulty-", dir=settings.tmp_dir)) / artifact.name
    shutil.copytree(artifact, copy)
    (copy / VALIDATION).unlink(missing_ok=True)
    shard = copy / "weights" / "tp0_sharded_checkpoint.safetensors"
    tensors = load_file(shard)
    name = next(n for n in sorted(tensors) if n.startswith("target_model.") and n.endswith("o_proj.weight"))
    tensors[name] = tensors[name] * 25.0
    save_file(tensors, shard)
    return copy


def published_advice(plan: RunPlan, outcomes: list[ConfigOutcome],
                     settings: Settings) -> tuple[dict[str, Any] | None, bytes | None]:
    """The k advice (validation.json's `advice`) and its plot from the first published or reused
    version that has them; the advice depends only on the model pair and prompts, not on the config."""
    store = open_store(plan.config.publish.uri, settings)
    for outcome in outcomes:
        if outcome.status == "failed":
            continue
        version = join_key(config_path(plan, plan.build(outcome.key)), outcome.key)
        try:
            document = decode(store.get(join_key(version, VALIDATION)), VALIDATION)
        except NotFound:
            continue
        if not document.get("advice"):
            continue
        try:
            png: bytes | None = store.get(join_key(version, ADVICE_PLOT))
        except NotFound:
            png = None
        return document["advice"], png
    return None, None
