"""Prefect flows and the `fusedspec` command line: orchestration only, no domain logic."""

from fusedspec.core.settings import export_prefect_settings

export_prefect_settings()  # before anything here imports Prefect: it reads its logging settings at import
