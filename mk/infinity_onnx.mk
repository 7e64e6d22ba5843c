# Infinity's optimum (ONNX Runtime) engine, a peer of `ragcache bench compute`, in a venv of its own:
# infinity-emb[optimum] brings optimum 2.1 + optimum-onnx, which the shared venv cannot take (optimum-onnx
# would downgrade transformers 5 to 4.57) and which the provider tests' Infinity venv does not need.
INFINITY_ONNX_VENV := .venv-infinity-onnx
INFINITY_ONNX_PY := $(INFINITY_ONNX_VENV)/bin/python
INFINITY_ONNX_STAMP := $(INFINITY_ONNX_VENV)/.installed
export RAGCACHE_INFINITY_ONNX_PYTHON := $(abspath $(INFINITY_ONNX_PY))

.PHONY: infinity-onnx-env

$(INFINITY_ONNX_STAMP): constraints.txt mk/infinity_onnx.mk
	test -x $(INFINITY_ONNX_PY) || $(PYTHON) -m venv $(INFINITY_ONNX_VENV)
	$(INFINITY_ONNX_PY) -m pip install -q torch==2.13.0
	$(INFINITY_ONNX_PY) -m pip install -q -c constraints.txt "infinity-emb[server,torch,optimum]==$(INFINITY_VERSION)"
	touch $@

infinity-onnx-env: $(INFINITY_ONNX_STAMP)
