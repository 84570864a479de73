"""Test accuracy against the number of training images: attention initializations and encodings
beside ResNet18, at equal epochs, over seeds.

    .venv/bin/python -m benchmarks.data_efficiency --data_dir=../shared/datasets/cifar10-mini \\
        [--variants=quadratic,quadratic+convolutional@0.1,content,gated,resnet18] \\
        [--datasets=cifar10-mini:100,cifar10-mini:30,cifar10-mini:10,shapes] [--seeds=0,1,2] [--epochs=8]

Every run is the trainer with its defaults (SGD with momentum, cosine decay after warm-up, batch
100, its 10% validation split) on one variant, one dataset and one seed, made on the study engine
(`trainers.study`: resumable, shareable by several processes); its test accuracy, steps, images
per second and wall time go to ``--output`` as soon as it ends, and a rerun skips the runs the
report already has.

Variants (`parse_variant`): ``ENCODING[+INIT[@STRENGTH]]`` for the attention presets
``sa_ENCODING_small`` (``quadratic``, ``quadratic_full``, ``learned``, ``sinusoidal``, ``mlp``,
``content_plus_learned_bias`` (short: ``content``), ``gated``), with ``INIT`` one of the
trainer's ``--attention_init`` values and ``STRENGTH`` its ``--locality_strength``; and
``resnet18``; ``@STRENGTH/DISTANCE`` also sets ``--locality_distance``.

Datasets (`DATASETS`): ``cifar10-mini:PERCENT``, a class-stratified PERCENT% of the training
images of the CIFAR-10 subset in ``--data_dir`` (the same images for every variant and seed:
chosen with a fixed seed, each smaller subset inside the larger ones), its test batch as the test
split; ``shapes``, a folder of PNG images of our making (`write_shapes_folder`: five classes of
outlined and filled shapes at random places, sizes and colours on cluttered backgrounds; 300
training and 200 test images).

The summary per variant and dataset (pandas) has the mean, the sample standard deviation, the
range and the seeds; `targets` checks the targets the benchmark was built for on it (gated against
content and the other small presets, convolutional against random starts);
``tools/performance_tables.py`` makes the tables of ``docs/attention_init.md`` and the plot from them.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import numpy as np

from benchmarks import harness

SHORT_NAMES = {"content": "content_plus_learned_bias"}
ATTENTION_ENCODINGS = ("quadratic", "quadratic_full", "learned", "sinusoidal", "mlp", "content_plus_learned_bias",
                       "content_with_relative_keys", "gated")
DATASETS = ("cifar10-mini:PERCENT", "shapes")
SUBSET_SEED = 1234  # which images a percentage keeps: the same for every variant and seed
SHAPE_CLASSES = ("circle", "square", "triangle", "cross", "ring")


def _variant_parts(name: str) -> tuple[str, str | None, float | None, float | None]:
    """``(encoding, init, strength, distance)`` of variant ``name`` (``encoding`` in full, or
    ``resnet18``); ValueError naming the forms."""
    if name == "resnet18":
        return name, None, None, None
    match = re.fullmatch(r"([a-z_]+)(?:\+([a-z]+)(?:@([0-9.]+)(?:/([0-9.]+))?)?)?", name)
    encoding = SHORT_NAMES.get(match.group(1), match.group(1)) if match else None
    if encoding not in ATTENTION_ENCODINGS:
        raise ValueError(f"Unknown variant {name!r}: write resnet18 or ENCODING[+INIT[@STRENGTH]] with ENCODING one "
                         f"of {', '.join(ATTENTION_ENCODINGS)} (or content).")
    if match.group(2):
        from sa_conv.attention_init import ATTENTION_INITS  # Keras: only when a variant names one

        if match.group(2) not in ATTENTION_INITS:
            raise ValueError(f"Unknown initialization {match.group(2)!r} in variant {name!r}; choose from "
                             f"{', '.join(ATTENTION_INITS)}.")
    try:
        strength, distance = (None if text is None else float(text) for text in match.group(3, 4))
    except ValueError:
        raise ValueError(f"Variant {name!r}: the strength and distance after @ are numbers, e.g. "
                         f"{match.group(1)}+{match.group(2)}@0.1/2.") from None
    return encoding, match.group(2), strength, distance


def parse_variant(name: str) -> dict:
    """The trainer flags of variant ``name`` (see the module doc); ValueError naming the forms."""
    encoding, init, strength, distance = _variant_parts(name)
    if encoding == "resnet18":
        return {"model": "resnet18"}
    flags = {"model": f"sa_{encoding}_small"}
    if init:
        flags["attention_init"] = init
    if strength is not None:
        flags["locality_strength"] = strength
    if distance is not None:
        flags["locality_distance"] = distance
    return flags


def variant_name(name: str) -> str:
    """The one spelling of variant ``name`` that reports key its runs by: the short encoding
    name (``content``, not ``content_plus_learned_bias``) and numbers in their shortest
    positional form (``learned+convolutional@0.1``, not ``@0.10``), so that two spellings of one variant find
    the same runs. ValueError as `parse_variant`."""
    encoding, init, strength, distance = _variant_parts(name)
    short = {full: short for short, full in SHORT_NAMES.items()}.get(encoding, encoding)
    def number(value):  # positional, so that the name parses again: 0.1, 1, 0.00001
        return np.format_float_positional(value, trim="-")

    return (short + (f"+{init}" if init else "") + ("" if strength is None else f"@{number(strength)}")
            + ("" if distance is None else f"/{number(distance)}"))


def parse_dataset(name: str) -> tuple[str, float | None]:
    """``("cifar10-mini", fraction)`` or ``("shapes", None)``; ValueError otherwise."""
    if name == "shapes":
        return name, None
    match = re.fullmatch(r"cifar10-mini:([0-9.]+)", name)
    if not match or not 0 < float(match.group(1)) <= 100:
        raise ValueError(f"Unknown dataset {name!r}; choose cifar10-mini:PERCENT (0 < PERCENT <= 100) or shapes.")
    return "cifar10-mini", float(match.group(1)) / 100


def stratified_subset(labels: np.ndarray, fraction: float, seed: int = SUBSET_SEED) -> np.ndarray:
    """Sorted indices of ``round(fraction * count)`` images of each class (at least one), drawn in
    one seeded order per class, so a smaller fraction's images are among a larger one's."""
    rng = np.random.default_rng(seed)
    keep = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        order = members[rng.permutation(len(members))]
        keep.append(order[:max(1, int(round(fraction * len(members))))])
    return np.sort(np.concatenate(keep))


def write_cifar_subset(data_dir: str, fraction: float, directory: str) -> tuple[str, int]:
    """Writes ``fraction`` of the training images of the CIFAR-10 files in ``data_dir`` (with
    all of its test images) to ``directory`` in the same format: ``(path, training images)``."""
    from trainers import data as data_lib

    data = data_lib.load_cifar10_files(data_dir)
    keep = stratified_subset(data.train.labels, fraction)
    subset = data_lib.ImageData(data.train.subset(keep), data.test, data.label_names)
    return data_lib.write_cifar10_files(directory, subset), len(keep)


def draw_shape(canvas: np.ndarray, kind: str, rng: np.random.Generator) -> None:
    """Paints one shape of class ``kind`` (`SHAPE_CLASSES`) in one colour into the ``(size, size,
    3)`` float ``canvas``, at a random place, radius (5-10 pixels) and stroke width."""
    size = canvas.shape[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    radius = rng.uniform(5, 10)
    cy, cx = rng.uniform(radius + 1, size - radius - 1, size=2)
    dy, dx = yy - cy, xx - cx
    width = rng.uniform(1.5, 3.0)
    if kind == "circle":
        mask = dy ** 2 + dx ** 2 <= radius ** 2
    elif kind == "ring":
        distance = np.sqrt(dy ** 2 + dx ** 2)
        mask = np.abs(distance - radius) <= width / 2 + 0.3
    elif kind == "square":
        mask = np.maximum(np.abs(dy), np.abs(dx)) <= radius * 0.85
    elif kind == "triangle":  # apex up, base at the bottom
        mask = (dy <= radius * 0.8) & (np.abs(dx) <= (dy + radius) * 0.6)
    else:  # cross
        mask = ((np.abs(dy) <= width) | (np.abs(dx) <= width)) & (np.maximum(np.abs(dy), np.abs(dx)) <= radius)
    colour = rng.uniform(0, 255, size=3)
    canvas[mask] = colour


def shapes_image(kind: str, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """One ``(size, size, 3)`` uint8 image of shape ``kind`` (`SHAPE_CLASSES`) over a noisy
    two-colour gradient with two small distractor blobs."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a, b = rng.uniform(0, 255, size=(2, 3))
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx + np.sin(angle) * yy)[..., None]
    canvas = a + (b - a) * (t - t.min()) / (np.ptp(t) + 1e-6)
    for _ in range(2):  # distractors: small blobs that belong to no class
        cy, cx = rng.uniform(0, size, size=2)
        blob = (np.mgrid[0:size, 0:size][0] - cy) ** 2 + (np.mgrid[0:size, 0:size][1] - cx) ** 2 <= rng.uniform(1, 4)
        canvas[blob] = rng.uniform(0, 255, size=3)
    draw_shape(canvas, kind, rng)
    canvas += rng.normal(0, 12, size=canvas.shape)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def write_shapes_folder(root: str, train_per_class: int = 60, test_per_class: int = 40, seed: int = 0) -> str:
    """Writes the ``shapes`` folder dataset (``train/`` and ``test/``, one PNG folder per class of
    `SHAPE_CLASSES`) under ``root``; returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for kind in SHAPE_CLASSES:
            folder = os.path.join(root, split, kind)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                Image.fromarray(shapes_image(kind, rng)).save(os.path.join(folder, f"{i:04d}.png"))
    return root


def run_key(variant: str, dataset: str, seed: int, epochs: int) -> str:
    return f"{variant}|{dataset}|seed={seed}|epochs={epochs}"


def split_summary_key(key: str) -> tuple[str, str, int]:
    """``(variant, dataset, epochs)`` of a `summarize` key ``variant|dataset|epochs=E``."""
    variant, dataset, epochs = key.split("|")
    return variant, dataset, int(epochs.split("=")[1])


def summarize(runs: dict) -> dict:
    """Per ``variant|dataset|epochs``: the seeds, the mean test accuracy, its sample standard
    deviation (None for one seed) and range."""
    import pandas as pd

    rows = []
    for key, run in runs.items():
        variant, dataset, seed, epochs = key.split("|")
        rows.append((f"{variant}|{dataset}|{epochs}", int(seed.split("=")[1]), run["test_accuracy"]))
    table = pd.DataFrame(rows, columns=["group", "seed", "accuracy"]).sort_values(["group", "seed"])
    stats = table.groupby("group").agg(seeds=("seed", list), mean=("accuracy", "mean"), std=("accuracy", "std"),
                                       min=("accuracy", "min"), max=("accuracy", "max"), n=("accuracy", "count"))
    return {group: {"seeds": [int(s) for s in row.seeds], "mean": float(row["mean"]),
                    "std": float(row["std"]) if row.n > 1 else None, "min": float(row["min"]), "max": float(row["max"])}
            for group, row in stats.iterrows()}


POSITION_ONLY = ("quadratic", "quadratic_full", "learned", "sinusoidal", "mlp")
EXISTING_SMALL = POSITION_ONLY + ("content",)  # the small attention presets the gated one is held against
GATED_MARGIN = 0.03  # the target the benchmark was built for: gated at least 3 points above content
TARGETS = (f"gated >= content + {GATED_MARGIN:g}", "gated >= every small preset", "convolutional >= random")


def targets(summary: dict, sizes: dict | None = None) -> list[dict]:
    """The benchmark's targets, checked on a `summarize` result wherever both sides were measured (a
    dataset at a number of epochs): ``gated`` against ``content`` plus `GATED_MARGIN`; ``gated``
    against the best random-initialized `EXISTING_SMALL` preset; for each `POSITION_ONLY` encoding,
    its convolutional variant with the best mean (its best measured strength) against its random
    one (`TARGETS`, in that order). Each row: the target, dataset, epochs, both variants with mean and seed count, the
    difference of means, what it needs, whether it is met and the larger of the two sides' sample
    standard deviations (``spread``; None with one seed each); in that order of targets, then by
    epochs and by ``sizes`` (``{dataset: training images}``, the report's; unlisted ones last)."""
    by_place: dict[tuple, dict] = {}
    for key, entry in summary.items():
        variant, dataset, epochs = split_summary_key(key)
        by_place.setdefault((dataset, epochs), {})[variant] = entry

    def row(target, place, variant, against, needed):
        ours, theirs = by_place[place][variant], by_place[place][against]
        difference = ours["mean"] - theirs["mean"]
        spreads = [e["std"] for e in (ours, theirs) if e["std"] is not None]
        return {"target": target, "dataset": place[0], "epochs": place[1], "variant": variant, "mean": ours["mean"],
                "seeds": len(ours["seeds"]), "against": against, "against_mean": theirs["mean"],
                "against_seeds": len(theirs["seeds"]), "difference": difference, "needed": needed,
                "met": difference >= needed - 1e-9, "spread": max(spreads) if spreads else None}

    rows = []
    for place, variants in sorted(by_place.items()):
        if "gated" in variants and "content" in variants:
            rows.append(row(TARGETS[0], place, "gated", "content", GATED_MARGIN))
        others = [v for v in EXISTING_SMALL if v in variants]
        if "gated" in variants and others:
            best = max(others, key=lambda v: variants[v]["mean"])
            rows.append(row(TARGETS[1], place, "gated", best, 0.0))
        for encoding in POSITION_ONLY:
            started = [v for v in variants if v.startswith(f"{encoding}+convolutional")]
            if encoding in variants and started:
                best = max(started, key=lambda v: variants[v]["mean"])
                rows.append(row(TARGETS[2], place, best, encoding, 0.0))
    sizes = sizes or {}
    return sorted(rows, key=lambda r: (TARGETS.index(r["target"]), r["epochs"], r["dataset"] not in sizes,
                                       sizes.get(r["dataset"], 0), r["dataset"]))


def prepare(datasets, data_dir: str, directory: str) -> tuple[dict, dict]:
    """Writes each dataset of ``datasets`` once into ``directory`` (shared by a study's processes;
    a folder is renamed into place whole): ``({dataset: its trainer flags}, {dataset: training
    images})``."""
    prepared, sizes = {}, {}
    for dataset in datasets:
        kind, fraction = parse_dataset(dataset)
        target = os.path.join(directory, dataset.replace(":", "_"))
        if not os.path.isdir(target):
            partial = f"{target}.{os.getpid()}.partial"
            if kind == "shapes":
                write_shapes_folder(partial)
            else:
                write_cifar_subset(data_dir, fraction, partial)
            os.makedirs(directory, exist_ok=True)
            try:
                os.replace(partial, target)
            except OSError:  # another process of the study wrote it meanwhile
                if not os.path.isdir(target):
                    raise
                shutil.rmtree(partial, ignore_errors=True)
        if kind == "shapes":
            prepared[dataset] = {"dataset": "folder:" + target}
        else:
            from trainers import data as data_lib

            prepared[dataset] = {"dataset": "cifar10", "data_dir": os.path.join(target, "cifar-10-batches-py")}
            sizes[dataset] = len(data_lib.load_cifar10_files(prepared[dataset]["data_dir"]).train)
    return prepared, sizes


def study_runs(variants, datasets, seeds, epochs: int, prepared: dict):
    """The `trainers.study.Run` of every (dataset, variant, seed), keyed by `run_key` with the
    variant's `variant_name`; ValueError for a variant `parse_variant` refuses."""
    from trainers.study import Run

    return [Run(run_key(variant_name(variant), dataset, seed, epochs),
                {**parse_variant(variant), **prepared[dataset], "epochs": epochs, "seed": seed})
            for dataset in datasets for variant in variants for seed in seeds]


def read_run(model_dir: str, run) -> dict:
    """The study's reader (`trainers.study`): what the trainer's results say of a run."""
    from trainers import run_files

    results = run_files.read_results(model_dir, required=True)
    return {"test_accuracy": results["test_accuracy"], "steps": results["steps"],
            "images_per_second": results["images_per_second"], "wall_seconds": round(results["wall_time_seconds"], 1)}


def keep(reading: dict) -> dict:
    """What the report keeps of a reading: no engine key, no machine's data path."""
    return {**{k: v for k, v in reading.items() if k != "key"},
            "flags": {k: v for k, v in reading["flags"].items() if k != "data_dir"}}


def main():
    parser = harness.arguments(__doc__, "data_efficiency.json", merge=False)
    harness.add_data_dir(parser, help="the CIFAR-10 python-format files the cifar10-mini datasets are cut from")
    parser.add_argument("--directory", default=os.path.join(harness.ROOT, "runs"),
                        help="the study engine's directory (its project 'data_efficiency' holds a folder per run, "
                             "its 'data_efficiency_data' the datasets)")
    parser.add_argument("--variants", default="quadratic,quadratic+convolutional@0.1,content,gated,resnet18")
    parser.add_argument("--datasets", default="cifar10-mini:100")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--note", default=None, help="a note kept in the report (e.g. why fewer seeds)")
    args = harness.parse(parser)

    def items(text):
        return [item.strip() for item in text.split(",") if item.strip()]

    for flag, parse in (("variants", variant_name), ("datasets", parse_dataset)):
        for item in items(getattr(args, flag)):
            try:
                parse(item)
            except ValueError as error:
                parser.error(f"--{flag}: {error}")
    cifar10_dir = harness.cifar10_dir(parser, args.data_dir)
    from trainers import study

    datasets = items(args.datasets)
    prepared, sizes = prepare(datasets, cifar10_dir,
                              os.path.join(os.path.abspath(args.directory), "data_efficiency_data"))
    report = study.Report(args.output, keep=keep, note=args.note)
    written = report.read()
    sizes = {**written.get("training_images", {}), **sizes}
    report.derive = lambda runs: {"training_images": sizes, "summary": summarize(runs)}
    recorded = written["runs"]
    runs = [run for run in study_runs(items(args.variants), datasets, [int(s) for s in items(args.seeds)], args.epochs,
                                      prepared) if run.key not in recorded]
    study.run_study("data_efficiency", runs, read_run, report.record, os.path.abspath(args.directory),
                    log=lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()
