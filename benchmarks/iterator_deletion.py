"""Seconds the trainer waits when it deletes an epoch's data iterator, after an epoch of a given
length, on one CPU replica, for four input paths:

    .venv/bin/python -m benchmarks.iterator_deletion     # benchmarks/results/iterator_deletion.json

The trainer makes one iterator per epoch (a resumed epoch sees the data the lost one did) and
deletes it when the epoch's steps are done. The paths, on OneDeviceStrategy on the CPU:

* ``tf_defaults``: the pipeline with tf.data's autotuning model on (TensorFlow's default),
  through tf.distribute's per-device iterator (``strategy.experimental_distribute_dataset``);
* ``model_itself``: the model on, the dataset itself;
* ``distributed``: the model off in the pipeline (`trainers.data.TF_DATA_AUTOTUNE`), through
  tf.distribute's per-device iterator, whose own datasets have tf.data's default options;
* ``trainer``: what the trainer does (`trainers.distribute.distribute_dataset`): the model off,
  the dataset itself.

Each side is a process that builds the trainer's training pipeline of cifar10-mini, takes one
epoch's batches at the pace of an epoch of ``--epoch_seconds`` (sleeping in place of the steps, so
that beside a training it costs only the pipeline's augmentation; ``next`` runs eagerly here, in a
tf.function in the trainer), then times the deletion; ``--repeats`` epochs each, with the epoch's
actual length recorded. Nothing here is a test.
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks import harness

# Each side: (tf.data's autotuning model on in the pipeline, through tf.distribute's iterator).
SIDES = {"tf_defaults": (True, True), "model_itself": (True, False), "distributed": (False, True),
         "trainer": (False, False)}
# A deletion that took longer waited for the autotuning model's thread, whose optimization period
# starts at tf.data's 10 ms and doubles on every wake (past this within four); one that does not
# wait only frees buffers. Each side records its deletions' times.
WAITED_SECONDS = 0.1


def measure(side: str, epoch_seconds: float, repeats: int, data_dir: str) -> dict:
    """In this process: ``repeats`` epochs of the trainer's pipeline through ``side``'s path, each
    paced to ``epoch_seconds``; the seconds each iterator's deletion took, and each epoch's."""
    import tensorflow as tf

    from trainers import data as data_lib
    from trainers import distribute, process
    from trainers.config import make_config
    from trainers.task import Task

    data_lib.TF_DATA_AUTOTUNE, through_tf_distribute = SIDES[side]
    config = make_config(overrides=dict(model="sa_learned_small", dataset="cifar10", data_dir=data_dir,
                                        mixed_precision="float32"))
    task = Task(config, log=lambda s: None)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert distribute.one_cpu_replica(strategy)
    batches = len(task.train_split) // config.global_batch_size
    deletions, epochs = [], []
    for epoch in range(repeats):
        dataset = task.train_dataset(epoch)
        distributed = strategy.experimental_distribute_dataset(dataset) if through_tf_distribute \
            else distribute.distribute_dataset(strategy, dataset)
        iterator = iter(distributed)
        started = time.perf_counter()
        for index in range(batches):
            next(iterator)
            time.sleep(max(0.0, started + epoch_seconds * (index + 1) / batches - time.perf_counter()))
        deleting = time.perf_counter()
        del iterator
        deletions.append(round(time.perf_counter() - deleting, 2))
        epochs.append(round(deleting - started, 2))
    return {"deletion_seconds": deletions, "epoch_seconds": epochs, "batches": batches,
            "process": process.describe(task.precision)}


def main() -> None:
    parser = harness.arguments(__doc__, "iterator_deletion.json", merge=False)
    parser.add_argument("--epoch_seconds", default="20,60", help="epoch lengths in seconds, comma-separated")
    parser.add_argument("--repeats", type=int, default=6, help="epochs per side and length")
    harness.add_data_dir(parser)
    args = harness.parse(parser)
    lengths = [float(s) for s in args.epoch_seconds.split(",")]
    if args.side:
        side, _, seconds = args.side.partition("@")
        if side not in SIDES:
            parser.error(f"--side={args.side}: the side is one of {', '.join(SIDES)}, then @ and the epoch's seconds")
        return harness.print_result(measure(side, float(seconds), args.repeats, os.path.abspath(args.data_dir)))
    data_dir = harness.cifar10_dir(parser, args.data_dir)
    from trainers import process

    environment = {**process.child_environment(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    runs, epochs, processes = {side: {} for side in SIDES}, {side: {} for side in SIDES}, {}
    for seconds in lengths:
        for side in SIDES:
            print(f"{side}: {args.repeats} epochs of {seconds:g} s, timing each iterator's deletion ...", flush=True)
            run = harness.run_side(__name__, f"{side}@{seconds:g}", [f"--repeats={args.repeats}",
                                                                    f"--data_dir={data_dir}"],
                                   env=environment)
            processes[side] = run["process"]
            runs[side][f"{seconds:g}"] = run["deletion_seconds"]
            epochs[side][f"{seconds:g}"] = run["epoch_seconds"]
            print(f"    deletion seconds: {run['deletion_seconds']}", flush=True)
    # A deletion waits for the rest of the model thread's sleep or not at all, so the mean (what
    # it costs a run) and how many deletions waited say more than the median.
    summary = {side: {length: {"mean": statistics.mean(values), "max": max(values),
                               "waited": sum(v > WAITED_SECONDS for v in values)}
                      for length, values in per_length.items()} for side, per_length in runs.items()}
    harness.write_report(args.output, {"cpu_class": harness.cpu_class(), "repeats": args.repeats,
                                       "waited_seconds": WAITED_SECONDS,
                                       "batches": run["batches"], "process": processes, "runs": runs,
                                       "epoch_seconds": epochs,
                                       "summary": summary})
    print(summary, flush=True)


if __name__ == "__main__":
    main()
