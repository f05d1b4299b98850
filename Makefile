VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck test test-browser chromium demo bench clean

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
	$(VENV)/bin/pytest --ignore=tests/browser

# The dashboard in Debian's chromium, headless, driven by Playwright (no browser download).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

test-browser: $(STAMP) chromium
	$(VENV)/bin/pytest tests/browser

demo: $(STAMP)
	$(VENV)/bin/harness demo

bench: $(STAMP)
	$(PY) benchmarks/assembly.py
	$(PY) benchmarks/loop_overhead.py
	$(PY) benchmarks/provider_stream.py

clean:
	rm -rf $(VENV) .harness .pytest_cache .mypy_cache .ruff_cache
