"""A quadratic-encoding model trained at 32x32, evaluated and fine-tuned at 64x64 (CIFAR upsampled).

    .venv/bin/python -m benchmarks.resolution_transfer --data_dir=../shared/datasets/cifar10-mini \\
        --output=benchmarks/results/resolution_transfer.json

What it measures, on the data given (by default the ``cifar10`` python files of ``--data_dir``;
the 64x64 images are the same images upsampled by `trainers.data.resize_and_crop`, not new
detail):

1. ``--model`` trained at 32x32 for ``--epochs`` epochs with the trainer's recipe (`trainers.train`);
   its test accuracy at 32x32;
2. the same weights at 64x64 without fine-tuning (`sa_conv.with_image_size`: the quadratic
   encoding is a function of the offset in grid pixels, so each head keeps its pixel offsets,
   which now cover half the image distance);
3. after ``--fine_tune_epochs`` of fine-tuning at 64x64 from it (``--init_from``, ``--image_size=64``,
   the same recipe over that many epochs at ``--fine_tune_learning_rate``, a tenth of training's by
   default: at training's 0.1 the warm-up's first steps undo what was learned, 0.198 against 0.251
   without fine-tuning in a first run);
4. for scale, the same number of epochs at 64x64 from scratch, at training's learning rate.

``--trained_run=DIR`` takes step 1's run from an earlier call (its ``model.keras`` and
``results.json``) instead of training again.

Small data and few epochs: the accuracies are of this run, not of the paper's 300-epoch models.
Nothing here is a test.
"""

from __future__ import annotations

import json
import os
import tempfile

from benchmarks import harness


def trained_run_differences(recorded: dict, wanted, data_dir: str | None) -> list[str]:
    """What the run whose ``config.json`` is ``recorded`` set otherwise than ``wanted`` (the
    `trainers.config.TrainConfig` this call trains step 1 with, on ``data_dir``): the flags its
    checkpoint follows (`trainers.train.changed_model_flags`), the data's place, the batch, the
    learning rate and the precision."""
    from trainers import run_files
    from trainers import data as data_lib
    from trainers import train as train_lib

    differ = train_lib.changed_model_flags({k: v for k, v in recorded.items() if k != "dataset"}, wanted)
    dataset, recorded_dir = run_files.data_location(recorded)
    source = data_lib.get_source(wanted.dataset)
    name = source.absolute_name()
    if dataset != name or (source.reads_data_dir and recorded_dir != data_dir):
        differ.append(f"data {dataset}{f' in {recorded_dir}' if recorded_dir else ''} (this call: "
                      f"{name}{f' in {data_dir}' if data_dir else ''})")
    differ += [f"--{name}={recorded.get(name)} (this call: --{name}={getattr(wanted, name)})"
               for name in ("global_batch_size", "learning_rate") if recorded.get(name) != getattr(wanted, name)]
    policy = recorded["precision"]["policy"] if "precision" in recorded else recorded.get("mixed_precision")
    if policy != wanted.mixed_precision:
        differ.append(f"precision {policy} (this call trains in {wanted.mixed_precision})")
    return differ


def main():
    parser = harness.arguments(__doc__, "resolution_transfer.json", merge=False)
    parser.add_argument("--model", default="sa_quadratic_small")
    parser.add_argument("--dataset", default="cifar10")
    harness.add_data_dir(parser, help="the --dataset's files: CIFAR-10 python-format files (cifar10-mini) "
                                      "for cifar10, or a tfds data_dir (folder:PATH names its folder itself)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--fine_tune_epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--fine_tune_learning_rate", type=float, default=0.01)
    parser.add_argument("--trained_run", default=None, help="an earlier call's 32x32 run directory")
    args = harness.parse(parser)
    from trainers import process

    import keras

    import sa_conv
    from trainers import distribute, run_files
    from trainers import train as train_lib
    from trainers.config import ConfigError, make_config
    from trainers.task import Task

    from trainers import data as data_lib

    try:
        data_dir = os.path.abspath(args.data_dir) if data_lib.get_source(args.dataset).reads_data_dir else None
    except data_lib.DatasetError as exc:
        parser.error(f"--dataset: {exc}")
    workdir = tempfile.mkdtemp(prefix="resolution_transfer_")
    common = dict(model=args.model, dataset=args.dataset, data_dir=data_dir,
                  global_batch_size=args.batch, eval_batch_size=500, learning_rate=args.learning_rate,
                  strategy="one_device", mixed_precision="float32")

    def config(name, **overrides):
        return make_config(overrides={**common, **overrides, "model_dir": os.path.join(workdir, name)})

    def run(name, **overrides):
        return train_lib.train(config(name, **overrides), log=lambda s: print(f"[{name}] {s}", flush=True))

    fine_tuning = dict(image_size=64, epochs=args.fine_tune_epochs)
    for name, overrides in (("at32", dict(epochs=args.epochs)),  # every run's settings before the first trains
                            ("fine_tuned_at64", dict(fine_tuning, learning_rate=args.fine_tune_learning_rate))):
        try:
            config(name, **overrides)
        except ConfigError as exc:
            raise SystemExit(f"resolution_transfer's {name} run: {exc}") from None
    if args.trained_run:
        at32_dir = args.trained_run
        at32 = run_files.read_results(at32_dir)
        if at32 is None:
            raise SystemExit(f"--trained_run={at32_dir} holds no finished sa-conv-train run (no "
                             f"{run_files.RESULTS}): give a finished run's --model_dir.")
        if at32["epochs"] != args.epochs or at32["model_config"]["image_size"] != 32:
            raise SystemExit(f"--trained_run={at32_dir} trained {at32['epochs']} epochs at "
                             f"{at32['model_config']['image_size']}x{at32['model_config']['image_size']}, not "
                             f"{args.epochs} at 32x32.")
        # The 64x64 runs train with this call's settings: a run of other settings is not their step 1.
        recorded = run_files.read_config(at32_dir)
        if recorded is None:
            raise SystemExit(f"--trained_run={at32_dir} has no {run_files.CONFIG}, so its settings cannot be checked "
                             "against this call's: leave --trained_run out to train step 1 here.")
        differ = trained_run_differences(recorded, config("at32", epochs=args.epochs), data_dir)
        if differ:
            raise SystemExit(f"--trained_run={at32_dir} trained with other settings than this call's: "
                             f"{'; '.join(differ)}. Give this call the run's settings, or leave --trained_run out.")
    else:
        at32 = run("at32", epochs=args.epochs)
        at32_dir = os.path.join(workdir, "at32")
    trained = keras.models.load_model(os.path.join(at32_dir, run_files.MODEL))
    config64 = make_config(overrides={**common, "image_size": 64, "epochs": 1, "model_dir": os.path.join(workdir, "e")})
    task = Task(config64, log=lambda s: None)
    moved = sa_conv.with_image_size(trained, 64)
    zero_shot = distribute.local_evaluate(task, moved, task.test_split)
    tuned = run("fine_tuned_at64", **fine_tuning, learning_rate=args.fine_tune_learning_rate,
                init_from=os.path.join(at32_dir, run_files.MODEL))
    scratch = run("scratch_at64", **fine_tuning)
    report = {
        "model": args.model, "dataset": args.dataset, "data_dir": data_dir and os.path.basename(data_dir),
        "train_images": len(task.train_split), "test_images": len(task.test_split),
        "epochs_at_32": args.epochs, "fine_tune_epochs": args.fine_tune_epochs, "batch": args.batch,
        "learning_rate": args.learning_rate, "fine_tune_learning_rate": args.fine_tune_learning_rate,
        "what_64_means": "the 32x32 images upsampled to 64x64 (shorter side, antialiased bilinear)",
        "test_accuracy": {
            "at_32": at32["test_accuracy"],
            "at_64_without_fine_tuning": float(zero_shot["accuracy"]),
            "at_64_after_fine_tuning": tuned["test_accuracy"],
            "at_64_from_scratch_same_epochs": scratch["test_accuracy"],
        },
        "process": process.describe(),
    }
    harness.write_report(args.output, report)
    print(json.dumps(report["test_accuracy"], indent=2))


if __name__ == "__main__":
    main()
