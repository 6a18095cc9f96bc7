# Two commands do all set-up on a fresh machine with Python >= 3.11 and make:
#   make figures   -- venv + install + default experiments + figures/
#   make test      -- venv + install + the test suite (CPU, < 10 min on 2 cores)
# make bench runs the throughput benchmarks (GPU if one is visible).
# make traces downloads the public request traces into the user data folder (see README, Traces);
# without them the trace figures and tests are skipped with a line saying so.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Monte Carlo streams per figure point; raise on a GPU, e.g. make figures STREAMS=8192
STREAMS ?= 256

.PHONY: figures test test-slow check-figures bench traces install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

figures: $(STAMP)
	$(PY) -m experiments --streams $(STREAMS) --out figures

# two worker processes: the suite is mostly XLA compilation, one core each (pytest-xdist, see README);
# the tests marked slow (the tuning problems' runs and landscapes, the two largest families' batch-protocol checks,
# the every-system walk, the four-device sweep, the plane store's statistics, the figure smoke runs: make test
# holds the figures by experiments --check instead) need
# make test-slow: CI's make test must stay under 10 minutes on 2 cores. pyproject.toml's addopts schedule whole
# test modules on the workers (--dist loadscope), in file order
# The two workers share one JAX compilation cache made for the run and removed after it (a program one
# worker compiled, the other loads; see BENCHMARKS.md, make test, for what it saves)
test: $(STAMP)
	cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && JAX_COMPILATION_CACHE_DIR="$$cache" \
	  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 \
	  $(PY) -m pytest -n 2 -m "not slow"
	$(PY) -m experiments --check

# are the committed figure tables those the current code makes? (seconds: computes nothing; names each stale one)
check-figures: $(STAMP)
	$(PY) -m experiments --check --streams $(STREAMS) --out figures

test-slow: $(STAMP)
	$(PY) -m pytest -n 2 -m slow

traces: $(STAMP)
	$(PY) -m hbfjax traces fetch

bench: $(STAMP)
	$(PY) -m hbfjax.bench

clean:
	rm -rf $(VENV) .pytest_cache
