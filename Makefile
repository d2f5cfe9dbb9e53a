# One-command set-up: every target bootstraps the virtual environment if it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow bench bench-quick bench-pytest list plots report clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel on local disk (see pyproject.toml).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,peers,atari,ray,multiagent,sb3,tianshou,torchrl]'
	touch $(STAMP)

# numba's on-disk caches (cache=True) are not refreshed when a kernel they call changes in
# another file, so old code could run after an edit or a merge: drop them whenever a source
# under impl/, bench/ or adapters/ (their kernels call impl/'s) is newer than the last drop (the
# first run after that compiles again).
KERNEL_DIRS := impl bench adapters
NUMBA_STAMP := $(VENV)/.numba-caches-dropped
$(NUMBA_STAMP): $(shell find $(KERNEL_DIRS) -name '*.py') | $(STAMP)
	find $(KERNEL_DIRS) \( -name '*.nbi' -o -name '*.nbc' \) -delete
	touch $@

# Two pytest workers (pytest-xdist): a cold run is mostly numba compiling in one process while
# the other core waits; two workers take about 7 minutes on 2 cores where one took 12.
test: $(STAMP) $(NUMBA_STAMP)
	$(PY) -m pytest -q -n 2

test-slow: $(STAMP) $(NUMBA_STAMP)
	$(PY) -m pytest -q -m slow

# `make bench` runs the composite suite bench/suites/default.json (today: micro with the peers, threads, cache-model);
# to add a suite to it (e.g. the cache-miss meters), add its name to that file's "suites" list.
bench: $(STAMP) $(NUMBA_STAMP)
	$(VENV)/bin/replaybench run --suite default

bench-quick: $(STAMP) $(NUMBA_STAMP)
	$(VENV)/bin/replaybench run --suite micro-quick

# Quick per-op regression check of every registered variant with pytest-benchmark (not part of
# `make test`): add ARGS=--benchmark-autosave to store a run, ARGS=--benchmark-compare to compare.
bench-pytest: $(STAMP)
	$(PY) -m pytest -q bench/pytest_suite -m "" --benchmark-only --benchmark-max-time=0.2 --benchmark-columns=min,median,max,ops,rounds $(ARGS)

list: $(STAMP)
	$(VENV)/bin/replaybench list

# Figures (PNG, SVG and the CSV behind each) into analysis/figures/<host>/ from the stored runs,
# without running anything: every run under results/, or RUNS="results/<id> ..." (folders or run
# ids). `make report` draws the same figures, then writes analysis/REPORT.md (the findings) and
# one page per host, analysis/report/<host>.md. Both are byte for byte the same when the runs are
# (tests/test_analysis_determinism.py).
plots: $(STAMP)
	$(PY) -m replaybench.analysis plots $(if $(RUNS),--runs $(RUNS))

report: $(STAMP)
	$(PY) -m replaybench.analysis report $(if $(RUNS),--runs $(RUNS))

clean:
	rm -rf $(VENV) build *.egg-info
