"""Prefect flows and the `fusedspec` command line: orchestration only, no domain logic.

Importing this package readies the process for fusedspec's work: every process that runs it imports it
first (the CLI, a Prefect flow run of prefect.yaml's entrypoints, a dask worker unpickling a build task)."""

from fusedspec.core.memory import tune_collector
from fusedspec.core.settings import export_prefect_settings

export_prefect_settings()  # before anything here imports Prefect: it reads its logging settings at import
tune_collector()
