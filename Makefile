# `make demo` and `make test` work on a fresh clone: they create .venv, install torch first (the CPU wheel
# named by TORCH), then the project with every extra, then run.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ember-installed

.PHONY: setup demo test bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) examples/digits.py

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules tests engine trackers trainer callbacks

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PY) -m ruff check engine trainer callbacks trackers tests

clean:
	rm -rf $(VENV) runs
