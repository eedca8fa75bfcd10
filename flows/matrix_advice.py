"""The k advice before any compile, for a run config that limits its matrix (`matrix.top_per_class`).

    matrix_limit(plans, settings, compute=...) -> MatrixLimit | None    what the limit keeps and leaves out
    limited(plans, limit) -> RunPlans                                   the plans with the kept builds only
    limit_lines(limit, several=...) -> list[str]                        the same for a terminal or a log

Per draft and dtype of the matrix, the advice is validate.advice.advise_pair on the downloaded target and
draft, on the run's prompts (both variants, as validation renders them) at the run's max_new_tokens and every
k of the matrix, with the draft's own given cost ratio, else the backend's stated bytes model, else
transformers forwards on this host. Each is cached by content (validate.matrix_limit), and the greedy
reference it computes is the one validation uses later. With `compute=False` nothing is downloaded or run:
the limit comes from the cache, or is None when the advice has not run yet (what `fusedspec plan` and a dry
run then say). The limit itself is validate.matrix_limit's rule.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fusedspec.compile.documents.validation import AdviceRecord
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.settings import Settings
from fusedspec.flows.planning import RunPlan, RunPlans, short_name
from fusedspec.validate.cost_model import CostModel
from fusedspec.validate.matrix_limit import MatrixLimit, advice_key, cached_advice, limit_matrix, store_advice


def matrix_limit(plans: RunPlans, settings: Settings, *, compute: bool) -> MatrixLimit | None:
    """The limit of a run config with `matrix.top_per_class` (None without one, or when `compute` is False and
    some draft's advice is not cached). Computing downloads the target and each draft, and holds the target
    and the drafts of one dtype in memory together (one transformers load each)."""
    top = plans.config.matrix.top_per_class
    if top is None:
        return None
    from fusedspec.registry.download import download_model
    from fusedspec.validate.advice import advise_pair
    from fusedspec.validate.hf_models import HfModels
    from fusedspec.validate.prompts import VARIANTS, load_tokenizer, render_prompts

    first = plans.plans[0]
    rendered = render_prompts(first.prompt_set, load_tokenizer(first.target_config_dir), VARIANTS)
    ks = plans.config.matrix.speculation_length
    max_new_tokens = plans.config.validation.max_new_tokens
    advice: dict[tuple[str, str], AdviceRecord] = {}
    target_dir: Path | None = None
    for dtype in plans.config.matrix.dtype:
        models = HfModels()  # the target loaded once for the reference and every draft's agreement
        for plan in plans.plans:
            draft = plan.config.drafts[0]
            at_first = next((planned.spec for planned in plan.builds if planned.spec.dtype == dtype), None)
            stated = _stated(plan)(at_first) if at_first is not None else None
            key = advice_key(plan.target.identity(), plan.draft.identity(), rendered,
                             max_new_tokens=max_new_tokens, dtype=dtype, ks=ks, cost_ratio=plan.cost_ratio,
                             stated=stated is not None)
            record = cached_advice(settings.cache_dir, key)
            if record is None:
                if not compute:
                    return None
                target_dir = target_dir or download_model(plan.target, settings)
                pair = advise_pair(target_dir, download_model(plan.draft, settings), plan.target.identity(),
                                   rendered, max_new_tokens=max_new_tokens, dtype=dtype,
                                   cache_dir=settings.cache_dir, ks=ks, cost_ratio=plan.cost_ratio,
                                   eos_token_ids=plan.target_arch.eos_token_id, models=models,
                                   archs=(plan.target_arch, plan.draft_arch), stated=stated,
                                   draft_identity=plan.draft.identity())
                record = pair.advice.record()
                store_advice(settings.cache_dir, key, record)
            advice[draft, dtype] = record
    by_draft = {plan.config.drafts[0]: _stated(plan) for plan in plans.plans}
    return limit_matrix([(plan.config.drafts[0], planned.spec) for plan, planned in plans.builds], advice,
                        top, lambda draft, spec: by_draft[draft](spec))


def _stated(plan: RunPlan) -> Callable[[BuildSpec], CostModel | None]:
    """The cost model stated for a build of `plan` (the bytes model of a backend that states one), unless the
    run gives the draft's cost ratio: then the given one holds for every build."""
    from fusedspec.validate.step_costs import stated_bytes_model

    def stated(spec: BuildSpec) -> CostModel | None:
        if plan.cost_ratio is not None:
            return None
        return stated_bytes_model(plan.config.backend, spec, plan.target_arch, plan.draft_arch)

    return stated


def limited(plans: RunPlans, limit: MatrixLimit) -> RunPlans:
    """`plans` with only the builds `limit` keeps (a draft none of whose builds is kept keeps its plan, empty:
    the run still names it)."""
    return plans.model_copy(update={"plans": tuple(
        plan.model_copy(update={"builds": tuple(b for b in plan.builds
                                                if limit.keeps(plan.config.drafts[0], b.slug))})
        for plan in plans.plans)})


def limit_lines(limit: MatrixLimit, *, several: bool) -> list[str]:
    """Each draft's cost model, what each class keeps (per setup when the setups rank differently), and every
    build left out with the reason."""
    def name(draft: str, k: int) -> str:
        return f"{short_name(draft)} k={k}" if several else f"k={k}"

    lines = [f"k advice before compiling (matrix.top_per_class {limit.top_per_class}), from each draft's "
             "acceptance on the run's prompts:"]
    lines += [f"  {short_name(draft) if several else 'cost model'}: c = {record.cost_model.cost_ratio:.3f}, "
              f"b = {record.cost_model.verify_slope:.3f}; {record.cost_model.source}"
              for draft, record in limit.advice.items()]
    setups: dict[str, dict[str, list[str]]] = {}
    for pick in limit.picks:
        setups.setdefault(pick.setup, {}).setdefault(pick.cls, []).append(f"{name(pick.draft, pick.k)} "
                                                                           f"{pick.speedup:.2f}x")
    alike = len({repr(classes) for classes in setups.values()}) == 1  # then one list says it for every setup
    for setup, classes in list(setups.items())[:1] if alike else setups.items():
        lines += [f"  [{cls}] {'' if alike else setup + ' '}keeps {', '.join(cells)}"
                  for cls, cells in classes.items()]
    kept = sum(len(slugs) for slugs in limit.kept.values())
    lines.append(f"  {kept} of {kept + len(limit.left_out)} builds kept"
                 + (", left out:" if limit.left_out else ""))
    lines += [f"    {short_name(o.draft) + ' ' if several else ''}{o.slug}: {o.reason}"
              for o in limit.left_out]
    return lines


def limit_notes(plans: RunPlans, limit: MatrixLimit | None) -> list[str]:
    """What a plan or a dry run says of the limit: from the advice cached by an earlier run or compile, or
    that a run computes it first."""
    top = plans.config.matrix.top_per_class
    if top is None:
        return []
    if limit is None:
        models = len(plans.plans) + 1
        return [f"matrix.top_per_class {top}: a run (or `fusedspec compile`) first downloads the weights of "
                f"all {models} models and runs the k advice (their forward passes, on its host), then builds "
                f"only the first {top} (draft, k) of each prompt class; until that advice has run once, "
                "which of these builds it leaves out is not known"]
    return [f"matrix.top_per_class {top}: the k advice (kept in the work dir's cache, computed on the "
            f"downloaded models) leaves {len(limit.left_out)} build(s) out"]
