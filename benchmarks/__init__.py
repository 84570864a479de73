"""Benchmarks of the `sa_conv` library and its programs. Importing `trainers` first sets the
environment TensorFlow reads when it loads (see `trainers`), so that the programs are measured as
they run."""

import trainers  # noqa: F401
