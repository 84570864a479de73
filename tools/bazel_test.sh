#!/usr/bin/env bash
# `make bazel-test`: Bazel 4.2.3 from Debian (bazel-bootstrap), fully offline, with the
# project's virtualenv interpreter. Builds every target, runs test targets through the py_test rule
# (BAZEL_TESTS, default two small ones: every test file runs in `make test` from the same sources,
# and tests/test_build.py checks every target's deps statically), and starts every binary with
# --helpshort. BAZEL_TARGETS, BAZEL_TESTS and BAZEL_TEST_ARGS override (e.g. BAZEL_TESTS=//:all
# BAZEL_TEST_ARGS=--test_arg=--all for every target on every tier).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bazel >/dev/null 2>&1; then
  echo "bazel not found: installing Debian's bazel-bootstrap (Bazel 4.2.3)" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bazel-bootstrap >/dev/null
fi
python="$(pwd)/.venv/bin/python"
[ -x "$python" ] || { echo "missing $python: run 'make venv' first" >&2; exit 1; }
# Bazel needs an absolute interpreter path.
printf 'build --python_path=%s\n' "$python" > .bazelrc.user
targets=${BAZEL_TARGETS:-"//:all"}
tests=${BAZEL_TESTS:-"//:test_build //:test_layers"}
test_args=${BAZEL_TEST_ARGS---test_arg=--fast}
# Bazel runs whatever python3 is first on PATH for its own helpers: put the venv's first.
export PATH="$(pwd)/.venv/bin:$PATH"
bazel build $targets
bazel test $test_args $tests
# Every binary starts and parses its flags (absl exits 1 after printing help). Each start is
# mostly TensorFlow's import on one core: two at a time.
check_binary() {
  local help
  help=$(bazel-bin/$1 --helpshort 2>&1 || true)
  grep -q -- "--config_file" <<<"$help" || { echo "bazel-bin/$1 --helpshort did not print its flags:" >&2; echo "$help" >&2; return 1; }
  echo "bazel-bin/$1: OK"
}
export -f check_binary
printf '%s\n' train tune export_model demo import_reference visualize | xargs -P 2 -I{} bash -c 'check_binary {}'
