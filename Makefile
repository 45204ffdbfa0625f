# rlinf-nb: `make lab` (the main job) and `make test` (the suite). See README.md.
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.setup-stamp

.PHONY: setup lab test test-slow bench lint cluster-up cluster-down

# Reinstall only when the lock or the setup scripts change (idempotent; reuses uv's cache).
$(STAMP): uv.lock pyproject.toml scripts/setup.sh scripts/setup_system.sh scripts/selfcheck.py
	bash scripts/setup.sh

setup:
	bash scripts/setup.sh

lab: $(STAMP)
	$(PY) -m rlinf_nb.cli lab

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) bench/run_all.py

lint: $(STAMP)
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

cluster-up: $(STAMP)
	$(PY) -m rlinf_nb.cli cluster up

cluster-down: $(STAMP)
	$(PY) -m rlinf_nb.cli cluster down
