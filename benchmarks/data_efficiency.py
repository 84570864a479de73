"""Test accuracy against the number of training images: attention initializations and encodings beside ResNet18, at
equal epochs, over seeds.

    .venv/bin/python -m benchmarks.data_efficiency --data_dir=../shared/datasets/cifar10-mini \\
        [--variants=quadratic,quadratic+convolutional@0.1,content,gated,resnet18] \\
        [--datasets=cifar10-mini:100,cifar10-mini:30,cifar10-mini:10,shapes] [--seeds=0,1,2] [--epochs=8]

Each run is the trainer with its defaults on a variant (`parse_variant`), dataset (`parse_dataset`: a class-stratified
share of ``--data_dir``'s training images, or the trainer's ``shapes``) and seed, made on the study engine
(`trainers.study`); `summarize` gives the spread over seeds and `targets` checks what the benchmark was built for.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys

import numpy as np

from benchmarks import harness

SHORT_NAMES = {"content": "content_plus_learned_bias"}
# The encodings with a small preset (``sa_ENCODING_small``), which a variant trains; spelled out, so
# that a variant's name is checked without loading Keras.
ATTENTION_ENCODINGS = ("quadratic", "quadratic_full", "learned", "sinusoidal", "mlp", "content_plus_learned_bias",
                       "gated")
SUBSET_SEED = 1234  # which images a percentage keeps: the same for every variant and seed
PRECISION = "float32"  # the study's: its runs name it, so that they keep it whatever the trainer's default
NUMBER_FLAGS = ("locality_strength", "locality_distance")  # a variant's @STRENGTH/DISTANCE
RESNETS = ("resnet18", "resnet20")
log = functools.partial(print, file=sys.stderr, flush=True)  # a study's progress, beside what it prints


def parse_variant(name: str) -> dict:
    """The trainer flags of variant ``resnet18``, ``resnet20`` or ``ENCODING[+INIT[@STRENGTH[/DISTANCE]]]``: the
    preset ``sa_ENCODING_small`` (``content``: ``content_plus_learned_bias``) with ``attention_init``,
    ``locality_strength`` and ``locality_distance``; any of them ``:RECIPE`` for that ``--recipe``
    (`trainers.recipes`); ValueError naming the forms."""
    name, recipe = split_recipe(name)
    if recipe:
        from trainers.recipes import RECIPES

        if recipe not in RECIPES or recipe == "paper":  # the paper's: the variant without a suffix
            raise ValueError(f"Unknown recipe {recipe!r} in variant {name}:{recipe}; choose from "
                             f"{', '.join(r for r in RECIPES if r != 'paper')}.")
        return {**parse_variant(name), "recipe": recipe}
    if name in RESNETS:
        return {"model": name}
    match = re.fullmatch(r"([a-z_]+)(?:\+([a-z]+)(?:@([0-9.]+)(?:/([0-9.]+))?)?)?", name)
    encoding = SHORT_NAMES.get(match.group(1), match.group(1)) if match else None
    if encoding not in ATTENTION_ENCODINGS:
        raise ValueError(f"Unknown variant {name!r}: write {' or '.join(RESNETS)} or ENCODING[+INIT[@STRENGTH]], "
                         f"then :RECIPE if not the paper's, with ENCODING one of {', '.join(ATTENTION_ENCODINGS)} "
                         "(or content).")
    init = match.group(2)
    if init:
        from sa_conv.attention_init import ATTENTION_INITS  # Keras: only when a variant names one

        if init not in ATTENTION_INITS:
            raise ValueError(f"Unknown initialization {init!r} in variant {name!r}; choose from "
                             f"{', '.join(ATTENTION_INITS)}.")
    try:
        numbers = {flag: float(text) for flag, text in zip(NUMBER_FLAGS, match.group(3, 4)) if text}
    except ValueError:
        raise ValueError(f"Variant {name!r}: the strength and distance after @ are numbers, e.g. "
                         f"{match.group(1)}+{init}@0.1/2.") from None
    return {"model": f"sa_{encoding}_small", **({"attention_init": init} if init else {}), **numbers}


def split_recipe(name: str) -> tuple[str, str | None]:
    """``(VARIANT, RECIPE)`` of a variant ``VARIANT:RECIPE``; ``(name, None)`` for one of the paper's recipe."""
    variant, _, recipe = name.partition(":")
    return variant, recipe or None


def variant_name(name: str) -> str:
    """The one spelling of variant ``name`` reports key its runs by, so that two spellings find the same runs: the
    short encoding name, numbers in their shortest positional form (``@0.1``). ValueError as `parse_variant`."""
    flags = parse_variant(name)
    recipe = f":{flags['recipe']}" if "recipe" in flags else ""
    if flags["model"] in RESNETS:
        return flags["model"] + recipe
    encoding = flags["model"].removeprefix("sa_").removesuffix("_small")
    short = {full: short for short, full in SHORT_NAMES.items()}.get(encoding, encoding)
    init = f"+{flags['attention_init']}" if "attention_init" in flags else ""
    numbers = "/".join(np.format_float_positional(flags[f], trim="-") for f in NUMBER_FLAGS if f in flags)
    return short + init + (f"@{numbers}" if numbers else "") + recipe


def parse_dataset(name: str) -> tuple[str, float | None]:
    """``("cifar10-mini", fraction)`` of ``cifar10-mini:PERCENT``, ``("shapes", None)``; ValueError otherwise."""
    if name == "shapes":
        return name, None
    match = re.fullmatch(r"cifar10-mini:([0-9.]+)", name)
    if not match or not 0 < float(match.group(1)) <= 100:
        raise ValueError(f"Unknown dataset {name!r}; choose cifar10-mini:PERCENT (0 < PERCENT <= 100) or shapes.")
    return "cifar10-mini", float(match.group(1)) / 100


def run_key(variant: str, dataset: str, seed: int, epochs: int) -> str:
    return f"{variant}|{dataset}|seed={seed}|epochs={epochs}"


def split_key(key: str) -> tuple:
    """The parts of a run's or a summary's key, each ``NAME=N`` as the integer ``N``: ``(variant, dataset, epochs)``
    of a `summarize` key ``variant|dataset|epochs=E``."""
    return tuple(int(part.split("=")[1]) if "=" in part else part for part in key.split("|"))


def spreads(frame, by, decimals: int | None = None) -> dict:
    """``{group: {"mean", "std", "min", "max", "n"}}`` of the pandas ``frame``'s ``value`` over each ``by`` group, in
    the frame's order: the sample std is None for one row; ``decimals`` rounds the mean and std."""
    def rounded(value):
        return float(value) if decimals is None else round(float(value), decimals)

    stats = frame.groupby(by, sort=False)["value"].agg(["mean", "std", "min", "max", "count"])
    return {group: {"mean": rounded(row["mean"]), "std": rounded(row["std"]) if row["count"] > 1 else None,
                    "min": float(row["min"]), "max": float(row["max"]), "n": int(row["count"])}
            for group, row in stats.iterrows()}


def summarize(runs: dict) -> dict:
    """Per ``variant|dataset|epochs=E``: its ``seeds`` and the test accuracy's `spreads` over them (but ``n``)."""
    import pandas as pd

    rows = []
    for key, run in runs.items():
        variant, dataset, seed, epochs = split_key(key)
        rows.append((f"{variant}|{dataset}|epochs={epochs}", seed, run["test_accuracy"]))
    table = pd.DataFrame(rows, columns=["group", "seed", "value"]).sort_values(["group", "seed"])
    seeds = table.groupby("group", sort=False)["seed"].apply(list)
    return {group: {"seeds": [int(s) for s in seeds[group]], **{k: s[k] for k in ("mean", "std", "min", "max")}}
            for group, s in spreads(table, "group").items()}


POSITION_ONLY = ("quadratic", "quadratic_full", "learned", "sinusoidal", "mlp")
EXISTING_SMALL = POSITION_ONLY + ("content",)  # the small attention presets the gated one is held against
GATED_MARGIN = 0.03  # the target the benchmark was built for: gated at least 3 points above content
TARGETS = (f"gated >= content + {GATED_MARGIN:g}", "gated >= every small preset", "convolutional >= random")


def targets(summary: dict, sizes: dict | None = None) -> list[dict]:
    """`TARGETS` on a `summarize` result, per dataset and budget where both sides ran: ``gated`` against ``content``
    plus `GATED_MARGIN` and against the best `EXISTING_SMALL` preset; each `POSITION_ONLY` encoding's best
    convolutional variant against its random start. Rows (the sides' means and seeds, the difference, what it needs,
    whether met, the larger std as ``spread``) by target, epochs and ``sizes`` (``{dataset: training images}``)."""
    by_place: dict[tuple, dict] = {}
    for key, entry in summary.items():
        variant, dataset, epochs = split_key(key)
        by_place.setdefault((dataset, epochs), {})[variant] = entry

    def row(target, place, variant, against, needed):
        ours, theirs = by_place[place][variant], by_place[place][against]
        difference = ours["mean"] - theirs["mean"]
        stds = [e["std"] for e in (ours, theirs) if e["std"] is not None]
        return {"target": target, "dataset": place[0], "epochs": place[1], "variant": variant, "mean": ours["mean"],
                "seeds": len(ours["seeds"]), "against": against, "against_mean": theirs["mean"],
                "against_seeds": len(theirs["seeds"]), "difference": difference, "needed": needed,
                "met": difference >= needed - 1e-9, "spread": max(stds) if stds else None}

    rows = []
    for place, variants in sorted(by_place.items()):
        if "gated" in variants and "content" in variants:
            rows.append(row(TARGETS[0], place, "gated", "content", GATED_MARGIN))
        others = [v for v in EXISTING_SMALL if v in variants]
        if "gated" in variants and others:
            rows.append(row(TARGETS[1], place, "gated", max(others, key=lambda v: variants[v]["mean"]), 0.0))
        for encoding in POSITION_ONLY:
            started = [v for v in variants if v.startswith(f"{encoding}+convolutional")]
            if encoding in variants and started:
                rows.append(row(TARGETS[2], place, max(started, key=lambda v: variants[v]["mean"]), encoding, 0.0))
    sizes = sizes or {}
    return sorted(rows, key=lambda r: (TARGETS.index(r["target"]), r["epochs"], r["dataset"] not in sizes,
                                       sizes.get(r["dataset"], 0), r["dataset"]))


def prepare(datasets, data_dir: str, directory: str) -> tuple[dict, dict]:
    """Writes each cifar10-mini subset of ``datasets`` once into ``directory`` in CIFAR-10's format (its training
    images' `trainers.data.stratified_subset`, all test images), shared by a study's processes (each renamed into
    place whole): ``({dataset: trainer flags}, {dataset: training images})``."""
    from trainers import data as data_lib

    prepared, sizes, source = {}, {}, None
    for dataset in datasets:
        kind, fraction = parse_dataset(dataset)
        if kind == "shapes":
            prepared[dataset] = {"dataset": "shapes"}
            continue
        target = os.path.join(directory, dataset.replace(":", "_"))
        if not os.path.isdir(target):
            partial = f"{target}.{os.getpid()}.partial"
            source = source or data_lib.load_cifar10_files(data_dir)
            keep = data_lib.stratified_subset(source.train.labels, fraction, SUBSET_SEED)
            data_lib.write_cifar10_files(partial, data_lib.ImageData(source.train.subset(keep), source.test,
                                                                     source.label_names))
            try:
                os.replace(partial, target)
            except OSError:  # another process of the study wrote it meanwhile
                if not os.path.isdir(target):
                    raise
                shutil.rmtree(partial, ignore_errors=True)
        prepared[dataset] = {"dataset": "cifar10", "data_dir": os.path.join(target, "cifar-10-batches-py")}
        sizes[dataset] = len(data_lib.load_cifar10_files(prepared[dataset]["data_dir"]).train)
    return prepared, sizes


def study_runs(variants, datasets, seeds, epochs: int, prepared: dict):
    """The `trainers.study.Run` of every (dataset, variant, seed), keyed by `run_key` with the `variant_name`, in
    `PRECISION` whatever the trainer's default."""
    from trainers.study import Run

    return [Run(run_key(variant_name(variant), dataset, seed, epochs),
                {**parse_variant(variant), **prepared[dataset], "epochs": epochs, "seed": seed,
                 "mixed_precision": PRECISION})
            for dataset in datasets for variant in variants for seed in seeds]


def read_run(model_dir: str, run) -> dict:
    """The study's reader (`trainers.study`): what the trainer's results say of a run."""
    from trainers import run_files

    results = run_files.read_results(model_dir, required=True)
    return {"test_accuracy": results["test_accuracy"], "steps": results["steps"],
            "images_per_second": results["images_per_second"], "wall_seconds": round(results["wall_time_seconds"], 1)}


def keep(reading: dict) -> dict:
    """What a report keeps of a run's reading: not the engine's copy of its key, nor the machine's data path."""
    return {**{k: v for k, v in reading.items() if k != "key"},
            "flags": {k: v for k, v in reading["flags"].items() if k != "data_dir"}}


def items(text: str) -> list[str]:
    """The entries of a comma-separated flag."""
    return [item.strip() for item in text.split(",") if item.strip()]


def main():
    parser = harness.arguments(__doc__, "data_efficiency.json", merge=False)
    harness.add_data_dir(parser, help="the CIFAR-10 files the cifar10-mini datasets are cut from")
    parser.add_argument("--directory", default=os.path.join(harness.ROOT, "runs"), help="the study engine's directory")
    parser.add_argument("--variants", default="quadratic,quadratic+convolutional@0.1,content,gated,resnet18")
    parser.add_argument("--datasets", default="cifar10-mini:100")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--note", help="a note kept in the report (e.g. why fewer seeds)")
    args = harness.parse(parser)
    for flag, parse in (("variants", variant_name), ("datasets", parse_dataset)):
        for name in items(getattr(args, flag)):
            try:
                parse(name)
            except ValueError as error:
                parser.error(f"--{flag}: {error}")
    cifar10_dir = harness.cifar10_dir(parser, args.data_dir)
    from trainers import study  # after the checks: they need no keras-tuner

    directory = os.path.abspath(args.directory)
    datasets = items(args.datasets)
    prepared, sizes = prepare(datasets, cifar10_dir, os.path.join(directory, "data_efficiency_data"))
    report = study.Report(args.output, keep=keep, note=args.note)
    written = report.read()
    sizes = {**written.get("training_images", {}), **sizes}
    report.derive = lambda runs: {"training_images": sizes, "summary": summarize(runs)}
    runs = study_runs(items(args.variants), datasets, [int(s) for s in items(args.seeds)], args.epochs, prepared)
    study.run_study("data_efficiency", [run for run in runs if run.key not in written["runs"]], read_run,
                    report.record, directory, log=log)


if __name__ == "__main__":
    main()
