"""Attention at higher resolution: training and inference memory and speed against the grid size.

    .venv/bin/python -m benchmarks.scaling --output=benchmarks/results/scaling.json
    .venv/bin/python -m benchmarks.scaling --presets=sa_quadratic --grids=48 --paths=separable --modes=train

For each preset with the separable path (`scaled_presets`), grid side ``G`` (``--image_size = 2 G``: the presets pool
2x2), attention path (``separable``: `sa_conv.separable`, exact, ``O(N (H + W))`` per head and
channel; ``dense``: Eq. (5)-(6) with ``(heads, N, N)`` probabilities) and mode, one process
measures at ``--batch`` (32), attention dropout 0 (which the separable path needs in training):

* ``train``: the trainer's own step (`trainers.task.Task`: its loss, weight decay, SGD, XLA
  default, and ``--remat=auto``'s decision from `trainers.footprint`, recorded with its estimate):
  images/s, the fastest of ``--train_steps`` after a warm-up step;
* ``infer``: ``model(x, training=False)`` in a `tf.function`, images/s, the fastest of
  ``--infer_steps``;

and the process's peak RSS, its RSS once the model and data are built (before the first step),
and the difference (and, from the parent, the largest RSS it saw the case's process reach, which
a case that dies cannot report itself). Each case's process may allocate at most
``--memory_limit_gb`` (``RLIMIT_DATA``; default: the machine's memory), so a case that does not fit
in the machine fails with an allocation error instead of waking the kernel's OOM killer. A case
that fails (out of memory, over ``--timeout`` seconds) is recorded with its error: ``--grids=64
--presets=sa_quadratic --modes=train`` shows where the dense path no longer fits. Results merge
into the output file by case name, so grids can be measured in several
runs. Nothing here is a test.
"""

from __future__ import annotations

import datetime
import json
import resource
import signal
import subprocess
import tempfile

from benchmarks import harness

PRESETS = ("sa_quadratic", "sa_learned")
GRIDS = (16, 24, 32, 48)
PATHS = {"separable": True, "dense": False}
MODES = ("train", "infer")


def case_name(preset, grid, path, mode):
    return f"{preset}/{grid}x{grid}/{path}/{mode}"


def _failure(returncode, stderr):
    """What a case's process died of: its exit status (the signal's name when one ended it) and
    TensorFlow's out-of-memory line, or else the last error line, of its standard error."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    reason = next((l for l in reversed(lines) if "OOM when allocating" in l or "MemoryError" in l), None)
    reason = reason or next((l for l in reversed(lines) if "Error" in l), lines[-1] if lines else "")
    status = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"
    return f"{status}: {reason[:300]}" if reason else status


def measure(preset, grid, path, mode, batch, steps):
    """One case in this process (see the module docstring)."""
    import numpy as np
    import tensorflow as tf

    from benchmarks import flops
    from trainers import footprint
    from trainers import distribute, process
    from trainers.config import make_config
    from trainers.task import Task

    config = make_config(overrides=dict(
        model=preset, dataset="synthetic", image_size=2 * grid, global_batch_size=batch, eval_batch_size=batch,
        validation_size=100, epochs=1, strategy="one_device", model_dir=tempfile.mkdtemp(prefix="scaling_"),
        mixed_precision="float32"))
    task = Task(config, log=lambda s: None,
                model_fields={"attention_dropout": 0.0, "fast_position_attention": PATHS[path]})
    process.keep_freed_memory(task.keeps_freed_memory())
    model = task.build_model()
    result = {"preset": preset, "grid": grid, "path": path, "mode": mode, "batch": batch,
              "image_size": 2 * grid, "n_h_plus_w": grid * grid * 2 * grid,
              "forward_gflops_per_image": flops.forward_flops(task.model_config, fast=PATHS[path]) / 1e9}
    if mode == "train":
        remat = bool(task.model_config.remat)
        result.update(remat=remat, xla=task.use_xla(), estimated_activation_gb=footprint.training_activation_bytes(
            task.model_config, batch, remat=remat) / 2**30)
        train = distribute.local_train_steps(task, model, task.build_optimizer(model, task.build_schedule(
            task.total_steps())))
        iterator = iter(task.train_dataset(0))
        one = tf.constant(1)
        next(iter(task.train_dataset(1)))  # the pipeline's buffers, before the baseline
        result["rss_before_first_step_mb"] = harness.rss_mb()
        seconds = harness.fastest(lambda: train(iterator, one).numpy(), steps)
    else:
        x = tf.constant(np.random.default_rng(0).integers(0, 256, (batch, 2 * grid, 2 * grid, 3), dtype=np.uint8))
        infer = tf.function(lambda t: model(t, training=False))
        result["rss_before_first_step_mb"] = harness.rss_mb()
        seconds = harness.fastest(lambda: infer(x).numpy(), steps)
    result["images_per_second"] = batch / seconds
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["step_peak_growth_mb"] = result["peak_rss_mb"] - result["rss_before_first_step_mb"]
    result["process"] = process.describe()
    return result


def scaled_presets() -> list[str]:
    """The presets that have both attention paths: a separable position-only encoding."""
    import sa_conv

    specs = {name: sa_conv.get_encoding(config.encoding)
             for name, config in sa_conv.PRESETS.items() if config.is_attention}
    return [name for name, spec in specs.items() if spec.position_only and spec.separable]


def main():
    parser = harness.arguments(__doc__, "scaling.json")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--grids", default=",".join(map(str, GRIDS)))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train_steps", type=int, default=2)
    parser.add_argument("--infer_steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--memory_limit_gb", type=float, default=harness.cpu()["memory_gb"])
    args = harness.parse(parser)
    from trainers import process

    if args.side == "presets":
        return harness.print_result({"presets": scaled_presets()})
    if args.side:  # one case, "preset/grid/path/mode"
        limit = int(args.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        preset, grid, path, mode = args.side.split("/")
        steps = args.train_steps if mode == "train" else args.infer_steps
        return harness.print_result(measure(preset, int(grid), path, mode, args.batch, steps))
    for flag, known in (("modes", MODES), ("paths", PATHS)):
        unknown = sorted(set(getattr(args, flag).split(",")) - set(known))
        if unknown:  # before any case runs: a child would take an unknown mode for inference
            parser.error(f"--{flag} {unknown}: each is one of {', '.join(known)}.")
    # Asked of a child: this process stays free of TensorFlow's memory while the cases run.
    scaled = harness.run_side(__name__, "presets", env=process.child_environment())["presets"]
    unknown = sorted(set(args.presets.split(",")) - set(scaled))
    if unknown:  # each case runs both attention paths, which a separable position-only encoding has
        parser.error(f"--presets {unknown}: each is a preset with the separable path ({', '.join(scaled)}).")
    report = {"batch": args.batch, "cases": {}}

    for preset in args.presets.split(","):
        for grid in map(int, args.grids.split(",")):
            for path in args.paths.split(","):
                for mode in args.modes.split(","):
                    name = case_name(preset, grid, path, mode)
                    flags = [f"--side={preset}/{grid}/{path}/{mode}", f"--batch={args.batch}",
                             f"--train_steps={args.train_steps}", f"--infer_steps={args.infer_steps}",
                             f"--memory_limit_gb={args.memory_limit_gb}"]
                    try:
                        proc, largest = harness.run_module_watched(
                            __name__, flags, {**process.child_environment(), "TF_CPP_MIN_LOG_LEVEL": "2"}, args.timeout)
                        try:
                            result = harness.parse_result(name, proc.returncode, proc.stdout, proc.stderr)
                        except harness.SideError:
                            result = {"error": _failure(proc.returncode, proc.stderr)}
                        result["largest_rss_seen_mb"] = largest
                    except subprocess.TimeoutExpired:
                        result = {"error": f"over {args.timeout:.0f} s"}
                    result.update(date=datetime.date.today().isoformat(), memory_limit_gb=args.memory_limit_gb)
                    report["cases"][name] = result
                    print(name, json.dumps({k: v for k, v in result.items() if k != "process"}), flush=True)
                    harness.write_report(args.output, report, merge=args.merge, entries="cases")  # each case as it lands


if __name__ == "__main__":
    main()
