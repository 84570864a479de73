# Two commands on a fresh machine: `make test` and `make demo`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CIFAR10_DIR ?=
DEMO_DIR ?= demo_output
PYTEST_ARGS ?= -n 2 --dist=worksteal

.PHONY: venv test test-fast test-all test-kernels test-backends demo bazel-test check-install clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,all,benchmarks,openvino,test]'
	# TensorFlow Serving's protos (the export's warm-up records): its wheel asks for the full
	# `tensorflow`, which tensorflow-cpu already is.
	$(PY) -m pip install --quiet --no-deps tensorflow-serving-api==$$(sed -n 's/^TENSORFLOW_VERSION = "\(.*\)"/\1/p' setup.py)
	touch $(STAMP)

# The tiers (tests/tiers.py): `make test` is the README's and CI's; `make test-fast` has no slow
# (end-to-end) test and no paper-size model; `make test-all` has every preset at paper size and runs
# everything under both of TensorFlow's kernel sets (oneDNN on, then off).
# Run `make test-all` after changing export/, sa_conv/serving.py, sa_conv/encodings/ or a fixture.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) tests

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) --fast tests

test-all: $(STAMP)
	TF_ENABLE_ONEDNN_OPTS=1 $(PY) -m pytest $(PYTEST_ARGS) --all tests
	TF_ENABLE_ONEDNN_OPTS=0 $(PY) -m pytest $(PYTEST_ARGS) --all tests
	$(MAKE) test-backends BACKENDS_TIER=--all BACKENDS_XLA_FLAGS=
# The kernel-sensitive files (tests/tiers.py) on their fast tier under TensorFlow's own kernels
# (oneDNN off): CI runs `make test` with oneDNN, so each kernel set holds them.
test-kernels: $(STAMP)
	files="$$($(PY) -m tests.tiers)" && test -n "$$files" && \
		TF_ENABLE_ONEDNN_OPTS=0 $(PY) -m pytest $(PYTEST_ARGS) --fast $$files

# The backend-independent tests (layers, models, Theorem 1, the separable path, save and
# reload) under Keras's JAX and PyTorch backends, in a second virtualenv without TensorFlow.
BACKENDS_VENV := .venv-backends
BPY := $(BACKENDS_VENV)/bin/python
BSTAMP := $(BACKENDS_VENV)/.installed
BACKEND_TESTS := tests/test_layers.py tests/test_models.py tests/test_conversion.py \
	tests/test_fast_attention.py tests/test_keras_native.py tests/test_install.py \
	tests/test_separable.py tests/test_benchmarks.py tests/test_attention_init.py tests/test_gated.py \
	tests/test_reference_torch.py

$(BSTAMP): setup.py
	test -x $(BPY) || $(PYTHON) -m venv $(BACKENDS_VENV)
	$(BPY) -m pip install --quiet --upgrade pip
	$(BPY) -m pip install --quiet torch==2.13.0 jax -e '.[test]'
	touch $(BSTAMP)

# The fast tier in CI; `make test-all` runs every tier.
BACKENDS_TIER ?= --fast
# Compiling is most of the JAX pass's time, and these tests check what the layers compute, not
# the code XLA generates: the fast tier compiles without LLVM's optimizations. `make test-all`
# passes none, so every tier also runs with XLA's defaults, as users do. (PyTorch ignores them;
# `echo` drops the spaces around them: XLA reads a value not starting with "--" as a file name.)
BACKENDS_XLA_FLAGS ?= --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true
test-backends: $(BSTAMP)
	status=0; for backend in jax torch; do \
		KERAS_BACKEND=$$backend XLA_FLAGS="$$(echo $(BACKENDS_XLA_FLAGS) $$XLA_FLAGS)" $(BPY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) $(BACKENDS_TIER) $(BACKEND_TESTS) || status=1; \
	done; exit $$status

# DEMO_ARGS: more of programs.demo's flags (e.g. --dataset=synthetic, without CIFAR-10).
DEMO_ARGS ?=
demo: $(STAMP)
	$(PY) -m programs.demo --output_dir=$(DEMO_DIR) $(if $(CIFAR10_DIR),--data_dir=$(CIFAR10_DIR)) $(DEMO_ARGS)

# The GPU install resolves to one TensorFlow (checked with pip's resolver; no GPU needed).
check-install: $(STAMP)
	$(PY) tools/check_gpu_install.py

bazel-test: $(STAMP)
	bash tools/bazel_test.sh

clean:
	rm -rf $(VENV) $(BACKENDS_VENV) $(DEMO_DIR) bazel-* *.egg-info
