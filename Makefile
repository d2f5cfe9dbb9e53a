# One-command set-up: every target bootstraps the virtual environment if it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow bench bench-quick list clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel on local disk (see pyproject.toml).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,peers]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) -m bench run --suite micro

bench-quick: $(STAMP)
	$(PY) -m bench run --suite quick

list: $(STAMP)
	$(PY) -m bench list

clean:
	rm -rf $(VENV) build *.egg-info
