# `make test` and `make demo` set up everything they need on a fresh machine: a virtual environment
# with the project and its CPU stack, caches and temp files under .work/ (ignored by git). The tests
# start the real servers they need (SeaweedFS S3, a local Hub endpoint, a Prefect server) and stop them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
WORK ?= $(CURDIR)/.work
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

export FUSEDSPEC_WORK_DIR := $(WORK)
export TMPDIR := $(WORK)/tmp
export HF_HOME := $(WORK)/hf-home
export TORCHINDUCTOR_CACHE_DIR := $(WORK)/inductor-cache
export PREFECT_HOME := $(WORK)/prefect-home
export MPLCONFIGDIR := $(WORK)/mpl
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install test test-fast lint demo clean

$(STAMP): pyproject.toml
	@mkdir -p $(WORK)/tmp
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,dev]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

test: install
	@mkdir -p $(WORK)/tmp
	$(PY) -m pytest -q --durations=15

test-fast: install
	@mkdir -p $(WORK)/tmp
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check compile validate registry flows tests bench
	$(VENV)/bin/mypy compile validate registry flows

demo: install
	@mkdir -p $(WORK)/tmp
	$(VENV)/bin/fusedspec demo

clean:
	rm -rf $(WORK)/builds $(WORK)/tmp
