"""The `compile-fused` flow: a run config in, validated fused artifacts published to the store out.

    plan            everything the run needs, checked at once (flows.planning): one plan per draft; a bad
                    config ends the run here, its reason the run's state message
    tokenizer-gate  target and every draft must encode identically, or the run stops before any compile
    advise-matrix   with matrix.top_per_class: each draft's k advice on the downloaded models, and the builds
                    it keeps (the others are left out, each with why: flows.matrix_advice)
    build           per config: reuse a published version, or claim, compile, validate, publish (local
                    threads, a Dask cluster, or one `compile-one` flow run per config on a work pool)
    report          table, summary and progress as artifacts of this run; the one-line outcome logged last

A caller that runs the flow in its own process (`fusedspec run`, the demo) hands it the plans it made and
its settings (`handing`): the flow then plans nothing again. A deployment run, given only `config`, plans in
its plan task and loads its settings once, for its tasks to share.
The flow returns the run summary (`RunSummary`). A run with failed builds ends Failed, its state message
the outcome line naming them, and still carries the summary (in a `FlowFailure`, the state's data);
everything that passed is published. A run its plan or tokenizer gate refused ends Failed with the reason
in one line as its state message and its error line; no traceback is logged for either end.
Local builds run `fan_out.max_workers` at once by a Prefect concurrency limit (waiting ones are Pending),
and are gathered as they finish. A build or the plan that met a TransientError is tried again, nothing else.
Tasks are thin: the work is in flows.planning, flows.pipeline, validate.tokenizers and registry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.futures import PrefectFuture, as_completed
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from fusedspec.compile.runconfig import RunConfig, run_config_from_dict
from fusedspec.core.errors import FusedspecError, TransientError
from fusedspec.core.settings import Settings, load_settings
from fusedspec.flows.artifacts import publish_run_artifacts, run_name
from fusedspec.flows.logs import route_to_prefect, run_logs
from fusedspec.flows.matrix_advice import limit_lines, limited, matrix_limit
from fusedspec.flows.pipeline import ConfigOutcome, process_build
from fusedspec.flows.planning import PlannedBuild, RunPlan, RunPlans, check_draft_tokenizers, plan_drafts
from fusedspec.flows.progress import RunProgress
from fusedspec.flows.summary import FlowFailure, RunStopped, RunSummary, summarize
from fusedspec.validate.matrix_limit import MatrixLimit

MAX_PARALLEL = 64  # submitted builds in flight; local mode runs fan_out.max_workers at once (build_slots)
# A build that failed because the Hub or S3 did not answer is tried again after these delays; the try
# finds what the last one finished (downloads, the compiled build, a passed gate, uploaded files).
RETRY_DELAYS = [10.0, 60.0]


def transient_failure(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's retry condition: retry only a TransientError (core.errors); anything else fails now."""
    try:
        state.result()
    except TransientError:
        return True
    except BaseException:  # noqa: BLE001 - every other failure is final
        return False
    return False


class ExpectedFailureTraceback(logging.Filter):
    """Prefect's engine re-raises the data of a deployment run's Failed state when the run ends, and logs
    it with its traceback ("Engine execution exited with unexpected exception"). For a FlowFailure, an
    expected end whose reason is already the run's state message and last line, that record is dropped:
    no traceback in the run's logs, in `--watch` or in the worker's log. Other exceptions keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, FlowFailure)


logging.getLogger("prefect.flow_runs").addFilter(ExpectedFailureTraceback())
route_to_prefect()


@dataclass(frozen=True)
class Handed:
    """What a run's process hands its flow: its settings, and the plans it made (None: the flow plans)."""

    settings: Settings
    plans: RunPlans | None = None


# A context variable, not a flow parameter: the one parameter stays the run config Prefect's form is
# generated from, and settings hold secrets no parameter may carry (the API stores parameters). Prefect
# copies the context into the flow and its task threads; a Dask worker or a compile-one run is another
# process, and loads its own.
HANDED: ContextVar[Handed | None] = ContextVar("fusedspec_handed", default=None)


@contextmanager
def handing(handed: Handed) -> Iterator[None]:
    """Runs of compile-fused started in this block get `handed` instead of planning and loading settings."""
    token = HANDED.set(handed)
    try:
        yield
    finally:
        HANDED.reset(token)


def run_settings() -> Settings:
    """The settings of the run this task belongs to; loaded here in a process nothing handed them to."""
    handed = HANDED.get()
    return handed.settings if handed is not None else load_settings()


@task(name="plan", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS), retry_delay_seconds=RETRY_DELAYS,
      retry_condition_fn=transient_failure)
def plan_task(config: RunConfig | dict[str, Any]) -> RunPlans | RunStopped:
    """The plans (one per draft), or why there are none (an expected failure, not a crash with a traceback).
    A deployment run's `config` arrives as JSON and is read here, by the rules and in the words of `fusedspec
    plan`."""
    try:
        checked = config if isinstance(config, RunConfig) else run_config_from_dict(config, source="config")
        return plan_drafts(checked, run_settings())
    except TransientError:
        raise  # tried again; the last try's error is the run's reason (compile_fused)
    except FusedspecError as exc:
        return RunStopped.of("plan", exc)


@task(name="tokenizer-gate", cache_policy=NO_CACHE)
def tokenizer_gate_task(plans: RunPlans) -> RunStopped | None:
    """None when the target and every draft tokenize identically, else the gate's verdict."""
    try:
        check_draft_tokenizers(plans, by_name=plans.several())
    except FusedspecError as exc:
        return RunStopped.of("tokenizer-gate", exc)
    return None


@task(name="advise-matrix", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS),
      retry_delay_seconds=RETRY_DELAYS, retry_condition_fn=transient_failure)
def matrix_advice_task(plans: RunPlans) -> MatrixLimit | RunStopped:
    """What matrix.top_per_class keeps, from each draft's k advice before compiling, or why there is none."""
    try:
        limit = matrix_limit(plans, run_settings(), compute=True)
    except TransientError:
        raise  # tried again, as the plan is
    except FusedspecError as exc:
        return RunStopped.of("advise-matrix", exc)
    assert limit is not None, "called for a run config with matrix.top_per_class"
    return limit


@task(name="build", task_run_name="build {planned.label}", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS),
      retry_delay_seconds=RETRY_DELAYS, retry_condition_fn=transient_failure)
def build_task(plan: RunPlan, planned: PlannedBuild) -> ConfigOutcome:
    """One build, with the settings of the process it runs in (no secret crosses into a parameter)."""
    with run_logs(get_run_logger(), label=planned.label):
        return process_build(plan, planned, run_settings())


@task(name="compile-one", task_run_name="compile-one {planned.label}", cache_policy=NO_CACHE)
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
    return ConfigOutcome.of(plan, planned, "failed", failed_stage="worker",
                            reason=f"compile-one run {run.name} ended "
                                   f"{state.type.value if state else 'unknown'}: {message}")


@flow(name="build-matrix-dask", validate_parameters=False)
def dask_builds(plans: RunPlans, progress_id: Any) -> list[ConfigOutcome]:
    """The builds on a Dask cluster (this subflow's task runner); progress goes to the parent's artifact.
    No Settings parameter: a subflow's parameters are stored by the API, and settings hold secrets; each
    build reads its worker's own (a LocalCluster's workers inherit this process's environment)."""
    futures = {build_task.submit(plan, planned): (plan, planned) for plan, planned in plans.builds}
    return _gather(futures, RunProgress.attach(progress_id, len(plans.builds)))


def _dask_runner(plans: RunPlans) -> Any:
    from prefect_dask import DaskTaskRunner

    fan_out = plans.config.fan_out
    if fan_out.dask_address:
        return DaskTaskRunner(address=fan_out.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": fan_out.max_workers, "threads_per_worker": 1,
                                          "processes": True})


Submitted = dict[PrefectFuture[ConfigOutcome], tuple[RunPlan, PlannedBuild]]


def _gather(futures: Submitted, progress: RunProgress) -> list[ConfigOutcome]:
    """Every build's outcome, in the plans' order; the progress advances as each finishes."""
    done: dict[str, ConfigOutcome] = {}
    for future in as_completed(list(futures)):
        plan, planned = futures[future]
        result = future.result(raise_on_failure=False)  # the task's own result, in memory (not persisted)
        outcome = outcome_of(result, future.state.message, plan, planned)
        done[planned.key] = outcome
        progress.advance(f"{planned.label}: {outcome.status}")
    return [done[planned.key] for _, planned in futures.values()]


def outcome_of(result: Any, message: str | None, plan: RunPlan, planned: PlannedBuild) -> ConfigOutcome:
    """A finished build task's outcome. A build whose last try still met a TransientError (or that crashed)
    is a failed outcome naming the stage and the reason, like any other failed build."""
    if isinstance(result, ConfigOutcome):
        return result
    error = result if isinstance(result, BaseException) else None
    stage = getattr(error, "failed_stage", None) or "worker"
    reason = (f"{error} (tried {len(RETRY_DELAYS) + 1} times)" if isinstance(error, TransientError)
              else f"unexpected {type(error).__name__}: {error}" if error is not None else f"{message}")
    return ConfigOutcome.of(plan, planned, "failed", failed_stage=stage, reason=reason)


@contextmanager
def build_slots(limit: int) -> Iterator[str]:
    """A tag whose task runs Prefect runs at most `limit` at once (a concurrency limit on the tag, this run's
    own, removed at the end): a build waiting for its slot shows as Pending, not Running."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    tag = f"fusedspec-builds-{flow_run.id}"
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=tag, concurrency_limit=limit)
    try:
        yield tag
    finally:
        with get_client(sync_client=True) as client:
            client.delete_concurrency_limit_by_tag(tag)


# validate_parameters=False: the plan task reads the parameter, so a rule the schema could not enforce when
# the run was created (k below seq_len, the neuron section against the matrix) ends the run Failed in its
# plan with plan's words, not in Prefect's parameter check with a traceback. The schema comes from the type.
@flow(name="compile-fused", flow_run_name=run_name, log_prints=True, persist_result=True,
      validate_parameters=False, task_runner=cast(Any, ThreadPoolTaskRunner(max_workers=MAX_PARALLEL)))
def compile_fused(config: RunConfig) -> RunSummary | State[Any]:
    """Compile, validate and publish every build of `config` that is not published yet.

    Args:
        config: The run config: target and draft, the matrix of builds, validation, where to publish.
    """
    handed = HANDED.get()
    if handed is None:  # a deployment run: this flow run is its process's entry point
        with handing(Handed(settings=load_settings())):
            return _compile_fused(config, None)
    return _compile_fused(config, handed.plans if handed.plans is not None and handed.plans.config == config
                          else None)


def _compile_fused(config: RunConfig, plans_made: RunPlans | None) -> RunSummary | State[Any]:
    logger = get_run_logger()
    if plans_made is not None:
        found: Any = plans_made
    else:
        found = plan_task(config, return_state=True).result(raise_on_failure=False)
    plans = found if not isinstance(found, TransientError) else RunStopped.of("plan", found)
    if not isinstance(plans, RunPlans | RunStopped):
        raise plans  # an unexpected error of the plan: a crash, with its traceback
    if isinstance(plans, RunStopped):
        logger.error("the run config cannot run: %s", plans.one_line())
        return Failed(message=plans.one_line(), data=FlowFailure(plans.one_line(), plans))
    refused = tokenizer_gate_task(plans)
    if refused is not None:
        logger.error("%s", refused.one_line())
        return Failed(message=refused.one_line(), data=FlowFailure(refused.one_line(), refused))
    limit = None
    if plans.config.matrix.top_per_class is not None:
        advised = matrix_advice_task(plans, return_state=True).result(raise_on_failure=False)
        advised = RunStopped.of("advise-matrix", advised) if isinstance(advised, TransientError) else advised
        if isinstance(advised, RunStopped):
            logger.error("the k advice before compiling did not run: %s", advised.one_line())
            return Failed(message=advised.one_line(), data=FlowFailure(advised.one_line(), advised))
        if not isinstance(advised, MatrixLimit):
            raise advised  # an unexpected error of the advice: a crash, with its traceback
        limit = advised
        logger.info("%s", "\n".join(limit_lines(limit, several=plans.several())))
        plans = limited(plans, limit)
    logger.info("plan: %d build(s) of %s + %s, publishing to %s", len(plans.builds), plans.config.target,
                " and ".join(plans.config.drafts), plans.publish_uri)
    progress = RunProgress.create(plans)
    mode = plans.config.fan_out.mode
    if mode == "dask":
        outcomes = dask_builds.with_options(task_runner=_dask_runner(plans))(plans, progress.artifact_id)
    elif mode == "deployment":
        outcomes = _gather({deployment_task.submit(plan, planned): (plan, planned)
                            for plan, planned in plans.builds}, progress)
    else:
        with build_slots(plans.config.fan_out.max_workers) as tag:
            builds = build_task.with_options(tags=[tag])
            outcomes = _gather({builds.submit(plan, planned): (plan, planned)
                                for plan, planned in plans.builds}, progress)
    summary = summarize(plans, outcomes, limit)
    publish_run_artifacts(plans, summary)
    logger.info("%s", summary.details())
    if summary.counts.failed:  # the outcome line is the last log line and, of a failed run, its state message
        logger.error("%s", summary.outcome_line())
        return Failed(message=summary.outcome_line(), data=FlowFailure(summary.outcome_line(), summary))
    logger.info("%s", summary.outcome_line())
    return summary
