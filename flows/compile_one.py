"""The `compile-one` flow: one build of a run config, for fan-out over a work pool (one pod per compile
in production). The parent compile-fused run passes a pinned config and the build's content key; the
outcome is the flow's (persisted) result, which the parent gathers."""

from __future__ import annotations

from typing import Any

from prefect import flow

from compile.runconfig import RunConfig
from compile.settings import load_settings
from flows.pipeline import injected_fault, process_build
from flows.planning import plan_run


@flow(name="compile-one", persist_result=True, log_prints=True)
def compile_one(config: RunConfig, key: str) -> dict[str, Any]:
    settings = load_settings()
    plan = plan_run(config, settings)
    planned = plan.build(key)
    return process_build(plan, planned, settings, fault=injected_fault(settings, planned)).to_json()
