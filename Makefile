# `make demo` and `make test` work on a fresh clone: they create .venv, install torch first (the CPU wheel
# named by TORCH), then the project with every extra, then run.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ember-installed

.PHONY: setup demo test bench lint docs clean

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

# Two pytest workers (pytest-xdist), each taking whole files (module fixtures such as the Ray cluster are shared
# within a file): on 2 cores the one-process tests run side by side, and the multi-process ones overlap the rest.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n 2 --dist loadfile --doctest-modules tests engine trackers trainer callbacks

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# The documentation site, into site/: the pictures first (from real runs, into build/docs/), then a strict build
# (a broken link, a missing API reference or a docstring that does not render fails it).
docs: $(STAMP)
	$(PY) docs/gen/figures.py build/docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(PY) -m ruff check engine trainer callbacks trackers tests
	$(PY) -m mypy engine trainer callbacks trackers

clean:
	rm -rf $(VENV) runs site build/docs
