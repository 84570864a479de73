#!/usr/bin/env bash
# `make bazel-test`: Bazel 4.2.3 from Debian (bazel-bootstrap), fully offline, with the
# project's virtualenv interpreter. Runs the fast targets by default; BAZEL_TARGETS overrides
# (e.g. BAZEL_TARGETS=//... for everything).
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
targets=${BAZEL_TARGETS:-"//:test_data //:test_layers //:test_fast_attention //:test_schedule //:test_flops //:test_conversion //:test_architecture //:test_compat //:test_reference //:test_optimizers //:train //:demo //:import_reference"}
# Bazel runs whatever python3 is first on PATH for its own helpers: put the venv's first.
export PATH="$(pwd)/.venv/bin:$PATH"
bazel test $targets
# The entry-point binaries start and parse their flags.
help=$(bazel-bin/train --helpshort 2>/dev/null || true)  # absl exits 1 after printing help
grep -q -- "--global_batch_size" <<<"$help"
echo "bazel-bin/train: OK"
