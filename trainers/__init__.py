"""Programs over the `sa_conv` library, and the environment TensorFlow reads when it loads.

Importing this package (as every program does first: ``export`` and ``benchmarks`` import it too)
sets, unless already set and only if TensorFlow has not loaded yet:

* ``TF_CPP_MIN_LOG_LEVEL=2``: hides TensorFlow's C++ INFO and WARNING logs, unless the command
  line asks for absl's ``--verbosity`` (``-v``) of 1 or more.
* ``TF_ENABLE_ONEDNN_OPTS=1`` on x86-64: TensorFlow's oneDNN kernels, which it turns on by itself
  only on CPUs with AVX-512 VNNI, BF16 or AMX units; elsewhere it leaves them off, and ResNet18's
  training and the paper presets' inference at batch 100 are far slower without them (measured
  with and without in ``benchmarks/results/vs_reference.json``, ``onednn``). With oneDNN,
  TensorFlow allocates large tensors from a pool of its own, which keeps what it grew to; the
  allocator settings of rematerialized training are measured in
  ``benchmarks/results/remat_allocator.json``. Set ``TF_ENABLE_ONEDNN_OPTS=0`` to keep
  TensorFlow's default.

While its logs are hidden, TensorFlow is imported here with standard error closed: it prints its
oneDNN notice before its logging settings apply.
"""

import os
import platform
import re
import sys

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"


def configure_tensorflow_environment(argv=None, environ=os.environ, machine=None) -> None:
    """Sets the defaults above in ``environ`` (a user's own setting wins)."""
    if "tensorflow" in sys.modules:
        return  # read once, when TensorFlow loads: too late to change
    argv = sys.argv[1:] if argv is None else argv
    verbosity = re.findall(r"(?:--verbosity|-v)[= ](-?\d+)", " ".join(argv))
    if not verbosity or int(verbosity[-1]) < 1:
        environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if (machine or platform.machine()).lower() in ("x86_64", "amd64"):
        environ.setdefault(ONEDNN, "1")
    if environ is os.environ and environ.get("TF_CPP_MIN_LOG_LEVEL", "0") not in ("", "0"):
        _import_tensorflow_quietly()


def _import_tensorflow_quietly() -> None:
    """Imports TensorFlow with the process's standard error closed: it logs its oneDNN notice
    before absl's logging starts, where ``TF_CPP_MIN_LOG_LEVEL`` does not reach. A failed import
    still raises, with its traceback printed after standard error is back."""
    try:
        saved = os.dup(2)
    except OSError:  # no standard error to hide
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass  # the program's own import reports it
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


configure_tensorflow_environment()
