"""The `compile-fused` flow: a run config in, validated fused artifacts published to the store out.

    plan            everything the run needs, checked at once (flows.planning); a bad config ends the run
                    here, its reason the run's state message
    tokenizer-gate  target and draft must encode identically, or the run stops before any compile
    build           per config: reuse a published version, or claim, compile, validate, publish (local
                    threads, a Dask cluster, or one `compile-one` flow run per config on a work pool)
    report          table, summary and progress as artifacts of this run; the one-line outcome logged last

The flow returns the run summary (`RunSummary`). A run with failed builds ends Failed, its state message
the outcome line naming them, and still carries the summary (in a `FlowFailure`, the state's data);
everything that passed is published. A run its plan or tokenizer gate refused ends Failed with the reason
in one line as its state message and its first log line.
Tasks are thin: the work is in flows.planning, flows.pipeline, validate.tokenizers and registry.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from fusedspec.compile.runconfig import RunConfig
from fusedspec.core.errors import FusedspecError
from fusedspec.core.settings import Settings, load_settings
from fusedspec.flows.artifacts import publish_run_artifacts, run_name
from fusedspec.flows.logs import run_logs
from fusedspec.flows.pipeline import ConfigOutcome, process_build
from fusedspec.flows.planning import PlannedBuild, RunPlan, plan_run
from fusedspec.flows.progress import RunProgress
from fusedspec.flows.summary import FlowFailure, RunStopped, RunSummary, summarize

MAX_PARALLEL = 64  # submitted builds in flight; local mode limits compiles to fan_out.max_workers below


@task(name="plan", cache_policy=NO_CACHE)
def plan_task(config: RunConfig, settings: Settings) -> RunPlan | RunStopped:
    """The plan, or why there is none (an expected failure, not a crash with a traceback)."""
    try:
        return plan_run(config, settings)
    except FusedspecError as exc:
        return RunStopped.of("plan", exc)


@task(name="tokenizer-gate", cache_policy=NO_CACHE)
def tokenizer_gate_task(plan: RunPlan) -> RunStopped | None:
    """None when target and draft tokenize identically, else the gate's verdict."""
    from fusedspec.validate.tokenizers import check_tokenizers

    try:
        check_tokenizers(plan.target_config_dir, plan.draft_config_dir)
    except FusedspecError as exc:
        return RunStopped.of("tokenizer-gate", exc)
    return None


@task(name="build", task_run_name="build {planned.spec.slug}", cache_policy=NO_CACHE)
def build_task(plan: RunPlan, planned: PlannedBuild, settings: Settings,
               slots: threading.BoundedSemaphore | None = None) -> ConfigOutcome:
    with run_logs(get_run_logger(), label=planned.slug):
        if slots is None:
            return process_build(plan, planned, settings)
        with slots:  # local mode: at most fan_out.max_workers builds compile in this process at once
            return process_build(plan, planned, settings)


@task(name="compile-one", task_run_name="compile-one {planned.spec.slug}", cache_policy=NO_CACHE)
def deployment_task(plan: RunPlan, planned: PlannedBuild) -> ConfigOutcome:
    """One `compile-one` flow run on the deployment's work pool, awaited; its outcome, or why it failed."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    # called from sync code, run_deployment returns the FlowRun itself (its type also allows a coroutine)
    run = cast(FlowRun, run_deployment(plan.config.fan_out.deployment, timeout=None, poll_interval=2,
                                       parameters={"plan": plan.model_dump(mode="json"), "key": planned.key},
                                       as_subflow=True))
    state = run.state
    if state is not None and state.is_completed():
        return ConfigOutcome.model_validate(state.result())
    message = state.message if state is not None else "no state"
    return ConfigOutcome(slug=planned.slug, key=planned.key, spec=planned.spec, status="failed",
                         failed_stage="worker", reason=f"compile-one run {run.name} ended "
                         f"{state.type.value if state else 'unknown'}: {message}")


@flow(name="build-matrix-dask", validate_parameters=False)
def dask_builds(plan: RunPlan, settings: Settings, progress_id: Any) -> list[ConfigOutcome]:
    """The builds on a Dask cluster (this subflow's task runner); progress goes to the parent's artifact."""
    futures = [build_task.submit(plan, planned, settings) for planned in plan.builds]
    return _gather(futures, RunProgress.attach(progress_id, len(plan.builds)))


def _dask_runner(plan: RunPlan) -> Any:
    from prefect_dask import DaskTaskRunner

    fan_out = plan.config.fan_out
    if fan_out.dask_address:
        return DaskTaskRunner(address=fan_out.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": fan_out.max_workers, "threads_per_worker": 1,
                                          "processes": True})


def _gather(futures: list[PrefectFuture[ConfigOutcome]], progress: RunProgress) -> list[ConfigOutcome]:
    outcomes = []
    for future in futures:  # in submission order; each waits for its own build
        outcome = future.result()
        progress.advance(f"{outcome.slug}: {outcome.status}")
        outcomes.append(outcome)
    return outcomes


@flow(name="compile-fused", flow_run_name=run_name, log_prints=True, persist_result=True,
      task_runner=cast(Any, ThreadPoolTaskRunner(max_workers=MAX_PARALLEL)))
def compile_fused(config: RunConfig) -> RunSummary | State[Any]:
    """Compile, validate and publish every build of `config` that is not published yet.

    Args:
        config: The run config: target and draft, the matrix of builds, validation, where to publish.
    """
    logger = get_run_logger()
    settings = load_settings()
    plan = plan_task(config, settings)
    if isinstance(plan, RunStopped):
        logger.error("the run config cannot run: %s", plan.one_line())
        return Failed(message=plan.one_line(), data=FlowFailure(plan.one_line(), plan))
    refused = tokenizer_gate_task(plan)
    if refused is not None:
        logger.error("%s", refused.one_line())
        return Failed(message=refused.one_line(), data=FlowFailure(refused.one_line(), refused))
    logger.info("plan: %d build(s) of %s + %s, publishing to %s", len(plan.builds), plan.config.target,
                plan.config.draft, plan.publish_uri)
    progress = RunProgress.create(plan)
    mode = plan.config.fan_out.mode
    if mode == "dask":
        outcomes = dask_builds.with_options(task_runner=_dask_runner(plan))(plan, settings, progress.artifact_id)
    elif mode == "deployment":
        outcomes = _gather([deployment_task.submit(plan, planned) for planned in plan.builds], progress)
    else:
        slots = threading.BoundedSemaphore(plan.config.fan_out.max_workers)
        outcomes = _gather([build_task.submit(plan, planned, settings, slots) for planned in plan.builds], progress)
    summary = summarize(plan, outcomes)
    publish_run_artifacts(plan, summary)
    logger.info("%s", summary.details())
    if summary.counts.failed:  # the outcome line is the last log line and, of a failed run, its state message
        logger.error("%s", summary.outcome_line())
        return Failed(message=summary.outcome_line(), data=FlowFailure(summary.outcome_line(), summary))
    logger.info("%s", summary.outcome_line())
    return summary
