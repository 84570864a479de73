"""sa-conv and the reference implementation trained side by side on the same data.

    .venv/bin/python -m benchmarks.vs_reference_training --reference_dir=PATH \\
        --reference_python=PYTHON_WITH_TORCH [--encodings=quadratic,learned] [--seeds=0]

``PATH`` is a local clone of ``epfml/attention-cnn`` (its ``models`` package is imported, never
copied; see ``tools/make_reference_fixtures.py`` for the ``bert_utils`` stub); the reference runs
in ``PYTHON_WITH_TORCH`` (any interpreter with torch and NumPy: its side imports neither Keras nor
TensorFlow nor sa_conv).

Both sides get the same images: the training split that ``sa-conv-train`` keeps after holding
out its validation images (seeded), and the test split. sa-conv trains with ``sa-conv-train``
(the ``_small`` preset); the reference with its ``train.py`` loop, transcribed in
`reference_main` (its ``BertImage`` at the same size, ``SGD`` with weight decay on all but the
Gaussian centers and spreads, its ``linear_warmup_cosine_lr_scheduler`` stepped once per epoch,
random crop with 4-pixel zero padding and horizontal flips, cross-entropy). Both: the paper's
optimizer and schedule, attention dropout 0, batch 100, the same epochs. sa-conv runs with
``--lr_update=epoch --momentum_form=pytorch`` by default, the reference's exact update rule (see
`trainers.optimizers`; ``--sa_conv_momentum_form=keras`` for Keras's) and
``--pixel_statistics=reference``, the reference's normalization constants (its std 0.2023 is below
the data's ~0.25; ``--sa_conv_pixel_statistics=data`` for sa-conv's default). ``--reuse_reference``
takes the reference's results for the same encoding, seed and epochs from ``--output`` instead
of training it again (it does not depend on sa-conv's settings; its runs are marked ``reused``). Results (final test
accuracy per side, encoding and seed, and their means) go to JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

import epfml_reference  # standard library only: the reference side has no Keras
from benchmarks import harness

ROOT = harness.ROOT

# The reference variants (sa-conv encoding names) and the sa-conv preset each trains against.
PRESETS = {"quadratic": "sa_quadratic_small", "quadratic_full": "sa_quadratic_full_small",
           "learned": "sa_learned_small", "content_plus_learned_bias": "sa_content_plus_learned_bias_small"}


# ------------------------------------------------------------------------------ reference side


def reference_main(args):
    """Trains the reference's BertImage as its train.py does: its test accuracy and curve."""
    import torch

    models = harness.reference_models(args.reference_dir)

    torch.set_num_threads(os.cpu_count())
    data = np.load(args.data)
    mean, std = np.array(epfml_reference.PIXEL_MEAN, np.float32), np.array(epfml_reference.PIXEL_STD, np.float32)
    config = {**epfml_reference.reference_config(args.encoding, attention_dropout=0.0),
              "optimizer_warmup_ratio": 0.05, "seed": args.seed}
    if args.lockstep_data:
        config["hidden_dropout_prob"] = 0.0
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = models.BertImage(config, num_classes=10)
    if args.lockstep_data:  # sa-conv starts from these weights (imported)
        np.savez(args.lockstep_data + ".init.npz",
                 **{k: v.numpy() for k, v in model.state_dict().items() if not k.endswith(".R")})
        with open(args.lockstep_data + ".config.json", "w") as f:
            json.dump(config, f)
    optimizer = epfml_reference.reference_sgd(model, torch)
    images, labels = data["train_images"], data["train_labels"]
    batch = 100
    batches_per_epoch = -(-len(images) // batch)  # DataLoader without drop_last
    max_steps = args.epochs * (len(images) // batch + 1)  # train.py's T_max
    warmup = int(max_steps * 0.05)

    def lr_lambda(step):  # utils/learning_rate.py
        if step < warmup:
            return step / warmup
        progress = (step - warmup) / (max_steps - warmup)
        return 0.5 * (1 + np.cos(np.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda)
    criterion = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(args.seed)

    def normalize(x):
        return torch.from_numpy(((x.astype(np.float32) / 255.0 - mean) / std).transpose(0, 3, 1, 2).copy())

    def augment(x):  # RandomCrop(32, padding=4) on zero-padded pixels, RandomHorizontalFlip
        padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))
        out = np.empty_like(x)
        for i in range(len(x)):
            dy, dx = rng.integers(0, 9, 2)
            crop = padded[i, dy:dy + 32, dx:dx + 32]
            out[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
        return out

    if args.lockstep_data:
        with np.load(args.lockstep_data) as steps:  # each [key] reads the whole array: once
            xs, ys, rates = steps["images"], steps["labels"], steps["learning_rates"]

    def epoch_batches(epoch):
        """``(uint8 images, labels, learning rate or None: the scheduler's)`` of one epoch."""
        if args.lockstep_data:  # sa-conv's batches (augmented) and learning rates, in its order
            yield from ((xs[epoch, b], ys[epoch, b], float(rates[epoch, b])) for b in range(xs.shape[1]))
            return
        scheduler.step(epoch * batches_per_epoch)  # once per epoch, as train.py
        order = rng.permutation(len(images))
        for b in range(batches_per_epoch):
            index = order[b * batch:(b + 1) * batch]
            yield augment(images[index]), labels[index], None

    global_step, start, curve = 0, time.perf_counter(), []
    for epoch in range(args.epochs):
        model.train()
        losses = []
        for x, y, lr in epoch_batches(epoch):
            if lr is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr
            optimizer.zero_grad()
            loss = criterion(model(normalize(x)), torch.from_numpy(y.astype(np.int64)))
            loss.backward()
            optimizer.step()
            global_step += 1
            losses.append((float(loss), len(y)))
        curve.append({"learning_rate": optimizer.param_groups[0]["lr"],
                      "train_loss": sum(l * n for l, n in losses) / sum(n for _, n in losses)})
    seconds = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for b in range(0, len(data["test_images"]), 500):
            logits = model(normalize(data["test_images"][b:b + 500]))
            correct += int((logits.argmax(1).numpy() == data["test_labels"][b:b + 500]).sum())
    return {"test_accuracy": correct / len(data["test_images"]), "steps": global_step, "train_seconds": seconds,
            "epochs": curve}


# ------------------------------------------------------------------------------ driver


def sa_conv_settings(encoding, seed, args, model_dir):
    """sa-conv-train's settings for one side-by-side run (``--lockstep``: no dropout)."""
    settings = dict(model=PRESETS[encoding], dataset="cifar10", data_dir=args.data_dir, epochs=args.epochs,
                    global_batch_size=100, attention_dropout=0.0, seed=seed, model_dir=model_dir,
                    strategy="one_device", lr_update=args.sa_conv_lr_update,
                    momentum_form=args.sa_conv_momentum_form, pixel_statistics=args.sa_conv_pixel_statistics,
                    mixed_precision="float32")  # the reference trains in float32
    return {**settings, "dropout": 0.0} if args.lockstep else settings


def lockstep_batches(encoding, seed, args, path):
    """Writes sa-conv-train's training batches for ``seed`` (augmented, in its order) and the
    learning rate of every step to ``path`` (npz), from the trainer's own pipeline and schedule."""
    from trainers.config import make_config
    from trainers.task import Task

    config = make_config(overrides=sa_conv_settings(encoding, seed, args, path + ".run"))
    task = Task(config, log=lambda s: None)
    schedule = task.build_schedule(task.total_steps())
    images, labels = [], []
    for epoch in range(args.epochs):
        iterator = iter(task.train_dataset(epoch))  # one device: plain tensors
        batches = [next(iterator) for _ in range(task.steps_per_epoch)]
        images.append(np.stack([b[0].numpy() for b in batches]))
        labels.append(np.stack([b[1].numpy() for b in batches]))
    steps = np.arange(args.epochs * task.steps_per_epoch).reshape(args.epochs, -1)
    rates = np.vectorize(lambda step: float(schedule(step)))(steps)
    np.savez(path, images=np.stack(images), labels=np.stack(labels), learning_rates=rates)


def run_sa_conv(encoding, seed, args, workdir, init_from=None):
    model_dir = os.path.join(workdir, f"sa_conv_{encoding}_{seed}")
    flags = [f"--{k}={v}" for k, v in sa_conv_settings(encoding, seed, args, model_dir).items()]
    start = time.perf_counter()
    from trainers import process

    proc = harness.run_module("trainers.train", flags + ([f"--init_from={init_from}"] if init_from else []),
                              env=process.child_environment())
    if proc.returncode:
        raise RuntimeError(f"sa-conv {encoding} seed {seed} failed:\n{proc.stderr[-3000:]}")
    from trainers import run_files

    results = run_files.read_results(model_dir, required=True)
    configured = run_files.read_config(model_dir)["process"]  # what the run's process ran with
    curve = [{"learning_rate": e["learning_rate"], "train_loss": e["train_loss"]}
             for e in run_files.read_history(model_dir)]
    return {"test_accuracy": results["test_accuracy"], "steps": results["steps"],
            "wall_seconds": time.perf_counter() - start, "epochs": curve, "process": configured}


def run_reference(encoding, seed, args, data_path, lockstep=None):
    flags = [f"--encoding={encoding}", f"--seed={seed}", f"--epochs={args.epochs}",
             f"--reference_dir={args.reference_dir}", f"--data={data_path}",
             *([f"--lockstep_data={lockstep}"] if lockstep else [])]
    start = time.perf_counter()
    result = harness.run_side(__name__, "reference", flags, args.reference_python)
    return {**result, "wall_seconds": time.perf_counter() - start}


def main():
    parser = harness.arguments(__doc__, "vs_reference_training.json")
    parser.add_argument("--reference_dir")
    parser.add_argument("--reference_python", default=sys.executable)
    harness.add_data_dir(parser)
    parser.add_argument("--encodings", default="quadratic,learned")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--sa_conv_lr_update", default="epoch", choices=("step", "epoch"),
                        help="sa-conv's --lr_update; 'epoch' steps the schedule as the reference does.")
    parser.add_argument("--sa_conv_momentum_form", default="pytorch", choices=("keras", "pytorch"),
                        help="sa-conv's --momentum_form; 'pytorch' is the reference's SGD.")
    parser.add_argument("--sa_conv_pixel_statistics", default="reference", choices=("data", "reference"),
                        help="sa-conv's --pixel_statistics; 'reference' normalizes with the reference's constants.")
    parser.add_argument("--reuse_reference", action="store_true",
                        help="Take the reference's results from --output (same encoding, seed, epochs).")
    parser.add_argument("--encoding", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--lockstep_data", help=argparse.SUPPRESS)
    parser.add_argument("--lockstep", action="store_true",
                        help="Both sides from the reference's initial weights (sa-conv imports them, --init_from), "
                             "on sa-conv's batches in its order (augmented) at its learning rates, without dropout: "
                             "what is left is floating-point rounding. Written under 'lockstep' in --output.")
    # Configured before TensorFlow loads: --lockstep reads the trainer's batches here.
    args = harness.parse(parser, reference_main, {"lockstep": "vs_reference_lockstep.json"})
    if args is None:
        return
    if not args.reference_dir:
        parser.error("--reference_dir (a local clone of epfml/attention-cnn) is required.")
    args.data_dir = harness.cifar10_dir(parser, args.data_dir)
    encodings = [e for e in args.encodings.split(",") if e]
    unknown = [e for e in encodings if e not in PRESETS]
    if unknown:  # before either side trains: the report is written at the end
        parser.error(f"--encodings {unknown}: the reference trains {', '.join(PRESETS)}.")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.lockstep:
        lockstep_main(args, encodings, seeds)
        return
    rows = []
    earlier = {}
    if os.path.exists(args.output):
        with open(args.output) as f:
            previous = json.load(f)
        if previous.get("epochs") == args.epochs:
            earlier = {(r["encoding"], r["seed"]): r for r in previous["runs"]}
    with tempfile.TemporaryDirectory() as workdir:
        for seed in seeds:
            data_path, n_train, n_test = _prepare_data(seed, args, workdir)
            for encoding in encodings:
                # Alternate the order so that neither side always runs on a warmer machine.
                sides = [("reference", lambda: run_reference(encoding, seed, args, data_path)),
                         ("sa_conv", lambda: run_sa_conv(encoding, seed, args, workdir))]
                row = {"encoding": encoding, "seed": seed, "train_images": n_train,
                       "test_images": n_test, "sa_conv_momentum_form": args.sa_conv_momentum_form,
                       "sa_conv_pixel_statistics": args.sa_conv_pixel_statistics}
                old = earlier.get((encoding, seed))
                if args.reuse_reference:
                    if not old:
                        raise SystemExit(f"--reuse_reference: {args.output} has no {encoding} seed {seed} run.")
                    row["reference"] = {**old["reference"], "reused": True}
                    sides = [sides[1]]
                if old and "sa_conv" in old:
                    # Earlier sa-conv variants of this row stay, named by what differed.
                    row.update({k: v for k, v in old.items() if k.startswith("sa_conv_") and isinstance(v, dict)})
                    if old.get("sa_conv_momentum_form", "keras") != args.sa_conv_momentum_form:
                        row[f"sa_conv_{old.get('sa_conv_momentum_form', 'keras')}_momentum"] = old["sa_conv"]
                    elif old.get("sa_conv_pixel_statistics", "data") != args.sa_conv_pixel_statistics:
                        row[f"sa_conv_{old.get('sa_conv_pixel_statistics', 'data')}_statistics"] = old["sa_conv"]
                for side, run in (sides if (seed + encodings.index(encoding)) % 2 == 0 else sides[::-1]):
                    row[side] = run()
                    print(f"{encoding} seed {seed} {side}: {row[side]}", flush=True)
                rows.append(row)
    rows = _merged(rows, args.output) if args.merge else rows
    table = _accuracy_table(rows)
    for encoding, entry in table.items():
        mine = [r for r in rows if r["encoding"] == encoding]
        variants = {k for r in mine for k, v in r.items() if k.startswith("sa_conv_") and isinstance(v, dict)}
        for variant in sorted(variants):  # earlier sa-conv variants measured on every seed
            if all(variant in r for r in mine):
                entry[variant] = float(np.mean([r[variant]["test_accuracy"] for r in mine]))
    report = {"date": datetime.date.today().isoformat(), "epochs": args.epochs, "batch_size": 100,
              "attention_dropout": 0.0, "sa_conv_lr_update": args.sa_conv_lr_update,
              "sa_conv_momentum_form": args.sa_conv_momentum_form,
              "sa_conv_pixel_statistics": args.sa_conv_pixel_statistics,
              "data": os.path.relpath(args.data_dir, ROOT), "table": table, "runs": rows}
    harness.write_report(args.output, report)
    print(json.dumps(table, indent=2))
    print(f"Wrote {args.output}")


def _merged(rows, output):
    """``rows`` plus the runs of ``output`` (if any) for other encodings and seeds."""
    if not os.path.exists(output):
        return rows
    with open(output) as f:
        done = {(r["encoding"], r["seed"]) for r in rows}
        return [r for r in json.load(f)["runs"] if (r["encoding"], r["seed"]) not in done] + rows


def _accuracy_table(rows):
    """Per encoding: both sides' mean test accuracy over its seeds, and the difference in points."""
    table = {}
    for encoding in sorted({r["encoding"] for r in rows}):
        mine = [r for r in rows if r["encoding"] == encoding]
        ref = float(np.mean([r["reference"]["test_accuracy"] for r in mine]))
        ours = float(np.mean([r["sa_conv"]["test_accuracy"] for r in mine]))
        table[encoding] = {"reference": ref, "sa_conv": ours, "difference_points": 100 * (ours - ref),
                           "seeds": sorted(r["seed"] for r in mine)}
    return table


def _prepare_data(seed, args, workdir):
    """The reference's copy of the images sa-conv-train uses for ``seed``: its training split
    (after the seeded validation hold-out) and the test split."""
    from trainers import data as data_lib

    dataset = data_lib.load_dataset("cifar10", args.data_dir, seed=seed)
    train, _ = data_lib.split_train_validation(dataset.train, None, seed=seed)  # as sa-conv-train
    path = os.path.join(workdir, f"data_{seed}.npz")
    np.savez(path, train_images=train.images, train_labels=train.labels,
             test_images=dataset.test.images, test_labels=dataset.test.labels)
    return path, len(train), len(dataset.test)


def lockstep_main(args, encodings, seeds):
    """``--lockstep``: per encoding and seed, the reference trains first (writing its initial
    weights), sa-conv imports them and trains with ``--init_from``; both on sa-conv's batches."""
    from sa_conv import reference as reference_lib

    output = args.output
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for seed in seeds:
            data_path, n_train, n_test = _prepare_data(seed, args, workdir)
            for encoding in encodings:
                steps_path = os.path.join(workdir, f"lockstep_{encoding}_{seed}.npz")
                lockstep_batches(encoding, seed, args, steps_path)
                row = {"encoding": encoding, "seed": seed, "train_images": n_train, "test_images": n_test,
                       "reference": run_reference(encoding, seed, args, data_path, lockstep=steps_path)}
                with open(steps_path + ".config.json") as f:
                    config = json.load(f)
                with np.load(steps_path + ".init.npz") as state:
                    model = reference_lib.import_reference(dict(state), config)
                init = os.path.join(workdir, f"init_{encoding}_{seed}.keras")
                model.save(init)
                row["sa_conv"] = run_sa_conv(encoding, seed, args, workdir, init_from=init)
                losses = [(a["train_loss"], b["train_loss"]) for a, b in zip(row["reference"]["epochs"],
                                                                            row["sa_conv"]["epochs"])]
                row["train_loss_differences"] = [b - a for a, b in losses]
                print(f"{encoding} seed {seed}: reference {row['reference']['test_accuracy']}, "
                      f"sa-conv {row['sa_conv']['test_accuracy']}, loss differences {row['train_loss_differences']}",
                      flush=True)
                rows.append(row)
    rows = _merged(rows, output) if args.merge else rows
    table = _accuracy_table(rows)
    report = {"date": datetime.date.today().isoformat(), "epochs": args.epochs, "batch_size": 100,
              "dropout": 0.0, "attention_dropout": 0.0, "sa_conv_lr_update": args.sa_conv_lr_update,
              "sa_conv_momentum_form": args.sa_conv_momentum_form,
              "sa_conv_pixel_statistics": args.sa_conv_pixel_statistics,
              "data": os.path.relpath(args.data_dir, ROOT), "table": table, "runs": rows}
    harness.write_report(output, report)
    print(json.dumps(table, indent=2))
    print(f"Wrote {output}")


if __name__ == "__main__":
    main()
