# Two commands on a fresh machine: `make test` and `make demo`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CIFAR10_DIR ?=
DEMO_DIR ?= demo_output
PYTEST_ARGS ?=

.PHONY: venv test demo bazel-test clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) tests

demo: $(STAMP)
	$(PY) -m trainers.demo --output_dir=$(DEMO_DIR) $(if $(CIFAR10_DIR),--data_dir=$(CIFAR10_DIR))

bazel-test: $(STAMP)
	bash tools/bazel_test.sh

clean:
	rm -rf $(VENV) $(DEMO_DIR) bazel-* *.egg-info
