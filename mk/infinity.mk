# The provider tests' real upstream: Infinity (infinity-emb, PyPI), an independent OpenAI-compatible
# embedding server, in its own virtual environment. The tests start it on a free loopback port from the
# packaged all-MiniLM-L6-v2 folder, offline (tests/models/conftest.py); RAGCACHE_INFINITY_PYTHON tells
# them where it is, and under CI a missing one fails the run instead of skipping the provider tests.
# torch first (the CPU wheel on local disk), then Infinity constrained to it.
INFINITY_VENV := .venv-infinity
INFINITY_PY := $(INFINITY_VENV)/bin/python
INFINITY_STAMP := $(INFINITY_VENV)/.installed
INFINITY_VERSION := 0.0.78
export RAGCACHE_INFINITY_PYTHON := $(abspath $(INFINITY_PY))

.PHONY: infinity-env

$(INFINITY_STAMP): constraints.txt mk/infinity.mk
	test -x $(INFINITY_PY) || $(PYTHON) -m venv $(INFINITY_VENV)
	$(INFINITY_PY) -m pip install -q --upgrade pip
	$(INFINITY_PY) -m pip install -q torch==2.13.0
	$(INFINITY_PY) -m pip install -q -c constraints.txt "infinity-emb[server,torch]==$(INFINITY_VERSION)"
	touch $@

infinity-env: $(INFINITY_STAMP)

# ragcache in front of Infinity vs Infinity alone (docs/benchmarks.md); RAGCACHE_INFINITY_PYTHON is exported above.
.PHONY: bench-providers
bench-providers: $(STAMP) $(INFINITY_STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/ragcache bench providers --quick --out bench-results
