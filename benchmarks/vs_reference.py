"""sa-conv against the reference implementation: speed and memory side by side, as ratios.

    .venv/bin/python -m benchmarks.vs_reference --reference_dir=PATH --reference_python=PYTHON_WITH_TORCH \\
        [--cases=paper,small] [--rounds=2]

``PATH`` is a local clone of ``epfml/attention-cnn`` (its ``models`` package is imported, never
copied; see ``tools/make_reference_fixtures.py`` for the ``bert_utils`` stub); the reference runs
in ``PYTHON_WITH_TORCH``, any interpreter with torch and NumPy: its side imports neither Keras nor
TensorFlow nor sa_conv (`benchmarks.harness`).

Serving (the frozen in-process model, the exported SavedModel and its bfloat16 export against the
reference, at batch 1 and 100) is ``python -m benchmarks.serving --reference_dir=PATH``; this benchmark
measures the trainer's step and the live model.

Each case (a preset, and the same model in the reference) runs its sides in separate processes,
alternating (A B A B for ``--rounds=2``; the order flips from case to case), each process alone on
the machine. A side measures, at batch 100 unless stated:

* inference images/s at batch 1 and 100 (eval mode, no gradients; the fastest of
  ``--infer_steps`` calls after a warm-up);
* training images/s: one optimizer step (forward, backward, SGD with momentum 0.9 and weight
  decay 1e-4) after a warm-up step, the fastest of ``--train_steps``. sa-conv's is the trainer's
  own step (`trainers.train.Trainer`: ``strategy.run``, its XLA default, its ``--remat``);
  the reference's is its ``train.py`` step (``zero_grad``, forward, cross-entropy, ``backward``,
  ``SGD.step``) in training mode;
* peak RSS of the training process.

sa-conv runs inference and training in two processes (as an export or a server would infer),
both set up by the trainer with the environment its programs set (`trainers`: TensorFlow's oneDNN
kernels on). sa-conv sides: ``sa_conv`` (the trainer's defaults, so ``--remat=auto``) and, where
auto turns remat on, ``sa_conv_no_remat`` too (training only), to show remat's cost; for
``--precision_cases``, ``sa_conv_mixed_bfloat16`` and ``sa_conv_mixed_float16`` (the trainer's
``--mixed_precision``); for ``--onednn_cases``, ``sa_conv_no_onednn`` (``TF_ENABLE_ONEDNN_OPTS=0``,
TensorFlow's own default on CPUs without AVX-512 VNNI, BF16 or AMX). The machine's fp32 matmul GFLOP/s is
measured before and after. Ratios are sa-conv / reference (speed: higher is better; memory: lower
is better). Results go to JSON; nothing here is a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import time

import epfml_reference  # standard library only: the reference side has no Keras
from benchmarks import harness

PAPER = ["sa_quadratic", "sa_learned", "resnet18", "sa_quadratic_full", "sa_content_plus_learned_bias"]
SMALL = ["sa_quadratic_small", "sa_learned_small", "sa_quadratic_full_small", "sa_content_plus_learned_bias_small"]
GROUPS = {"paper": PAPER, "small": SMALL}


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024




# ------------------------------------------------------------------------------ sa-conv side


def sa_conv_side(args):
    import numpy as np
    import tensorflow as tf

    from trainers import distribute, process
    from trainers.config import make_config
    from trainers.task import Task

    # Inference runs in a process of its own, as in an export or a server.
    inference = args.phase == "inference"
    config = make_config(overrides=dict(
        model=args.preset, dataset="synthetic", global_batch_size=args.batch, eval_batch_size=args.batch,
        validation_size=100, epochs=1, strategy="one_device", model_dir=os.path.join(args.workdir, "run"),
        remat="none" if inference else args.remat, mixed_precision=args.mixed_precision))
    process.seed(config.seed)
    task = Task(config, log=lambda s: None)
    model = task.build_model()
    if not inference:  # as `trainers.train.train` sets it for the run
        process.keep_freed_memory(task.keeps_freed_memory())
    rng = np.random.default_rng(0)
    result = {"parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
              "xla": task.use_xla(), "process": process.describe(task.precision)}
    if inference:
        infer = tf.function(lambda x: model(x, training=False), jit_compile=task.use_xla())
        for b in (1, args.batch):
            x = tf.constant(rng.integers(0, 256, (b, 32, 32, 3), dtype=np.uint8))
            result[f"inference_images_per_second_batch{b}"] = b / harness.fastest(lambda: infer(x).numpy(), args.infer_steps)
        result["inference_peak_rss_mb"] = _peak_rss_mb()
        return result
    result.update(remat=bool(task.model_config.remat), keep_freed_memory=task.keeps_freed_memory())
    train_steps = distribute.local_train_steps(task, model, task.build_optimizer(model, task.build_schedule(
        task.total_steps())))
    iterator = iter(task.train_dataset(0))
    one = tf.constant(1)
    result["train_images_per_second"] = args.batch / harness.fastest(
        lambda: train_steps(iterator, one).numpy(), args.train_steps)
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


# ------------------------------------------------------------------------------ reference side


def reference_side(args):
    import numpy as np
    import torch

    models = harness.reference_models(args.reference_dir)

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    preset = json.loads(args.preset_config)  # the sa-conv preset's fields (this process has no sa_conv)
    if preset["architecture"] == "resnet18":
        model = models.ResNet18(num_classes=10)
    else:
        fields = ("num_layers", "num_heads", "hidden_size", "mlp_size", "dropout", "attention_dropout", "pooling_width")
        config = epfml_reference.reference_config(preset["encoding"], **{f: preset[f] for f in fields})
        model = models.BertImage(config, num_classes=10)
    rng = np.random.default_rng(0)
    result = {"parameters": int(sum(p.numel() for p in model.parameters() if p.requires_grad))}
    model.eval()
    with torch.no_grad():
        for b in (1, args.batch):
            x = torch.from_numpy(rng.standard_normal((b, 3, 32, 32)).astype(np.float32))
            result[f"inference_images_per_second_batch{b}"] = b / harness.fastest(lambda: model(x), args.infer_steps)
    result["inference_peak_rss_mb"] = _peak_rss_mb()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, args.batch))

    def step():
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    result["train_images_per_second"] = args.batch / harness.fastest(step, args.train_steps)
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


# ------------------------------------------------------------------------------ driver


def _run_side(side, preset, args, workdir):
    python = args.reference_python if side == "reference" else sys.executable
    flags = [f"--preset={preset}", f"--batch={args.batch}", f"--train_steps={args.train_steps}",
             f"--infer_steps={args.infer_steps}", f"--workdir={workdir}"]
    if side == "reference":
        from sa_conv import get_config

        flags += [f"--reference_dir={args.reference_dir}", f"--preset_config={json.dumps(get_config(preset).to_dict())}"]
    from trainers import process

    env = {**process.child_environment(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if side == "sa_conv_no_onednn":
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    start = time.perf_counter()
    result = {}
    # sa-conv measures inference and training in separate processes; remat does not change
    # inference, so sa_conv_no_remat only trains.
    phases = [""] if side == "reference" else ["training"] if side == "sa_conv_no_remat" else ["inference", "training"]
    for phase in phases:
        try:
            result.update(harness.run_side(__name__, side, flags + ([f"--phase={phase}"] if phase else []), python,
                                           env=env))
        except harness.SideError as failure:
            # A side killed for memory (exit -9) is a result too: it does not fit on this machine.
            return {"failed": f"{phase} exit {failure.returncode}".strip(), "stderr_tail": failure.stderr[-1500:]}
    return {**result, "wall_seconds": time.perf_counter() - start, "date": datetime.date.today().isoformat()}


def _best(runs):
    """Across rounds: the fastest speeds (other load only slows a run) and the highest peak RSS."""
    ok = [r for r in runs if "failed" not in r]
    if not ok:
        return runs[-1]
    best = dict(ok[0])
    for r in ok[1:]:
        for key, value in r.items():
            if key.endswith("per_second"):
                best[key] = max(best[key], value)
            elif key.endswith("rss_mb"):
                best[key] = max(best[key], value)
    best["rounds"] = len(ok)
    return best


def _ratios(mine, reference):
    if "failed" in mine or "failed" in reference:
        return {}
    keys = ("train_images_per_second", "inference_images_per_second_batch1", "inference_images_per_second_batch100")
    ratios = {k.replace("_images_per_second", "_speed"): mine[k] / reference[k] for k in keys
              if k in reference and k in mine}
    ratios["peak_rss"] = mine["peak_rss_mb"] / reference["peak_rss_mb"]
    return ratios


def main():
    parser = harness.arguments(__doc__, "vs_reference.json")
    parser.add_argument("--reference_dir")
    parser.add_argument("--reference_python", default=sys.executable)
    parser.add_argument("--cases", default="paper,small", help="Presets or groups (paper, small), comma-separated.")
    parser.add_argument("--rounds", type=int, default=2, help="Runs per side, alternating with the other sides.")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--train_steps", type=int, default=2)
    parser.add_argument("--infer_steps", type=int, default=3)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--remat", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--preset_config", help=argparse.SUPPRESS)
    parser.add_argument("--mixed_precision", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--precision_cases", default="sa_quadratic_small,resnet18",
                        help="Cases also measured with mixed_bfloat16 and mixed_float16 (sa-conv only).")
    parser.add_argument("--onednn_cases", default="sa_quadratic,resnet18",
                        help="Cases also measured with TensorFlow's oneDNN kernels off (sa-conv only).")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--sides", default="",
                        help="Run only these sides (e.g. sa_conv,reference: leaves out sa_conv_no_remat, which "
                             "needs about 18 GB for sa_content_plus_learned_bias). Default: all.")
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = harness.parse(parser, reference_side)
    if args is None:
        return
    from trainers import process

    if args.side:
        args.remat = "none" if args.side == "sa_conv_no_remat" else "auto"
        if args.side.startswith("sa_conv_mixed_"):
            args.mixed_precision = args.side[len("sa_conv_"):]
        return harness.print_result(sa_conv_side(args))
    if not args.reference_dir and (not args.sides or "reference" in args.sides.split(",")):
        parser.error("--reference_dir (a local clone of epfml/attention-cnn) is required.")
    import tempfile

    from sa_conv import get_config
    from trainers.footprint import training_activation_bytes

    presets = [p for c in args.cases.split(",") if c for p in GROUPS.get(c, [c])]
    report = {"batch": args.batch, "rounds": args.rounds, "process": process.describe(), "cases": {}}
    if args.merge and os.path.exists(args.output):
        with open(args.output) as f:
            stored = json.load(f)
        report["cases"] = stored["cases"]
        for case in report["cases"].values():  # a side without its own date has the report's
            for side, result in case.items():
                if side != "ratios":
                    result.setdefault("date", stored.get("date"))
    report["matmul_gflops_before"] = harness.matmul_peaks()
    with tempfile.TemporaryDirectory() as workdir:
        for index, preset in enumerate(presets):
            config = get_config(preset)
            sides = ["sa_conv", "reference"]
            if config.is_attention and training_activation_bytes(config, args.batch) > 4 * 2**30:
                sides.insert(1, "sa_conv_no_remat")  # the trainer's auto turns remat on: show its cost
            if preset in args.precision_cases.split(","):
                sides[1:1] = ["sa_conv_mixed_bfloat16", "sa_conv_mixed_float16"]
            if preset in args.onednn_cases.split(","):
                sides.insert(1, "sa_conv_no_onednn")
            if args.sides:
                sides = [side for side in sides if side in args.sides.split(",")]
            if index % 2:
                sides.reverse()
            runs = {side: [] for side in sides}
            for round_ in range(args.rounds):
                for side in (sides if round_ % 2 == 0 else sides[::-1]):
                    runs[side].append(_run_side(side, preset, args, workdir))
                    print(f"{preset} {side} round {round_ + 1}: {runs[side][-1]}", flush=True)
            case = {side: _best(r) for side, r in runs.items()}
            if args.merge and preset in report["cases"]:
                # --merge with --sides: the sides not run now stay as stored (each has its date).
                stored = report["cases"][preset]
                case = {**{s: v for s, v in stored.items() if s != "ratios" and s not in case}, **case}
            all_sides = [side for side in case]
            case["ratios"] = {side: _ratios(case[side], case["reference"]) for side in all_sides
                              if side != "reference" and "reference" in case}
            for side in all_sides:
                if side != "sa_conv" and side.startswith("sa_conv") and "sa_conv" in case \
                        and "failed" not in case[side] and "failed" not in case["sa_conv"]:
                    case["ratios"][f"{side}_over_sa_conv"] = _ratios(case[side], case["sa_conv"])
            report["cases"][preset] = case
            report["matmul_gflops_after"] = harness.matmul_peaks()
            harness.write_report(args.output, report)  # after every case: an interrupted run keeps what it measured
    print(json.dumps({p: c["ratios"] for p, c in report["cases"].items()}, indent=1))
    print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
