"""The `compile-one` flow: one build of a plan, for fan-out over a work pool (one pod per compile in
production). The parent compile-fused run hands over its plan (models pinned and hashed, prompts loaded,
store resolved) and the build's content key, so the worker plans nothing again; the build is the same
task as in local fan-out (retried on a transient failure only); the outcome is the flow's (persisted)
result, which the parent gathers. A worker whose own settings differ (another work
dir, another host) still downloads by the plan's commits and hashes, so it builds the same key."""

from __future__ import annotations

from prefect import flow, get_run_logger

from fusedspec.flows.compile_fused import build_task, outcome_of
from fusedspec.flows.pipeline import ConfigOutcome
from fusedspec.flows.planning import RunPlan


@flow(name="compile-one", flow_run_name="compile-one {key:.12}", persist_result=True, log_prints=True)
def compile_one(plan: RunPlan, key: str) -> ConfigOutcome:
    planned = plan.build(key)
    state = build_task(plan, planned, return_state=True)
    outcome = outcome_of(state.result(raise_on_failure=False), state.message, plan, planned)
    get_run_logger().info("%s: %s%s", planned.label, outcome.status,
                          f" ({outcome.failed_stage}: {outcome.reason})" if outcome.failed_stage else "")
    return outcome
