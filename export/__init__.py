"""Export programs over the `sa_conv` library. Importing `trainers` first sets the environment
TensorFlow reads when it loads (see `trainers`)."""

import trainers  # noqa: F401
