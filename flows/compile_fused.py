"""The `compile-fused` flow: a run config in, validated fused artifacts published to the store out.

    plan            pin both models, fetch configs only, check the matrix, compute content keys
    tokenizer-gate  target and draft must encode identically, or the run stops before any compile
    builds          per config: reuse a published version, or claim, compile, validate, publish
                    (in-process threads, a Dask cluster, or one `compile-one` flow run per config)
    summary         table + markdown + k-advice plot as Prefect artifacts; the flow fails, naming the
                    failing configs, when any config failed (everything that passed is still published)

Tasks are thin: the work is in flows.planning, flows.pipeline, validate.tokenizers and registry.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.task_runners import ThreadPoolTaskRunner

from compile.errors import CheckFailed
from compile.runconfig import RunConfig
from compile.settings import load_settings
from flows.pipeline import ConfigOutcome, injected_fault, process_build, published_advice
from flows.planning import PlannedBuild, RunPlan, pinned_config, plan_run
from flows.progress import RunProgress
from flows.report import counts, markdown_summary, png_data_uri, table_rows, text_summary


@task(name="plan")
def plan_task(config: RunConfig) -> RunPlan:
    return plan_run(config, load_settings())


@task(name="tokenizer-gate")
def tokenizer_gate_task(plan: RunPlan) -> dict[str, Any]:
    from validate.tokenizers import check_tokenizers

    return check_tokenizers(plan.target_config_dir, plan.draft_config_dir).to_json()


@task(name="build", task_run_name="build {planned.spec.slug}")
def build_task(plan: RunPlan, planned: PlannedBuild) -> ConfigOutcome:
    settings = load_settings()
    return process_build(plan, planned, settings, fault=injected_fault(settings, planned))


@flow(name="build-matrix", validate_parameters=False)
def build_matrix(plan: RunPlan) -> list[ConfigOutcome]:
    """Every build of the plan through this flow's task runner (threads or Dask)."""
    progress = RunProgress(len(plan.builds), key="compile-fused-progress")
    futures = {build_task.submit(plan, planned): planned for planned in plan.builds}
    outcomes = {}
    for future in futures:  # in submission order; each waits for its own build
        outcome = future.result()
        outcomes[outcome.key] = outcome
        progress.advance(f"{outcome.slug}: {outcome.status}")
    return [outcomes[p.key] for p in plan.builds]


def _task_runner(plan: RunPlan) -> Any:
    fan_out = plan.config.fan_out
    if fan_out.mode == "dask":
        from prefect_dask import DaskTaskRunner

        if fan_out.dask_address:
            return DaskTaskRunner(address=fan_out.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": fan_out.max_workers, "threads_per_worker": 1,
                                              "processes": True})
    return ThreadPoolTaskRunner(max_workers=fan_out.max_workers)


def builds_via_deployments(plan: RunPlan) -> list[ConfigOutcome]:
    """One `compile-one` flow run per config on its deployment's work pool, awaited and gathered."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    config = pinned_config(plan).model_dump(mode="json")
    progress = RunProgress(len(plan.builds), key="compile-fused-progress")

    def one(planned: PlannedBuild) -> ConfigOutcome:
        # called from sync code, run_deployment returns the FlowRun itself (its type also allows a coroutine)
        run = cast(FlowRun, run_deployment(plan.config.fan_out.deployment, timeout=None, poll_interval=2,
                                           parameters={"config": config, "key": planned.key}, as_subflow=True))
        state = run.state
        if state is not None and state.is_completed():
            return ConfigOutcome(**state.result())
        message = state.message if state is not None else "no state"
        return ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec.to_json(), status="failed",
                             failed_stage="worker", reason=f"compile-one run {run.name} ended "
                             f"{state.type.value if state else 'unknown'}: {message}")

    outcomes = {}
    with ThreadPoolExecutor(max_workers=max(1, len(plan.builds))) as pool:
        futures = [pool.submit(one, planned) for planned in plan.builds]
        for future in as_completed(futures):
            outcome = future.result()
            outcomes[outcome.key] = outcome
            progress.advance(f"{outcome.slug}: {outcome.status}")
    return [outcomes[p.key] for p in plan.builds]


def _report(plan: RunPlan, outcomes: list[ConfigOutcome]) -> dict[str, Any]:
    settings = load_settings()
    advice, png = published_advice(plan, outcomes, settings)
    config = plan.config
    create_table_artifact(table=table_rows(outcomes), key="compile-fused-configs",
                          description=f"Builds of {config.target} + {config.draft}")
    create_markdown_artifact(markdown_summary(outcomes, advice, png, target=config.target, draft=config.draft,
                                              backend=config.backend), key="compile-fused-summary")
    if png:
        create_image_artifact(image_url=png_data_uri(png), key="compile-fused-k-advice",
                              description="Predicted speedup vs k per prompt class")
    summary = {"counts": counts(outcomes), "outcomes": [o.to_json() for o in outcomes], "advice": advice,
               "text": text_summary(outcomes, advice)}
    get_run_logger().info("%s", str(summary["text"]).splitlines()[0])
    return summary


@flow(name="compile-fused", log_prints=True)
def compile_fused(config: RunConfig) -> dict[str, Any]:
    """Compile, validate and publish every build of `config` that is not published yet."""
    plan = plan_task(config)
    tokenizer_gate_task(plan)
    if config.fan_out.mode == "deployment":
        outcomes = builds_via_deployments(plan)
    else:
        outcomes = build_matrix.with_options(task_runner=_task_runner(plan))(plan)
    summary = _report(plan, outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        names = "; ".join(f"{o.slug} ({o.failed_stage})" for o in failed)
        raise CheckFailed(f"{len(failed)} of {len(outcomes)} config(s) failed: {names}", report=summary)
    return summary
