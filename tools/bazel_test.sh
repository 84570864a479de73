#!/usr/bin/env bash
# `make bazel-test`: Bazel 4.2.3 from Debian (bazel-bootstrap), fully offline, with the
# project's virtualenv interpreter. Runs every target on the fast subset of its tests (--fast: the
# tests not marked slow, as `make test-fast`; defined once in tests/conftest.py); BAZEL_TARGETS
# and BAZEL_TEST_ARGS override (e.g. BAZEL_TEST_ARGS= for the slow tests too).
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
test_args=${BAZEL_TEST_ARGS---test_arg=--fast}
# Bazel runs whatever python3 is first on PATH for its own helpers: put the venv's first.
export PATH="$(pwd)/.venv/bin:$PATH"
bazel test $test_args $targets
# The entry-point binaries start and parse their flags.
help=$(bazel-bin/train --helpshort 2>/dev/null || true)  # absl exits 1 after printing help
grep -q -- "--global_batch_size" <<<"$help"
echo "bazel-bin/train: OK"
