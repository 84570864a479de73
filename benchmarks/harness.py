"""What every benchmark shares: its command line, one child process per side, the machine record
and the JSON report.

Run a benchmark from the repository root as a module, ``python -m benchmarks.NAME``. Its parent
process starts each side as ``python -m benchmarks.NAME --side=SIDE ...`` (`run_side`), in the
repository root, in an interpreter of the caller's choice (the reference's sides run in the
reference's own, with torch and NumPy and no Keras); the side prints one ``RESULT {json}`` line
(`print_result`), which the parent reads back. Nothing here is a program held in a string, and
importing a benchmark changes nothing outside it.

Standard library only (with `trainers.files` and `trainers.process`, which are too): the
reference's sides import this module in an interpreter without Keras.

* `arguments`, `parse`: the parser every benchmark starts from (``--output``, ``--merge`` where
  the benchmark reads it, ``--side``), and its arguments with the process configured (or the
  reference's side run).
* `run_side`, `print_result`: a side in its own process, and its answer; `run_module`: any
  module run as a program (the trainer a benchmark measures); `run_module_watched`: with its
  memory read from outside.
* `reference_models`: the reference's model package, for its sides; `git`: the repository's.
* `timings`, `fastest`: timed calls, and the shortest.
* `machine`: the machine record (CPU, its vector and matrix units, the kernels TensorFlow runs
  with, the interpreter) and `matmul_peaks`: the float32 and bfloat16 matmul GFLOP/s measured
  in the calling process, with TensorFlow or torch.
* `write_report`: the JSON, atomically, ``--merge`` keeping the entries not measured again
  (and a report per `cpu_class` in one file, ``section``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time

from trainers import files  # standard library only, like this module
from trainers import process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
# The real CIFAR-10 subset the benchmarks train on by default (official python format).
CIFAR10_MINI = os.path.join(ROOT, "..", "shared", "datasets", "cifar10-mini")
RESULT_PREFIX = "RESULT "
# The CPU features that decide which kernels a framework runs (and so what a peak means).
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
                "amx_int8")


class SideError(RuntimeError):
    """A side's process failed or printed no result; ``returncode`` and ``stderr`` say how."""

    def __init__(self, side, returncode, stderr):
        super().__init__(f"{side} failed (exit {returncode}):\n{stderr[-3000:]}")
        self.side, self.returncode, self.stderr = side, returncode, stderr


def arguments(doc: str, output: str, merge: bool = True) -> argparse.ArgumentParser:
    """The parser of a benchmark whose module docstring is ``doc``, writing ``output`` (a file
    name in ``benchmarks/results``) by default: ``--output``, with ``merge`` ``--merge`` (keep the
    entries of ``--output`` not measured again; a benchmark that always keeps them, or writes its
    report whole, offers none) and the hidden ``--side`` of its children."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=os.path.join(RESULTS, output), help="the JSON report")
    if merge:
        parser.add_argument("--merge", action="store_true", help="keep the entries of --output not measured again")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    return parser


def parse_result(side: str, returncode: int, stdout: str, stderr: str) -> dict:
    """The ``RESULT`` a side printed (its last); `SideError` when it failed or printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if returncode or not lines:
        raise SideError(side, returncode, stderr)
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def _module_name(module: str) -> str:
    if module == "__main__":  # `python -m benchmarks.NAME`: the name it was run by
        return sys.modules["__main__"].__spec__.name
    return module


def run_module(module: str, args=(), python: str | None = None, env: dict | None = None,
               timeout: float | None = None, capture: bool = True) -> subprocess.CompletedProcess:
    """``python -m module args...`` in the repository root, its output captured: the one way
    benchmarks start a process (a side, or a program they measure). ``env``: the child's
    environment (None: this process's). ``module`` may be ``__name__`` of a benchmark run with
    ``-m`` (``"__main__"``): its own module's name is run. Without ``capture``, the child's
    output goes to this process's standard error as it comes (a long training's progress)."""
    module = _module_name(module)
    output = dict(capture_output=True, text=True) if capture else dict(stdout=sys.stderr)
    return subprocess.run([python or sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env,
                          timeout=timeout, **output)


def add_data_dir(parser: argparse.ArgumentParser, help: str = "CIFAR-10 python-format files (cifar10-mini)") -> None:
    """``--data_dir``, by default `CIFAR10_MINI`."""
    parser.add_argument("--data_dir", default=CIFAR10_MINI, help=help)


def cifar10_dir(parser: argparse.ArgumentParser, path: str) -> str:
    """``path`` made absolute when it holds the official CIFAR-10 python files (a
    ``cifar-10-batches-py/`` directory, the ``.tar.gz`` archive, or a directory holding either:
    `CifarFormat.locate`); else the parser's usage error (exit status 2), which names the path and
    what it lacks: a parent checks here before its children start, rather than each child failing
    in turn."""
    from trainers import data  # reading files needs only numpy

    absolute = os.path.abspath(path)
    try:
        data.CIFAR10.locate(absolute)  # the checks the children's reading starts with
    except data.DatasetError as error:
        parser.error(f"--data_dir={path}: {error} (The default: {os.path.normpath(CIFAR10_MINI)}.)")
    return absolute


def parse(parser: argparse.ArgumentParser, reference=None, outputs: dict | None = None):
    """The arguments of a benchmark's command line, its process configured as the programs it
    measures configure theirs (`trainers.process.configure`, before TensorFlow loads), or None
    after ``--side=reference`` ran ``reference(args)`` and printed its result: that side runs in
    the reference's interpreter, which has no Keras and is not configured. ``outputs``: ``{flag:
    file name}``, the default ``--output`` when that flag is set (another report). A benchmark
    stopped with SIGTERM (``kill``) then ends as Ctrl-C ends it, its running child killed with
    it (`run_module`), not left running (a training with no one to read it)."""
    args = parser.parse_args()
    for flag, name in (outputs or {}).items():
        if getattr(args, flag) and args.output == parser.get_default("output"):
            args.output = os.path.join(RESULTS, name)
    if args.side == "reference" and reference is not None:
        print_result(reference(args))
        return None
    process.configure()
    if not args.side:  # a side's parent ends it with SIGKILL; a side starts no child of its own
        signal.signal(signal.SIGTERM, _exit_on_signal)
        global LOAD_SINCE
        LOAD_SINCE = cpu_seconds()
    return args


LOAD_SINCE = None  # `cpu_seconds` when a benchmark's parent parsed its command line: `write_report` compares


def cpu_seconds(stat: str = "/proc/stat") -> tuple[float, float, float] | None:
    """``(wall time, CPU seconds the whole machine has been busy since boot, CPU seconds of this
    process and its finished children)``, or None without ``stat`` (Linux's ``/proc/stat``)."""
    try:
        with open(stat) as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    # Busy: this system's work, not idle, I/O wait or time the hypervisor gave other machines (steal).
    return (time.monotonic(), (sum(ticks[:7]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"),
            sum(r.ru_utime + r.ru_stime for r in own))


def other_load(since, until=None) -> dict | None:
    """What the rest of the machine ran between two `cpu_seconds` (``until``: now): ``cores``, the
    mean number of cores busy with other processes' work (a benchmark's timings are its own only
    near 0), over ``seconds`` of wall time; None without ``/proc/stat``."""
    until = until or cpu_seconds()
    if since is None or until is None or until[0] <= since[0]:
        return None
    seconds = until[0] - since[0]
    others = (until[1] - since[1]) - (until[2] - since[2])
    return {"cores": round(max(others, 0.0) / seconds, 3), "seconds": round(seconds, 1)}


def _exit_on_signal(signum, frame):
    # An exception where the main thread waits: subprocess.run and run_module_watched kill their
    # child on any exception, as they do on Ctrl-C's KeyboardInterrupt.
    raise SystemExit(128 + signum)


def rss_mb(pid="self") -> float:
    """Resident memory of process ``pid`` in MiB (Linux's ``/proc``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_module_watched(module: str, args=(), env: dict | None = None, timeout: float | None = None):
    """`run_module`, reading the child's resident memory from outside every 0.2 s (what a process
    that dies cannot report itself): ``(CompletedProcess, largest RSS seen in MiB)``. Raises
    `subprocess.TimeoutExpired` after ``timeout`` seconds, the process killed."""
    command = [sys.executable, "-m", _module_name(module), *map(str, args)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True, env=env)
        largest, start = 0.0, time.monotonic()
        try:
            while proc.poll() is None:
                try:
                    largest = max(largest, rss_mb(proc.pid))
                except (OSError, IndexError):  # it just ended
                    pass
                if timeout is not None and time.monotonic() - start > timeout:
                    raise subprocess.TimeoutExpired(command, timeout)
                time.sleep(0.2)
        except BaseException:  # the timeout, Ctrl-C or a SIGTERM (`parse`): the child ends too
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read()), largest


def run_side(module: str, side: str, args=(), python: str | None = None, env: dict | None = None,
             timeout: float | None = None) -> dict:
    """Runs one side of ``module`` in its own process (``--side=side``, `run_module`) and returns
    what it printed with `print_result`; `SideError` when it failed."""
    proc = run_module(module, [f"--side={side}", *args], python, env, timeout)
    return parse_result(side, proc.returncode, proc.stdout, proc.stderr)


def run_training_side(module: str, side: str, args=(), env: dict | None = None) -> dict:
    """`run_side` for a side that trains: ``--model_dir`` a fresh temporary directory (deleted
    after), the child's environment ``env`` (None: `trainers.process.child_environment`) with
    TensorFlow's C++ logging off."""
    env = process.child_environment() if env is None else env
    with tempfile.TemporaryDirectory() as model_dir:
        return run_side(module, side, [*args, f"--model_dir={model_dir}"], env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})


def git(*args, repository: str = ROOT) -> bytes:
    """The output of ``git args...`` run in ``repository``; CalledProcessError when it fails."""
    return subprocess.run(["git", *args], cwd=repository, check=True, capture_output=True).stdout


def reference_models(reference_dir: str):
    """The reference implementation's ``models`` package, imported from ``reference_dir`` (a local
    clone of ``epfml/attention-cnn``; never copied here): what its sides build."""
    sys.path.insert(0, os.path.abspath(reference_dir))
    return importlib.import_module("models")


def print_result(result: dict) -> None:
    """A side's answer to its parent: one ``RESULT {json}`` line."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def timings(fn, steps: int, warm_up: bool = True) -> list[float]:
    """Seconds of ``steps`` timed calls of ``fn``, shortest first, after one untimed call
    (tracing, allocation) unless ``warm_up`` is False (the caller warmed it up)."""
    if warm_up:
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)


def fastest(fn, steps: int) -> float:
    """The shortest of `timings`: other load on the machine only ever adds time."""
    return timings(fn, steps)[0]


def cpu() -> dict:
    """The CPU's model name, its cores, which of `CPU_FEATURES` it has (as `trainers.process.cpu_info`
    reads them, so a benchmark and a trainer name the same class) and the machine's memory."""
    info = process.cpu_info()
    return {"model": info["model"], "cores": os.cpu_count(),
            "features": [f for f in CPU_FEATURES if f in info["extensions"]],
            "memory_gb": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30}


def cpu_class(record: dict | None = None) -> str:
    """`trainers.process.cpu_class` of ``record``, a `cpu` record (this machine's by default)."""
    return process.cpu_class(cpu() if record is None else record)


def matmul_peaks(framework: str = "tensorflow", size: int = 2048, repeats: int = 5) -> dict:
    """GFLOP/s of a ``size``-square matmul in float32 and bfloat16 (best of ``repeats``), with
    ``framework`` (``"tensorflow"`` or ``"torch"``) in this process: the peak a side's achieved
    FLOP rate is a fraction of. ``"onnxruntime"``: float32 and int8 (`_onnxruntime_peaks`);
    ``"openvino"``: float32 and int8 (`_openvino_peaks`); ``"tflite"``: float32 and int8 (`_tflite_peaks`)."""
    flop = 2 * size ** 3
    peaks = {}
    if framework == "onnxruntime":
        return _onnxruntime_peaks(size, repeats)
    if framework == "openvino":
        return _openvino_peaks(size, repeats)
    if framework == "tflite":
        return _tflite_peaks(size, repeats)
    if framework == "torch":
        import torch

        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
            peaks[name] = flop / fastest(lambda: torch.matmul(a, b), repeats) / 1e9
        return peaks
    import tensorflow as tf

    for name, dtype in (("float32", tf.float32), ("bfloat16", tf.bfloat16)):
        a, b = tf.cast(tf.random.normal((size, size)), dtype), tf.cast(tf.random.normal((size, size)), dtype)
        matmul = tf.function(lambda a=a, b=b: tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32)))
        peaks[name] = flop / fastest(lambda: matmul().numpy(), repeats) / 1e9
    return peaks


def _onnxruntime_peaks(size: int, repeats: int) -> dict:
    """ONNX Runtime's GFLOP/s (a multiply-add: 2) of a ``size``-square matmul in float32
    (``MatMul``) and in int8 (``MatMulInteger``, uint8 activations times int8 weights, as its
    dynamic quantization computes), on all cores: the peaks of the ONNX sides."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count()
    peaks = {}
    for name, op, a_type, b in (
            ("float32", "MatMul", TensorProto.FLOAT, rng.standard_normal((size, size)).astype(np.float32)),
            ("int8", "MatMulInteger", TensorProto.UINT8, rng.integers(-127, 128, (size, size)).astype(np.int8))):
        out_type = TensorProto.FLOAT if name == "float32" else TensorProto.INT32
        graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["c"])], "peak",
                                  [helper.make_tensor_value_info("a", a_type, [size, size])],
                                  [helper.make_tensor_value_info("c", out_type, [size, size])],
                                  [numpy_helper.from_array(b, "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        a = (rng.standard_normal((size, size)).astype(np.float32) if name == "float32"
             else rng.integers(0, 256, (size, size)).astype(np.uint8))
        peaks[name] = 2 * size ** 3 / fastest(lambda: session.run(None, {"a": a}), repeats) / 1e9
    return peaks


def _tflite_peaks(size: int, repeats: int) -> dict:
    """The TFLite interpreter's GFLOP/s (XNNPACK, all cores) of a ``size``-square matmul by a
    constant (``FULLY_CONNECTED``, as a model's weights): float32, and int8 weights and activations
    as its full-integer quantization computes (calibrated on the input it times)."""
    import numpy as np
    import tensorflow as tf

    from export import runtimes

    rng = np.random.default_rng(0)
    weights = tf.constant(rng.standard_normal((size, size)).astype(np.float32))
    x = rng.standard_normal((size, size)).astype(np.float32)
    function = tf.function(lambda a: tf.matmul(a, weights), input_signature=[tf.TensorSpec((size, size), tf.float32)])
    peaks = {}
    for name in ("float32", "int8"):
        converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], function)
        if name == "int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: iter([[x]])
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = converter.inference_output_type = tf.int8
        interpreter = runtimes.tflite_interpreter(model_content=converter.convert())
        interpreter.allocate_tensors()
        (source,), (target,) = interpreter.get_input_details(), interpreter.get_output_details()
        interpreter.set_tensor(source["index"], x.astype(source["dtype"]) if name == "float32"
                               else rng.integers(-128, 128, (size, size)).astype(np.int8))

        def run():
            interpreter.invoke()
            return interpreter.get_tensor(target["index"])

        peaks[name] = 2 * size ** 3 / fastest(run, repeats) / 1e9
    return peaks


def _openvino_peaks(size: int, repeats: int) -> dict:
    """OpenVINO's GFLOP/s of a ``size``-square matmul (a constant right factor, as a model's
    weights) on its CPU plugin, all cores: in float32 (float32 inference precision), and in int8
    (both factors through ``FakeQuantize``, as NNCF writes a quantized product; the plugin runs
    it as an int8 matmul)."""
    import numpy as np
    import openvino
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size)).astype(np.float32)
    weights = rng.standard_normal((size, size)).astype(np.float32)

    def quantized(node, low, high, levels):
        low, high = np.float32(low), np.float32(high)
        return ops.fake_quantize(node, low, high, low, high, levels)

    # int8: signed activations (256 levels, -128..127 steps) and symmetric weights (255 levels), the
    # ranges the plugin's low-precision transformations turn into an int8 matmul.
    wraps = {"float32": (lambda node: node, lambda node: node),
             "int8": (lambda node: quantized(node, -4.0, 4.0 * 127 / 128, 256), lambda node: quantized(node, -4.0, 4.0, 255))}
    peaks = {}
    for precision, (activations, constant) in wraps.items():
        a = ops.parameter([size, size], np.float32)
        model = openvino.Model([ops.matmul(activations(a), constant(ops.constant(weights)), False, False)], [a])
        compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": os.cpu_count(),
                                                                "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        peaks[precision] = 2 * size ** 3 / fastest(lambda: request.infer({0: x}), repeats) / 1e9
    return peaks


def machine(peaks: dict | None = None) -> dict:
    """The machine record of a report: `cpu`, the platform, the interpreter, the kernels
    TensorFlow runs with (``TF_ENABLE_ONEDNN_OPTS`` as the children see it) and, when given,
    the matmul ``peaks`` (`matmul_peaks`)."""
    record = {"cpu": cpu(), "platform": platform.platform(), "python": platform.python_version(),
              "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "TensorFlow's default")}
    if peaks is not None:
        record["matmul_gflops"] = peaks
    return record


def write_report(path: str, report: dict, merge: bool = False, entries: str = "presets",
                 section: str | None = None, inline_numbers: bool = False) -> dict:
    """Writes ``report`` as JSON to ``path`` atomically, with today's date and the `machine`
    record unless it has them. With ``merge``, the ``entries`` mapping of the report already at
    ``path`` keeps what this run did not measure again; when this run records its load, each
    such entry (a mapping) says the earlier run's ``other_load`` (None where it recorded none)
    unless it has its own. With ``section`` (such as `cpu_class`'s name), the report is one entry
    of the file's ``runs`` mapping and the others stay; ``merge`` then reads that entry. The
    file's ``notes`` (what the pages no longer say) stay. ``inline_numbers``: lists of numbers on
    one line each (`trainers.files.write_json`). A benchmark's report also says what other
    processes ran beside it (`other_load` since its command line was parsed). Returns what was
    written."""
    report = {"date": datetime.date.today().isoformat(), "machine": machine(), **report}
    if LOAD_SINCE is not None and "other_load" not in report:
        report["other_load"] = other_load(LOAD_SINCE)
    written = {}
    if os.path.exists(path):
        with open(path) as f:
            written = json.load(f)
    notes = written.get("notes", [])
    if not (merge or section):
        written = {}
    earlier = written.get("runs", {}).get(section, {}) if section else written
    if merge:
        # The run-level load is this run's: an entry kept from an earlier run keeps that run's (None:
        # not recorded), so that a run writing after each entry does not lend its load to old ones.
        lent = "other_load" in report
        kept = {name: {"other_load": earlier.get("other_load"), **entry} if lent and isinstance(entry, dict) else entry
                for name, entry in earlier.get(entries, {}).items() if name not in report.get(entries, {})}
        report[entries] = {**kept, **report.get(entries, {})}
    if section:
        written.setdefault("runs", {})[section] = report
    else:
        written = report
    if notes:
        written["notes"] = notes + [note for note in written.get("notes", []) if note not in notes]
    files.write_json(path, written, inline_numbers=inline_numbers)
    return written
