VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck test demo bench clean postgres-server

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

# PostgreSQL's server binaries for the PostgresStore tests, from Debian when missing.
# The tests start and stop their own server; they skip (saying why) only without binaries.
postgres-server:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } || \
		echo "warning: could not install postgresql; the PostgresStore tests will be skipped" >&2

test: lint postgres-server
	$(VENV)/bin/pytest

demo: $(STAMP)
	$(VENV)/bin/harness demo

bench: $(STAMP)
	$(PY) benchmarks/assembly.py
	$(PY) benchmarks/loop_overhead.py
	$(PY) benchmarks/provider_stream.py

clean:
	rm -rf $(VENV) .harness .pytest_cache .mypy_cache .ruff_cache
