VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck test demo bench bench-parallel bench-peers clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check actors supervision tests benchmarks
	$(VENV)/bin/ruff format --check actors supervision tests benchmarks
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest

demo: $(STAMP)
	$(VENV)/bin/harness demo

bench: $(STAMP)
	$(PY) benchmarks/assembly.py
	$(PY) benchmarks/loop_overhead.py
	$(PY) benchmarks/provider_stream.py

bench-parallel: $(STAMP)
	$(PY) benchmarks/parallel_sessions.py

# Harness and the peer frameworks (each installed in its own virtualenv on first use), interleaved.
bench-peers: $(STAMP)
	$(PY) benchmarks/peers/run.py

clean:
	rm -rf $(VENV) .harness .pytest_cache .mypy_cache .ruff_cache benchmarks/peers/.venvs
