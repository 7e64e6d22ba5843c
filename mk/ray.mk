# The Ray path (issue 23, docs/ray.md): the `ray` extra installed into the project's venv, and the tests in
# tests/ray that start a real two-node Ray cluster (`ray start --head`, `ray start --address`, one process each)
# beside a real Redis and a real Milvus server. Measured on the 2-core development machine: the extra installs
# in ~15 s; the suite (6 tests, 7 pipelines whose actors each load the model) took 1.9 min (5 tests) at a load average
# of 6-10 and 3.8-4.1 min at 8-18 (other suites running beside it).
RAY_STAMP := $(VENV)/.ray-installed

.PHONY: ray-env test-ray

# Through the project's own extra, so its pin (ray[data]==2.60.0) has one home: pyproject.toml.
$(RAY_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e '.[ray]'
	touch $@

ray-env: $(RAY_STAMP)

test-ray: $(RAY_STAMP)
	$(PY) -m pytest -m ray tests/ray $(PYTEST_ARGS)
