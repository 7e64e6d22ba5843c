# fastembed (PyPI), a peer of `ragcache bench compute`, in its own virtual environment: it pins
# huggingface_hub 1.x, which the shared venv (huggingface_hub 2) cannot take. It needs no torch. The bench
# gives it the packaged model's tokenizer and the ONNX file ragcache exported, so it runs offline.
FASTEMBED_VENV := .venv-fastembed
FASTEMBED_PY := $(FASTEMBED_VENV)/bin/python
FASTEMBED_STAMP := $(FASTEMBED_VENV)/.installed
FASTEMBED_VERSION := 0.9.1
export RAGCACHE_FASTEMBED_PYTHON := $(abspath $(FASTEMBED_PY))

.PHONY: fastembed-env bench-compute

$(FASTEMBED_STAMP): constraints.txt mk/fastembed.mk
	test -x $(FASTEMBED_PY) || $(PYTHON) -m venv $(FASTEMBED_VENV)
	$(FASTEMBED_PY) -m pip install -q -c constraints.txt "fastembed==$(FASTEMBED_VERSION)"
	touch $@

fastembed-env: $(FASTEMBED_STAMP)

# torch, ONNX and ONNX-int8 against fastembed and Infinity (docs/benchmarks.md).
bench-compute: $(STAMP) $(INFINITY_STAMP) $(INFINITY_ONNX_STAMP) $(FASTEMBED_STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/ragcache bench compute --quick --out bench-results
