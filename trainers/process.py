"""The process a program runs in: what its entry point configures, once, and the record of it.

Importing this module (or any module of ``sa_conv``, ``trainers``, ``export`` or ``benchmarks``)
changes nothing outside it. A program configures its process in its entry point:

* `configure`, first, before TensorFlow loads (console scripts through `programs.launch`;
  ``python -m trainers.train`` and the other program modules call it when run as
  ``__main__``, before their own imports):

  - ``TF_CPP_MIN_LOG_LEVEL=2``: hides TensorFlow's C++ INFO and WARNING logs, unless the command
    line asks for absl's ``--verbosity`` (``-v``) of 1 or more; TensorFlow is then imported with
    standard error hidden, as it prints its oneDNN notice before any log setting applies;
  - ``TF_ENABLE_ONEDNN_OPTS=1`` on x86-64: TensorFlow's oneDNN kernels, which it turns on by
    itself only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX units, and without which
    ResNet18's training and the paper presets' inference at batch 100 are far slower (measured
    with and without in ``benchmarks/results/vs_reference.json``, ``onednn``). A user's own
    ``TF_ENABLE_ONEDNN_OPTS`` (``0`` keeps TensorFlow's kernels) wins;
  - the logging filter that drops TensorFlow's warning about the integer dropout seeds of
    rematerialized blocks (`sa_conv.transformer.SeedWatchFilter`).

* per run: `seed` (Python, NumPy and the backend's generators, `keras.utils.set_random_seed`),
  `keep_freed_memory` (glibc's allocator, `trainers.memory`); the dtype policy is not global: the
  trainer builds its models with their policy (`sa_conv.build_model` ``dtype``).

`describe` is the record of what ran (TensorFlow and Keras versions, oneDNN on or off and why,
the CPU and its vector and matrix extensions, the allocator, the precision): the trainer writes it
to ``config.json``, every benchmark to its JSON, so that two results can be compared knowing what
ran.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import sys

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# TensorFlow turns oneDNN on by itself on Linux x86-64 CPUs with any of these (its IsMKLEnabled).
ONEDNN_DEFAULT_EXTENSIONS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
# The vector and matrix extensions a result's speed depends on, as /proc/cpuinfo names them.
EXTENSIONS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",  # x86-64
    "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "sme",  # aarch64
)
_X86 = ("x86_64", "amd64")

# What this process's entry point did: None until `configure` ran.
_configured: dict | None = None
_allocator: dict | None = None


def _verbosity(argv) -> int | None:
    found = re.findall(r"(?:--verbosity|-v)[= ](-?\d+)", " ".join(argv))
    return int(found[-1]) if found else None


def program_environment(argv, environ, machine: str) -> dict:
    """The environment variables `configure` sets, given the command line ``argv``, the current
    ``environ`` (a setting already there wins and is not returned) and ``platform.machine()``."""
    wanted = {}
    verbosity = _verbosity(argv)
    if verbosity is None or verbosity < 1:
        wanted[LOG_LEVEL] = "2"
    if machine.lower() in _X86:
        wanted[ONEDNN] = "1"
    return {k: v for k, v in wanted.items() if k not in environ}


def configure(argv=None) -> dict:
    """Configures this process for a program (see the module docstring); call it first, before
    TensorFlow loads. Returns what it set. A second call does nothing; a call after TensorFlow
    has loaded sets no environment (TensorFlow reads it once) and says so in `describe`."""
    global _configured
    if _configured is not None:
        return _configured
    argv = sys.argv[1:] if argv is None else argv
    loaded = "tensorflow" in sys.modules
    set_env = {} if loaded else program_environment(argv, os.environ, platform.machine())
    os.environ.update(set_env)
    _configured = {"environment_set": set_env, "tensorflow_loaded_before": loaded}
    if not loaded and os.environ.get(LOG_LEVEL, "0") not in ("", "0"):
        _import_tensorflow_quietly()
    from sa_conv.transformer import SEED_WATCH_FILTER

    logging.getLogger("tensorflow").addFilter(SEED_WATCH_FILTER)
    return _configured


def configure_if_main(module_name: str) -> None:
    """`configure` when the calling module runs as a program (``module_name == "__main__"``);
    nothing when it is imported."""
    if module_name == "__main__":
        configure()


def child_environment(configured: dict | None = None) -> dict:
    """This process's environment without what `configure` set (``configured``: its record,
    this process's by default): for a program's child processes, which configure themselves (and
    so record their settings as this program's, not the user's)."""
    configured = _configured if configured is None else configured
    set_here = configured["environment_set"] if configured else {}
    return {k: v for k, v in os.environ.items() if k not in set_here}


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


def seed(value: int) -> None:
    """Seeds Python, NumPy and the backend's global generators (`keras.utils.set_random_seed`):
    a run's initial weights, dropout and data order follow from ``value``."""
    import keras

    keras.utils.set_random_seed(value)


def keep_freed_memory(keep: bool) -> bool:
    """Sets glibc's allocator for training (`trainers.memory`) when ``keep``, once per process:
    the first call decides, later ones keep that setting. It comes after tf.data's own one-time
    setting, which tf.data makes when its first generator dataset runs and which would otherwise
    undo this one. Returns whether the thresholds are raised."""
    global _allocator
    if _allocator is not None:
        return _allocator["applied"]
    applied = False
    if keep:
        import tensorflow as tf

        from trainers import memory

        for _ in tf.data.Dataset.from_generator(lambda: iter((0,)), output_signature=tf.TensorSpec((), tf.int32)):
            pass  # tf.data lowers the trim threshold here, once per process
        applied = memory.keep_freed_memory()
    _allocator = {"keep_freed_memory": keep, "applied": applied}
    return applied


# ------------------------------------------------------------------------------ the record


def cpu_info(cpuinfo: str | None = None, machine: str | None = None) -> dict:
    """``{"machine", "model", "extensions"}``: the architecture, the CPU's model name and which of
    `EXTENSIONS` it has, from ``cpuinfo`` (the text of Linux's /proc/cpuinfo, read when None;
    elsewhere the model is ``platform.processor()`` and the extensions are unknown, [])."""
    machine = machine or platform.machine()
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    model = fields.get("model name") or fields.get("hardware") or fields.get("cpu part") or platform.processor()
    return {"machine": machine, "model": model or "unknown", "extensions": [e for e in EXTENSIONS if e in flags]}


def cpu_name(model: str) -> str:
    """A CPU's model name as `cpu_class` gives it: without the vendor's marks, the clock and a
    closing "Processor" or "CPU", which say nothing of its matrix units; e.g. "Intel(R) Xeon(R)
    Platinum 8480+ CPU @ 2.00GHz" -> "Intel Xeon Platinum 8480+"."""
    name = re.sub(r"\((R|TM)\)|\s+(CPU\s+)?@.*$|\s+(Processor|CPU)$", "", model, flags=re.IGNORECASE)
    return " ".join(name.split()) or "unknown CPU"


def cpu_class(record: dict | None = None) -> str:
    """The class of CPU a timing belongs to, as a short name: the CPU's model and its widest matrix
    units (what decides which format serves fastest, and how fast a model trains), e.g.
    ``"AMD EPYC, AVX-512 VNNI BF16"``, ``"AMD EPYC, AVX2"``, ``"Intel Xeon, AMX"``. ``record``: a
    ``model`` and its ``extensions`` (a `cpu_info` record) or ``features``; this machine's by
    default."""
    record = cpu_info() if record is None else record
    features = set(record.get("features", record.get("extensions", ())))
    if features & {"amx_tile", "amx_bf16", "amx_int8"}:
        units = "AMX"
    elif "avx512f" in features:
        units = " ".join(["AVX-512"] + [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"))
                                        if flag in features])
    elif "avx2" in features:
        units = "AVX2" + (" VNNI" if "avx_vnni" in features else "")
    else:
        units = "no AVX2"
    return f"{cpu_name(record.get('model', ''))}, {units}"


def onednn_choice(environ, cpu: dict, configured: dict | None) -> tuple[bool, str]:
    """Whether TensorFlow runs its oneDNN kernels under ``environ`` on ``cpu`` (`cpu_info`), and
    why: the setting's origin (this program, the user, or TensorFlow's default for the CPU)."""
    value = environ.get(ONEDNN)
    if value is not None and value.strip() != "":
        on = value.strip().lower() in ("1", "true", "yes", "on")
        by = "this program (on x86-64)" if configured and ONEDNN in configured["environment_set"] else "the user"
        return on, f"{ONEDNN}={value} set by {by}"
    has = [e for e in ONEDNN_DEFAULT_EXTENSIONS if e in cpu["extensions"]]
    on = bool(has) and cpu["machine"].lower() in _X86 and sys.platform.startswith("linux")
    why = (f"{ONEDNN} unset: TensorFlow's default, on with {', '.join(has)}" if on
           else f"{ONEDNN} unset: TensorFlow's default, off without {'/'.join(ONEDNN_DEFAULT_EXTENSIONS)}")
    return on, why


def _tensorflow_onednn() -> bool | None:
    """TensorFlow's own answer (its oneDNN switch as it loaded), where it exposes one."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # noqa: BLE001 - a private module: absent or changed in some builds
        return None


def describe(precision: str | None = None) -> dict:
    """The record of this process's configuration (see the module docstring)."""
    import keras

    cpu = cpu_info()
    predicted, why = onednn_choice(os.environ, cpu, _configured)
    record = {
        "keras": keras.__version__, "keras_backend": keras.backend.backend(),
        "python": platform.python_version(), "cpu": cpu,
        "configured_by_program": _configured is not None,
        "environment": {k: os.environ[k] for k in (ONEDNN, LOG_LEVEL) if k in os.environ},
        "allocator": dict(_allocator) if _allocator else {"keep_freed_memory": False, "applied": False},
    }
    if precision is not None:
        record["precision"] = precision
    if "tensorflow" in sys.modules or keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        actual = _tensorflow_onednn()
        record["tensorflow"] = tf.__version__
        record["onednn"] = {"on": predicted if actual is None else actual, "why": why}
    return record
