"""Plan a run: everything a run will need, checked before any work, in one pass.

    plan_drafts(config, settings, base_dir) -> RunPlans   one RunPlan per draft, or MatrixError naming every
                                                          problem of them all at once
    plan_run(config, settings, base_dir) -> RunPlan       the same for a config of one draft

A plan pins both models (Hub commit and file hashes; a local directory's files hashed once per unchanged
file), reads their configs and tokenizer files (never the weights), loads and checks the prompt set,
resolves the store URI and checks that the store can be reached (without writing), checks the matrix
against both models and the backend, and computes every build's content key. The plan is then handed
to every stage (builds, validation, publishing, the report, compile-one runs on other workers), so no
stage resolves, hashes or loads again. A run config that `fusedspec plan` accepts does not fail later
for a reason a plan could have seen.

A run with several drafts is one plan per draft over the same matrix: the draft is one more axis of the
matrix, each draft's builds carry their own keys and store paths ({target}/{draft}/{spec}), and each plan
is what a run of that draft alone would do, so every stage after planning works on one pair.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from fusedspec.compile.backend import get_backend
from fusedspec.compile.content_key import BuildKeys, build_keys
from fusedspec.compile.matrix import arch_problems, model_problems, plan_matrix, spec_only_problems
from fusedspec.compile.modelconfig import ModelArch, ModelConfig, read_model_config
from fusedspec.compile.modelref import ModelRef, ResolvedModel, parse_model_ref
from fusedspec.compile.runconfig import (
    RunConfig,
    RunConfigError,
    read_run_config_file,
    run_config_from_dict,
)
from fusedspec.compile.spec import MAX_BUILDS, MAX_SEQ_LEN, MAX_TP, BuildSpec
from fusedspec.core.errors import InputError, MatrixError, PromptError, StoreError
from fusedspec.core.files import FileHasher
from fusedspec.core.settings import Settings
from fusedspec.registry.download import fetch_configs
from fusedspec.registry.hub import check_local, resolve_local, resolve_model
from fusedspec.registry.stores import open_writable_store
from fusedspec.registry.uri import parse_store_uri
from fusedspec.validate.prompts import PromptSet, load_prompt_set
from fusedspec.validate.tokenizers import check_tokenizers


class PlannedBuild(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: BuildSpec
    key: str  # the version key
    graph_key: str  # what shapes its programs: builds of one graph key share them (compile/content_key.py)
    weight_key: str
    draft_name: str = ""  # in a run of several drafts, the draft's short name (short_name); else ""

    @property
    def slug(self) -> str:
        return self.spec.slug

    @property
    def label(self) -> str:
        """The build's name in task runs, progress and logs: its spec,
        after its draft's in a run of several."""
        return f"{self.draft_name} {self.slug}" if self.draft_name else self.slug

    @property
    def all_keys(self) -> BuildKeys:  # not `keys`: Prefect takes an object with keys() for a mapping
        return BuildKeys(graph=self.graph_key, weights=self.weight_key, version=self.key)


class RunPlan(BaseModel):
    """What a run does, as plain data that crosses process and pod boundaries (JSON)."""

    model_config = ConfigDict(frozen=True)

    config: RunConfig
    publish_uri: str  # the store, absolute: a directory or s3://
    target: ResolvedModel  # each with its config.json parsed (ResolvedModel.config): no stage parses it again
    draft: ResolvedModel
    target_config_dir: Path  # config + tokenizer files, fetched without weights
    draft_config_dir: Path
    prompt_set: PromptSet
    builds: tuple[PlannedBuild, ...]
    toolchain: dict[str, str]
    code_version: str
    options: dict[str, Any]

    @property
    def target_arch(self) -> ModelArch:
        return self.target.parsed_config().arch

    @property
    def draft_arch(self) -> ModelArch:
        return self.draft.parsed_config().arch

    def build(self, key: str) -> PlannedBuild:
        for planned in self.builds:
            if planned.key == key:
                return planned
        raise InputError(f"no build with key {key} in this run config; `fusedspec plan` lists the keys")

    def config_path(self, planned: PlannedBuild) -> str:
        """The store path of a build's config: {target}/{draft}/{spec slug} (registry.publish lays it out)."""
        return f"{self.target.store_name}/{self.draft.store_name}/{planned.slug}"

    @property
    def validated(self) -> bool:
        """Whether builds go through the greedy gate (not when publishing unvalidated builds is asked for)."""
        return not self.config.publish.unvalidated

    @property
    def cost_ratio(self) -> float | None:
        """The cost ratio the run gives this plan's draft for the k advice (None: measured)."""
        return self.config.cost_ratio_of(self.config.drafts[0])


class RunPlans(BaseModel):
    """A run's plans, one per draft in the config's order,
    and its config pinned (every draft at its commit)."""

    model_config = ConfigDict(frozen=True)

    config: RunConfig
    plans: tuple[RunPlan, ...]

    @property
    def builds(self) -> tuple[tuple[RunPlan, PlannedBuild], ...]:
        """Every build of the run with its draft's plan, draft by draft."""
        return tuple((plan, planned) for plan in self.plans for planned in plan.builds)

    @property
    def target(self) -> ResolvedModel:
        return self.plans[0].target

    @property
    def publish_uri(self) -> str:
        return self.plans[0].publish_uri

    def several(self) -> bool:
        """Whether the run compares drafts (its tables and summary then name each build's draft)."""
        return len(self.plans) > 1


def short_name(reference: str) -> str:
    """A model reference as a short readable name: the repo name or the directory name."""
    body = reference.split("://", 1)[-1].split("@", 1)[0].rstrip("/")
    return body.rsplit("/", 1)[-1]


def key_options(config: RunConfig) -> dict[str, Any]:
    """Compile options that change a build's result (and so its key), as the config's backend fills in its
    options (RunConfig.backend_options): for cpu, AOTInductor packaging (with the CPU ISA its native code is
    compiled for) and the target-alone programs; for neuron, its section (platform, LNC resolved,
    bucketing, buckets, async_mode), with the compile cache's location, which no key holds
    (compile/content_key.py UNKEYED_OPTIONS)."""
    return get_backend(config.backend).build_options(config.backend_options())


def sweep_notes(plan: RunPlan) -> list[str]:
    """What the backend says builds of different k share, when the run has several k (the neuron backend:
    nothing, so the plan says so instead of a run finding out)."""
    note = get_backend(plan.config.backend).k_sweep_note
    return [note] if note and len({b.spec.k for b in plan.builds}) > 1 else []


@dataclass(frozen=True)
class FoundModel:
    """A model reference read as far as it goes without hashing weights: its parsed config.json, and for a
    Hub model its pin (commit, the file hashes the Hub states) with the directory of its config files. A
    local directory is pinned (its files hashed) only once the run config has no other problem
    (`pin_found`): hashing a 64 GB checkpoint takes minutes, and a refusal must not."""

    ref: ModelRef
    config: ModelConfig
    pinned: tuple[ResolvedModel, Path] | None


def find_model(text: str, role: str, base_dir: Path, settings: Settings, backend: str) -> FoundModel:
    """Read a model reference up to its config.json: a local model the backend cannot build is refused
    from it, and one with broken weight headers from those."""
    try:
        ref = parse_model_ref(text, base_dir=base_dir)
        if ref.local_dir is not None:
            parsed = read_model_config(ref.local_dir)
            refused = arch_problems(parsed.arch, role, backend)
            if refused:
                raise InputError("; ".join(refused))
            return FoundModel(ref, check_local(ref, config=parsed), None)
        model = resolve_model(ref, settings)
        config_dir = fetch_configs(model, settings)
        model = replace(model, config=read_model_config(config_dir))
        return FoundModel(ref, model.parsed_config(), (model, config_dir))
    except InputError as exc:
        raise InputError(f"{role}: {exc}") from exc


def pin_found(found: FoundModel, role: str, settings: Settings) -> tuple[ResolvedModel, Path]:
    """The pinned model carrying its parsed config.json, and the directory of its config files."""
    if found.pinned is not None:
        return found.pinned
    try:
        model = resolve_local(found.ref, FileHasher(settings.cache_dir), config=found.config)
    except InputError as exc:
        raise InputError(f"{role}: {exc}") from exc
    return model, model.local_dir


def publish_uri(config: RunConfig, base_dir: Path | None, settings: Settings) -> str:
    """The store a run publishes to. A relative directory is resolved against `base_dir` (the caller's
    directory at submit time); with no `base_dir` (a run on a worker, whose directory is temporary) it
    is refused. No URI means the work dir's store."""
    text = config.publish.uri
    if text is None:
        return str(settings.default_store)
    try:
        parsed = parse_store_uri(text)
    except StoreError as exc:
        raise StoreError(f"publish.uri: {exc}") from None
    if parsed.scheme == "s3" or text.startswith("file://") or Path(text).is_absolute():
        return text
    if base_dir is None:
        raise InputError(f"publish.uri {text!r} is a relative directory, and this run has no directory of "
                         "its own (a worker runs flows in a temporary directory that is deleted afterwards); "
                         "give an absolute directory or s3://BUCKET/PREFIX")
    return str((base_dir / text).resolve())


def plan_drafts(config: RunConfig, settings: Settings, *, base_dir: Path | None = None) -> RunPlans:
    """One plan per draft of `config` (plan_run), or MatrixError naming every problem of every draft at once
    (a problem of the target, the matrix or the store once; a draft's own problems under its name)."""
    several = len(config.drafts) > 1
    problems: list[str] = []
    total = config.matrix.size() * len(config.drafts)
    if several and total > MAX_BUILDS:
        problems.append(f"draft: {len(config.drafts)} drafts x {config.matrix.size()} builds of the matrix "
                        f"is {total} builds; one run plans at most "
                        f"{MAX_BUILDS} (each is a compile): name fewer drafts")
    plans = []
    for draft in config.drafts:
        try:
            plans.append(plan_run(config.for_draft(draft), settings, base_dir=base_dir,
                                  draft_role=f"draft {draft}" if several else "draft"))
        except MatrixError as exc:
            named = [f"draft {draft}: {p}" if several and "draft" in p and draft not in p else p
                     for p in exc.problems]
            problems += [p for p in named if p not in problems]
    problems += repeated_models(plans) if several else []
    if problems:
        raise MatrixError(problems, what="the run config")
    if several:
        plans = [plan.model_copy(update={"builds": tuple(
            b.model_copy(update={"draft_name": short_name(plan.config.drafts[0])}) for b in plan.builds)})
            for plan in plans]
    drafts = [plan.config.drafts[0] for plan in plans]
    validation = plans[0].config.validation.model_copy(update={"cost_ratio": config.validation.cost_ratio})
    pinned = plans[0].config.model_copy(update={  # the matrix with its top_per_class (RunConfig.for_draft)
        "draft": drafts if isinstance(config.draft, list) else drafts[0], "validation": validation,
        "matrix": config.matrix})
    return RunPlans(config=pinned, plans=tuple(plans))


def same_model(model: ResolvedModel) -> tuple[str, ...]:
    """One model however it is spelled: a Hub repo at its commit, or a directory by its real path."""
    if model.ref.repo_id is not None and model.commit is not None:
        return ("hub", model.ref.repo_id.lower(), model.commit)
    return ("dir", str(model.local_dir.resolve()) if model.local_dir is not None else model.ref.text)


def repeated_models(plans: list[RunPlan]) -> list[str]:
    """The drafts of a run that are another of its drafts or its target again however spelled (a symlink, a
    branch and its commit), or another revision of a Hub draft it has: each would share its store path."""
    problems: list[str] = []
    seen = {same_model(plans[0].target): f"the target {plans[0].target.ref.text}"} if plans else {}
    repos: dict[str, str] = {}
    for plan in plans:
        draft, given = plan.draft, plan.draft.ref.text
        if (earlier := seen.get(same_model(draft))) is not None:
            problems.append(f"draft {given}: is {earlier} again (the same model); name each draft once, and "
                            "none that is the target itself")
        elif draft.ref.repo_id is not None and (other := repos.get(draft.ref.repo_id.lower())) is not None:
            problems.append(f"draft {given}: another revision of draft {other}, and both would publish under "
                            "one store path; compare revisions of one repo in separate runs")
        seen.setdefault(same_model(draft), f"draft {given}")
        if draft.ref.repo_id is not None:
            repos.setdefault(draft.ref.repo_id.lower(), given)
    return problems


def plan_run(config: RunConfig, settings: Settings, *, base_dir: Path | None = None,
             draft_role: str = "draft") -> RunPlan:
    """Every build of `config` (of one draft) with its key, or MatrixError naming every problem found.

    Local paths (models, prompt file, store) are relative to `base_dir` (the config file's directory);
    with `base_dir=None` (a flow run on a worker) relative paths are refused. `draft_role` names the draft
    in its problems (`draft hf://ORG/NAME: ...` in a run of several).
    """
    if len(config.drafts) != 1:
        raise InputError("plan_run plans one draft and the config "
                         f"names {len(config.drafts)}: use plan_drafts")
    config = config.for_draft(config.drafts[0])  # its cost ratio one number, as every stage after reads it
    problems: list[str] = []
    uri = _collect(problems, lambda: publish_uri(config, base_dir, settings))
    if uri is not None:
        _collect(problems, lambda: check_publish_store(uri, settings))
    prompts = _collect(problems, lambda: _local_path(config.validation.prompts, base_dir))
    prompt_set = _collect(problems, lambda: _prompt_set(prompts)) if prompts is not None else None
    models: dict[str, FoundModel] = {}
    labels = {"target": "target", "draft": draft_role}
    for role, text in (("target", config.target), ("draft", config.drafts[0])):
        if base_dir is None and "://" not in text and not Path(text).is_absolute():
            problems.append(f"{labels[role]}: {text!r} is a relative directory and this run has no directory "
                            "of its own; give an absolute path or hf://ORG/NAME")
            continue
        found = _collect(problems, lambda text=text, role=role: find_model(
            text, labels[role], base_dir or Path("/"), settings, config.backend))
        if found is not None:
            models[role] = found
    specs: list[BuildSpec] = []
    if len(models) == 2:
        target_arch, draft_arch = (models[role].config.arch for role in ("target", "draft"))
        try:
            specs = plan_matrix(config.matrix, config.backend, target_arch, draft_arch)
        except MatrixError as exc:
            problems += exc.problems
        backend = get_backend(config.backend)
        for spec in specs:
            problems += [p for p in backend.check(spec, target_arch, draft_arch) if p not in problems]
    else:
        problems += spec_only_problems(config.matrix, config.backend)
    problems += get_backend(config.backend).host_problems(config.backend_options())
    if problems or uri is None or prompt_set is None:
        raise MatrixError(problems, what="the run config")
    pinned = {role: _collect(problems, lambda role=role: pin_found(models[role], labels[role], settings))
              for role in ("target", "draft")}
    if problems:
        raise MatrixError(problems, what="the run config")

    (target, target_dir), (draft, draft_dir) = pinned["target"], pinned["draft"]
    backend = get_backend(config.backend)
    options = key_options(config)
    toolchain = backend.toolchain()
    configs = target.parsed_config(), draft.parsed_config()
    builds = tuple(_planned(spec, build_keys(spec, target, draft, *configs, toolchain, backend.code_version,
                                             options)) for spec in specs)
    pinned_config = config.model_copy(update={
        "target": _pin(target), "draft": _pin(draft),
        "validation": config.validation.model_copy(update={"prompts": prompts}),
        "publish": config.publish.model_copy(update={"uri": uri})})
    return RunPlan(config=pinned_config, publish_uri=uri, target=target, draft=draft,
                   target_config_dir=target_dir, draft_config_dir=draft_dir,
                   prompt_set=prompt_set, builds=builds, toolchain=toolchain,
                   code_version=backend.code_version, options=options)


def _planned(spec: BuildSpec, keys: BuildKeys) -> PlannedBuild:
    return PlannedBuild(spec=spec, key=keys.version, graph_key=keys.graph, weight_key=keys.weights)


def plan_file(path: Path, settings: Settings, *, draft: str | None = None) -> RunPlans:
    """The plans of a run config file (local paths relative to its directory), each pair through the
    tokenizer gate. When the file itself has problems, the models it names and the matrix (when that part
    parses) are still checked, so every mistake is reported at once. `draft` replaces the file's drafts (a
    dry run that compares drafts: an hf:// reference or an absolute directory)."""
    path = Path(path)
    data = read_run_config_file(path)
    if draft is not None and isinstance(data, dict):
        data = {**data, "draft": draft}
    try:
        config = run_config_from_dict(data, source=str(path))
    except RunConfigError as exc:
        more = _raw_problems(data, path.resolve().parent, settings)
        if not more:
            raise
        raise MatrixError(list(exc.problems) + more, what=str(path)) from None
    try:
        plans = plan_drafts(config, settings, base_dir=path.resolve().parent)
    except MatrixError as exc:
        raise MatrixError(exc.problems, what=str(path)) from None  # name the file the problems are in
    # The tokenizer gate reads only config and tokenizer files, so `plan`, `compile` and `run` refuse a pair
    # that cannot speculate (TokenizerMismatchError, exit 1) or a tokenizer file that does not parse (exit 2)
    # before any weight is downloaded or compiled.
    check_draft_tokenizers(plans, by_name=draft is not None or plans.several())
    return plans


def check_draft_tokenizers(plans: RunPlans, *, by_name: bool) -> None:
    """Every draft against the target's tokenizer, TokenizerMismatchError naming the first that differs (by
    its reference when `by_name`). A draft that fails stops the whole run, not only its builds: the user
    named it to be compared, and a run that quietly left it out would rank drafts it was not asked to."""
    for plan in plans.plans:
        check_tokenizers(plan.target_config_dir, plan.draft_config_dir,
                         b_name=f"draft {plan.draft.ref.text}" if by_name else "draft")


def _raw_problems(data: dict[str, Any], base_dir: Path, settings: Settings) -> list[str]:
    """What can still be checked of a config that does not parse: its models, and with them every value of
    its matrix that is a whole number (a TP that does not fit the heads beside a k of 1: both are named)."""
    problems: list[str] = []
    archs = {}
    backend = data.get("backend", "cpu") if isinstance(data.get("backend", "cpu"), str) else "cpu"
    given = data.get("draft")
    drafts: list[Any] = given if isinstance(given, list) else [given]
    named = [("target", data.get("target"))] + [(f"draft {text}" if len(drafts) > 1 else "draft", text)
                                                 for text in drafts]
    for role, text in named:
        if isinstance(text, str) and text.strip():
            found = _collect(problems, lambda text=text, role=role: find_model(text, role, base_dir, settings,
                                                                                backend))
            if found is not None:
                archs[role] = found.config.arch
    if len(archs) == 2 and "draft" in archs:
        raw = data.get("matrix")
        matrix: dict[str, Any] = raw if isinstance(raw, dict) else {}
        problems += model_problems(_whole_numbers(matrix.get("tp_degree"), MAX_TP),
                                   _whole_numbers(matrix.get("seq_len"), MAX_SEQ_LEN), backend,
                                   archs["target"], archs["draft"])
    else:
        for role, arch in archs.items():
            problems += arch_problems(arch, role, backend)
    return list(dict.fromkeys(problems))


def _whole_numbers(values: Any, limit: int) -> list[int]:
    """The values of a raw matrix list that are in its bounds (the others are the schema's problems)."""
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= limit]


def _collect(problems: list[str], step: Any) -> Any:
    """Run `step`; an InputError becomes a problem (all are reported together) and None is returned."""
    try:
        return step()
    except MatrixError as exc:
        problems += exc.problems
    except InputError as exc:
        problems.append(str(exc))
    return None


def check_publish_store(uri: str, settings: Settings) -> None:
    """StoreError naming publish.uri when a run could not publish to `uri` (checked without writing)."""
    try:
        open_writable_store(uri, settings)
    except StoreError as exc:
        raise StoreError(f"publish.uri: {exc}") from None


def _prompt_set(reference: str) -> PromptSet:
    try:
        return load_prompt_set(reference)
    except PromptError as exc:
        raise PromptError(f"validation.prompts: {exc}") from None


def _local_path(prompts: str, base_dir: Path | None) -> str:
    """The prompt set reference with a relative file made absolute against `base_dir`."""
    if prompts == "default" or Path(prompts).is_absolute():
        return prompts
    if base_dir is None:
        raise InputError(f"validation.prompts {prompts!r} is a relative path and this run has no directory "
                         "of its own (a worker's directory is temporary); give an absolute path")
    return str((base_dir / prompts).resolve())


def _pin(model: ResolvedModel) -> str:
    """The reference that names exactly this content: a Hub model at its commit, a directory absolute."""
    if model.ref.repo_id is not None and model.commit is not None:
        return f"hf://{model.ref.repo_id}@{model.commit}"
    return str(model.local_dir)
