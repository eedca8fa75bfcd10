"""Prefect flows and the `fusedspec` command line: orchestration only, no domain logic."""
