# `make test` and `make demo` set up everything they need on a fresh machine: a virtual environment
# with the project and its CPU stack, caches and temp files under .work/ (ignored by git). The tests
# start the real servers they need (SeaweedFS S3, a local Hub endpoint, a Prefect server) and stop them.
SHELL := /bin/bash
VENV ?= .venv
WORK ?= $(CURDIR)/.work
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
# What the venv's Python must be: 3.11 with ensurepip (to make the venv), sqlite3 (Prefect) and ssl (pip).
# Exits 0 when it is, else with what it lacks.
PY_CHECK := import sys, importlib.util as u; version = "%d.%d" % sys.version_info[:2]; \
	lacks = " and ".join(m for m in ("ensurepip", "sqlite3", "ssl") if u.find_spec(m) is None); \
	sys.exit(0 if version == "3.11" and not lacks else f"{sys.executable} is Python {version}" \
	+ (f" without {lacks}" if lacks else "") + "; fusedspec needs 3.11 with ensurepip, sqlite3 and ssl")
# The first such Python of: the system's own /usr/bin/python3.11, then python3.11 and python3 on PATH (a
# pyenv shim without 3.11 does not run). The system's first: Debian's links the interpreter into the binary
# with PGO, where pyenv's default build (first on PATH on the CI host) loads it from libpython, and the tests
# took 7% less CPU on Debian's (bench/RESULTS.md). `make PYTHON=/path/to/python3.11` to choose.
PYTHON ?= $(firstword $(foreach candidate,/usr/bin/python3.11 python3.11 python3,$(shell $(candidate) -c \
	'$(PY_CHECK)' 2>/dev/null && $(candidate) -c 'import sys; print(sys.executable)' 2>/dev/null)))
# torch's CPU wheels. PyPI's torch for Linux is the multi-GB CUDA build, so torch comes from here when
# this index answers within TORCH_INDEX_PROBE_SECONDS; where it does not (a machine reaching only PyPI
# mirrors, with a CPU wheel among pip's find-links), the install goes on at once from what pip finds.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_PROBE_SECONDS ?= 2
# Exit 0 when URL answers 200 within SECONDS, name lookup included (a thread, so a slow resolver cannot
# hold the install up either).
PROBE := import sys, threading, urllib.request as u; answer = []; \
	t = threading.Thread(target=lambda: answer.append(u.urlopen(sys.argv[1], timeout=float(sys.argv[2])).status), \
	daemon=True); t.start(); t.join(float(sys.argv[2])); sys.exit(answer != [200])
TORCH := $(shell sed -n 's/.*"\(torch==[^"]*\)".*/\1/p' pyproject.toml | head -n 1)

export FUSEDSPEC_WORK_DIR := $(WORK)
export TMPDIR := $(WORK)/tmp
export HF_HOME := $(WORK)/hf-home
export TORCHINDUCTOR_CACHE_DIR := $(WORK)/inductor-cache
export PREFECT_HOME := $(WORK)/prefect-home
export MPLCONFIGDIR := $(WORK)/mpl
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install test test-fast lint demo clean

# pytest-xdist workers for `make test`: 3 on the 2-core CI host, where many tests wait on servers and a third
# worker fills the gaps (tests/conftest.py); `make test TEST_WORKERS=8` on a bigger machine.
TEST_WORKERS ?= 3
# One torch (OpenMP) thread per test process: the workers already keep every core busy, and threads of one
# process spinning while they wait for each other took a tenth of the CPU the others needed (bench/RESULTS.md).
TEST_THREADS ?= 1

$(PY):
	@py='$(PYTHON)'; \
	if [ -z "$$py" ]; then \
	  echo "fusedspec needs Python 3.11 with ensurepip, sqlite3 and ssl, and none of /usr/bin/python3.11," \
	       "python3.11, python3 here is one. Install it (Debian/Ubuntu: apt install python3.11" \
	       "python3.11-venv; macOS: brew install python@3.11; anywhere: pyenv install 3.11)," \
	       "or name one: make PYTHON=/path/to/python3.11" >&2; exit 1; fi; \
	"$$py" -c '$(PY_CHECK)' && echo "$$py -m venv $(VENV)" && \
	{ "$$py" -m venv $(VENV) || { rm -rf $(VENV); exit 1; }; }

$(STAMP): pyproject.toml | $(PY)
	@mkdir -p $(WORK)/tmp
	$(PY) -m pip install -q --upgrade pip
	@if $(PY) -c '$(PROBE)' $(TORCH_INDEX)/torch/ $(TORCH_INDEX_PROBE_SECONDS) 2>/dev/null; then \
	  echo "$(PY) -m pip install -q --index-url $(TORCH_INDEX) '$(TORCH)'"; \
	  $(PY) -m pip install -q --index-url $(TORCH_INDEX) '$(TORCH)'; \
	else \
	  echo "$(TORCH_INDEX) did not answer in $(TORCH_INDEX_PROBE_SECONDS) s: $(TORCH) comes from pip's own indexes"; \
	fi
	$(PY) -m pip install -q -e '.[cpu,dev]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

test: install
	@mkdir -p $(WORK)/tmp
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=25

test-fast: install
	@mkdir -p $(WORK)/tmp
	$(PY) -m pytest -q -m "not slow"

# mypy follows `fusedspec.*` imports only through files laid out as that package (the editable install's
# import hook is invisible to it: every fusedspec import would be Any), so it checks a tree of links.
MYPY_TREE := $(WORK)/mypy-tree
LINK_TREE := import pathlib, sys; out = pathlib.Path(sys.argv[1]) / "fusedspec"; \
	[(out / f).parent.mkdir(parents=True, exist_ok=True) or (out / f).symlink_to(f.resolve()) \
	 for d in sys.argv[2:] for f in pathlib.Path(d).rglob("*.py")]

lint: install
	$(VENV)/bin/ruff check core compile validate registry demo serve flows tests bench
	@rm -rf $(MYPY_TREE) && $(PY) -c '$(LINK_TREE)' $(MYPY_TREE) core compile validate registry demo serve flows
	cd $(MYPY_TREE) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(WORK)/mypy-cache \
	  --explicit-package-bases -p fusedspec

demo: install
	@mkdir -p $(WORK)/tmp
	$(VENV)/bin/fusedspec demo

clean:
	rm -rf $(WORK)/builds $(WORK)/tmp
