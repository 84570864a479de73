"""The trainer's time per epoch outside its optimizer steps, with tf.data's autotuning model on
(TensorFlow's default) and off (`trainers.data.TF_DATA_AUTOTUNE`, the pipeline's setting), each
run in its own process, alternating A B A B:

    .venv/bin/python -m benchmarks.epoch_overhead        # benchmarks/results/epoch_overhead.json

Each run trains a preset for ``--epochs`` epochs on the CIFAR-10 files of ``--data_dir`` through
the trainer itself and reads its history: per epoch, the wall time of the whole epoch
(``epoch_seconds``: steps, validation, artefacts) less the steps' (``train_seconds``). The
trainer makes one data iterator per epoch; under tf.distribute, deleting it waits for the
autotuning model's thread, whose sleep doubles over the epoch; on one CPU replica the trainer
iterates the dataset itself (benchmarks/iterator_deletion.py), and each result records the trainer
settings it ran with. Both settings train on the same
data in the same order: the final losses are recorded to show it. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks import harness

SIDES = ("autotune_model", "no_model")


def measure(preset: str, autotune: bool, epochs: int, data_dir: str, model_dir: str) -> dict:
    """One run in this process: the trainer for ``epochs`` epochs with the autotuning model on
    or off; per epoch its seconds outside the steps, and the final training loss."""
    from trainers import data as data_lib
    from trainers import process
    from trainers.config import make_config
    from trainers import run_files
    from trainers.train import train

    data_lib.TF_DATA_AUTOTUNE = autotune
    config = make_config(overrides=dict(model=preset, dataset="cifar10", data_dir=data_dir, epochs=epochs, seed=0,
                                        model_dir=model_dir, mixed_precision="float32"))
    train(config, log=lambda s: None)
    history = run_files.read_history(model_dir)
    return {"outside_steps_seconds": [round(h["epoch_seconds"] - h["train_seconds"], 2) for h in history],
            "train_seconds": [round(h["train_seconds"], 2) for h in history],
            "final_train_loss": history[-1]["train_loss"],
            "process": process.describe(run_files.read_precision(model_dir))}


def run_case(preset: str, side: str, epochs: int, data_dir: str) -> dict:
    return harness.run_training_side(__name__, side, [f"--preset={preset}", f"--epochs={epochs}",
                                                      f"--data_dir={data_dir}"])


def main() -> None:
    parser = harness.arguments(__doc__, "epoch_overhead.json", merge=False)
    parser.add_argument("--preset", default="sa_learned_small")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    harness.add_data_dir(parser)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.side:
        return harness.print_result(measure(args.preset, args.side == "autotune_model", args.epochs,
                                            os.path.abspath(args.data_dir), args.model_dir))
    data_dir = harness.cifar10_dir(parser, args.data_dir)
    runs, processes = {side: [] for side in SIDES}, {}
    for repeat in range(args.repeats):
        for side in SIDES:
            print(f"[repeat {repeat + 1}/{args.repeats}] {side}: training {args.preset} for {args.epochs} epochs ...",
                  flush=True)
            run = run_case(args.preset, side, args.epochs, data_dir)
            processes[side] = run.pop("process")
            runs[side].append(run)
            print(f"    seconds outside the steps per epoch: {run['outside_steps_seconds']}", flush=True)
    # The first epoch also traces and compiles the steps: the later epochs show the overhead.
    later = {side: [s for run in runs[side] for s in run["outside_steps_seconds"][1:]] for side in SIDES}
    steps = {side: [s for run in runs[side] for s in run["train_seconds"][1:]] for side in SIDES}
    summary = {side: {"median_outside_steps_seconds": statistics.median(later[side]),
                      "max_outside_steps_seconds": max(later[side]),
                      "median_train_seconds": statistics.median(steps[side])} for side in SIDES}
    same = len({run["final_train_loss"] for side in SIDES for run in runs[side]}) == 1
    harness.write_report(args.output, {"preset": args.preset, "epochs": args.epochs, "cpu_class": harness.cpu_class(),
                                       "process": processes, "runs": runs, "summary": summary,
                                       "same_final_loss": same})
    print(json.dumps({"summary": summary, "same_final_loss": same}))


if __name__ == "__main__":
    main()
