"""The paper's findings on cifar10-mini: accuracy against epochs and what the heads learned.

Test accuracy and the attention heads' locality, over seeds, at a budget the same for every model.

    .venv/bin/python -m benchmarks.reproduction --dry_run  # the plan, and where each run stands
    .venv/bin/python -m benchmarks.reproduction            # the study: every run docs/reproduction.md reports
    .venv/bin/python -m benchmarks.reproduction --models=gated --seeds=3,4 --output=/tmp/more.json

The study is a plan run on the study engine (`trainers.study`: keras-tuner's oracle, one process
or a chief and workers sharing the plan), a reader of each run and a summary of the recorded runs.
With none of ``--models``, ``--seeds`` and ``--epochs`` the plan is `STUDY`, the runs
``docs/reproduction.md`` reports; with any of them, every model and seed at one budget (`plan`).
Every run is the trainer with its defaults (SGD with momentum, cosine decay after warm-up, batch
100, its 10% validation split) on the CIFAR-10 files of ``--data_dir``, keeping the model
`SNAPSHOTS` times a run. Models (`MODELS`): the small presets ``sa_ENCODING_small`` of the
paper's encodings and ConViT's gated one (``learned``, ``quadratic``, ``content``, ``gated``) and
``resnet18``; any other variant `benchmarks.data_efficiency.parse_variant` names
(``learned+convolutional@0.1``) runs as a comparison.

Each run's snapshots are read (`read_run`): test accuracy and, for attention models, per layer and
head the locality metrics of `sa_conv.inspection`, the quadratic heads' centers and the gated
heads' gates; the whole reading goes to `DETAIL` in the run's directory, the report keeps
`compact_run`'s part (seed 0's attention maps only). `summarize` gives per model and budget the
mean and spread over seeds (pandas), `claims` checks the paper's claims on it;
``tools/performance_tables.py`` makes ``docs/reproduction.md``'s tables and figures from the report.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys

import numpy as np

from benchmarks import data_efficiency, harness

MODELS = ("learned", "quadratic", "resnet18", "content", "gated")
BUDGET = 240  # epochs: the budget the search settled on (docs/reproduction.md, "Choosing the budget")
FIRST_BUDGET = 120  # epochs: the study's budget before the search doubled it
SNAPSHOTS = 12  # snapshots a run besides its initialization
# The runs docs/reproduction.md reports, (models, seeds, epochs), in the order they run: every model at
# the first budget; the search for the budget (twice it, then 60 epochs); every model at the budget,
# three seeds, the content and gated models two (their runs take several times a position-only
# model's); the comparison variant of docs/attention_init.md. Why each was added: the report's notes.
STUDY = ((("learned", "quadratic", "resnet18"), (0, 1, 2), FIRST_BUDGET),
         (("quadratic",), (0, 1, 2), BUDGET),
         (("content",), (0,), FIRST_BUDGET),
         (("learned+convolutional@0.1",), (0, 1, 2), FIRST_BUDGET),
         (("gated",), (0,), FIRST_BUDGET),
         (("learned",), (0, 1, 2), BUDGET),
         (("learned+convolutional@0.1", "resnet18"), (0, 1, 2), BUDGET),
         (("content", "gated"), (0,), BUDGET),
         (("content", "gated"), (1,), BUDGET),
         (("learned", "quadratic"), (0, 1, 2), 60),
         (("resnet18",), (0,), 60))
MAP_DECIMALS = 4  # probabilities of 256 keys: 1e-4 is below what a figure shows
DETAIL = "analysis.json"  # a run's whole reading (`read_run`), in its directory
MAP_SEED = 0  # the seed whose attention maps the report keeps (the figures'); the others', in `DETAIL`


def run_key(model: str, seed: int, epochs: int) -> str:
    return f"{model}|seed={seed}|epochs={epochs}"


def split_key(key: str) -> tuple[str, int, int]:
    """``(model, seed, epochs)`` of a `run_key`."""
    model, seed, epochs = key.split("|")
    return model, int(seed.split("=")[1]), int(epochs.split("=")[1])


def plan(models=None, seeds=None, epochs=None) -> list[tuple[str, int, int]]:
    """The ``(model, seed, epochs)`` runs to make: `STUDY`'s when none of the three is given, else
    every model and seed at ``epochs`` (defaults `MODELS`, seeds 0, 1, 2 and `BUDGET`), model by
    model; each model by its `data_efficiency.variant_name` (ValueError for a name
    `data_efficiency.parse_variant` refuses)."""
    parts = STUDY if models is None and seeds is None and epochs is None else \
        ((MODELS if models is None else [data_efficiency.variant_name(model) for model in models],
          (0, 1, 2) if seeds is None else seeds,
          BUDGET if epochs is None else epochs),)
    return [(model, seed, epochs_) for models_, seeds_, epochs_ in parts for model in models_ for seed in seeds_]


def default_snapshot_every(epochs: int) -> int:
    """Epochs between snapshots: at most `SNAPSHOTS` a run besides the initialization (every
    epoch in runs of fewer epochs); the trainer also keeps the last epoch's."""
    return -(-epochs // SNAPSHOTS)


def summary_key(model: str, epochs: int) -> str:
    """The key of `summarize`'s entry for ``model`` at ``epochs``."""
    return f"{model}|epochs={epochs}"


def split_summary_key(key: str) -> tuple[str, int]:
    """``(model, epochs)`` of a `summary_key`."""
    model, epochs = key.split("|")
    return model, int(epochs.split("=")[1])


def study_runs(runs_to_make, data_dir: str, snapshot_every: int | None = None):
    """The `trainers.study.Run` of each ``(model, seed, epochs)``: only what the study fixes;
    the rest is the trainer's default."""
    from trainers.study import Run

    return [Run(run_key(model, seed, epochs),
                {**data_efficiency.parse_variant(model), "dataset": "cifar10", "data_dir": data_dir,
                 "epochs": epochs, "seed": seed, "snapshot_every": snapshot_every or default_snapshot_every(epochs)})
            for model, seed, epochs in runs_to_make]


def _rounded(value, decimals: int = 5):
    if isinstance(value, float):
        return round(value, decimals)
    if isinstance(value, list):
        return [_rounded(v, decimals) for v in value]
    return value


def analyse_snapshot(model, test, locality_images: int, maps: bool) -> dict:
    """What one snapshot shows.

    Args:
      model: a trained (or initial) classifier taking the test split's images.
      test: the test `trainers.data.Split`.
      locality_images: how many of its first images the attention metrics average over.
      maps: whether to keep every head's map at the grid's center pixel.

    Returns:
      ``test_accuracy``; for attention models ``layers`` (per layer, per head, the
      `sa_conv.inspection.locality_metrics`), ``centers`` (quadratic encodings: per layer
      ``(heads, 2)`` offsets in grid pixels), ``gates`` (gated: per layer ``(heads,)``) and with
      ``maps`` ``query`` and ``maps`` (per layer ``(heads, H, W)``, mean over the images).
    """
    import sa_conv
    from keras import ops
    from sa_conv import heads, inspection, plotting

    logits = model.predict(test.images, batch_size=250, verbose=0)
    result = {"test_accuracy": float(np.mean(np.argmax(logits, -1) == test.labels))}
    if not sa_conv.attention_blocks(model):
        return result
    images = test.images[:locality_images]
    grid, _ = sa_conv.attention_grid(model)
    query = (grid[0] // 2, grid[1] // 2)
    probabilities = plotting.model_attention(model, images)
    gates = heads.head_gates(model)
    result["layers"] = [[{k: _rounded(v) for k, v in head.items()} for head in inspection.locality_metrics(p, grid, gates=g)]
                        for p, g in zip(probabilities, gates)]
    if plotting.has_centers(model):
        result["centers"] = [np.round(np.asarray(ops.convert_to_numpy(b.attention.position_encoding.gaussian()[0]),
                                                 np.float64), 3).tolist() for b in sa_conv.attention_blocks(model)]
    if any(g is not None for g in gates):
        result["gates"] = [None if g is None else np.round(g, 4).tolist() for g in gates]
    if maps:
        result["query"] = list(query)
        result["maps"] = [np.round(inspection.query_maps(p, grid, query).mean(0).astype(np.float64),
                                   MAP_DECIMALS).tolist() for p in probabilities]
    return result


def epoch_seconds(record: dict) -> float:
    """The seconds one epoch of a trainer's ``history.json`` took as a user waits for it: its
    steps, validation and snapshots (``epoch_seconds``), or its steps alone (``train_seconds``)
    for epochs recorded before the trainer timed whole epochs."""
    return record.get("epoch_seconds", record.get("train_seconds", 0.0))


def epoch_cpu(record: dict, reader: str) -> str:
    """The CPU class (`harness.cpu_class`) an epoch of a trainer's ``history.json`` ran on: the
    one it names, or ``reader``'s (the session reading it) for epochs recorded before the trainer
    named it."""
    return record.get("cpu") or reader


def run_timing(history: list, reader: str) -> dict:
    """How fast a run trained, from its trainer's ``history.json`` (one epoch or more) read on the
    CPU class ``reader``: ``cpu``, the class most of its epochs ran on (`epoch_cpu`; on a tie, its
    last epoch's), and ``median_epoch_seconds`` over those epochs alone (`epoch_seconds`; epochs
    slowed by other work, or paused, left out by the median); a run resumed on other classes also
    has ``cpu_epochs``, its epochs per class."""
    order = [epoch_cpu(h, reader) for h in history]
    classes = collections.Counter(order)
    cpu = max(classes, key=lambda c: (classes[c], len(order) - order[::-1].index(c)))
    return {"median_epoch_seconds": round(statistics.median(
                epoch_seconds(h) for h, c in zip(history, order) if c == cpu), 2),
            "cpu": cpu, **({"cpu_epochs": dict(sorted(classes.items()))} if len(classes) > 1 else {})}


def training_minutes(run: dict, epochs: int) -> float:
    """Minutes of training a read ``run`` takes at its median epoch's speed (epochs slowed by
    other work on the machine, or paused, left out) over ``epochs``."""
    return run["median_epoch_seconds"] * epochs / 60


def read_run(model_dir: str, run, locality_images: int = 32, prune_snapshots: bool = False, log=print) -> dict:
    """The study's reader (`trainers.study`): the run in ``model_dir`` as the report keeps it
    (`compact_run`): its results, `run_timing` and every snapshot's `analyse_snapshot` (maps at
    the last). The whole reading, with the per-epoch history and every head's metrics, goes to
    `DETAIL` beside it. Then its checkpoints are deleted and, with ``prune_snapshots``, its
    snapshots but the first and last (ResNet18's are 45 MB each)."""
    import shutil

    import keras

    import json

    from trainers import data as data_lib
    from trainers import files, run_files

    if os.path.exists(os.path.join(model_dir, DETAIL)):  # read before a kill cut its reading short
        with open(os.path.join(model_dir, DETAIL)) as f:
            return compact_run(json.load(f))
    results = run_files.read_results(model_dir, required=True)
    history = run_files.read_history(model_dir)
    test = data_lib.load_cifar10_files(run.flags["data_dir"]).test
    epochs = run_files.snapshot_epochs(model_dir)
    if not epochs or not history:
        raise RuntimeError(f"{model_dir} has no snapshots or no history: train it with --snapshot_every.")
    snapshots = []
    for epoch in epochs:
        log(f"    reading the snapshot at epoch {epoch} ...")
        model = keras.models.load_model(run_files.snapshot_path(model_dir, epoch), compile=False)
        snapshots.append({"epoch": epoch, **analyse_snapshot(model, test, locality_images,
                                                              maps=epoch == epochs[-1])})
        keras.backend.clear_session()
    whole = {
        **{name: results[name] for name in ("test_accuracy", "best_val_accuracy", "best_epoch", "train_accuracy",
                                            "parameters", "images_per_second", "weights_sha256")},
        # The epochs' optimizer steps as they ran; the median epoch is robust to pauses and to
        # epochs slowed by other work on the machine.
        "train_seconds": round(sum(h.get("train_seconds", 0.0) for h in history), 1),
        **run_timing(history, harness.cpu_class()),
        "locality_images": locality_images,
        "flags": {k: v for k, v in run.flags.items() if k != "data_dir"},
        "history": [{k: (round(h[k], 5) if isinstance(h[k], float) else h[k])
                     for k in ("epoch", "train_seconds", "epoch_seconds", "cpu", "train_loss", "train_accuracy",
                               "val_accuracy") if k in h} for h in history],
        "snapshots": snapshots,
    }
    files.write_json(os.path.join(model_dir, DETAIL), whole, inline_numbers=True)
    shutil.rmtree(os.path.join(model_dir, run_files.CHECKPOINTS), ignore_errors=True)
    if prune_snapshots:
        for epoch in set(epochs) - {min(epochs), max(epochs)}:
            os.remove(run_files.snapshot_path(model_dir, epoch))
    return compact_run(whole)


def keep(reading: dict) -> dict:
    """What the report keeps of a run's reading: without the engine's copy of its key and with
    the attention maps of `MAP_SEED` only."""
    run = {k: v for k, v in reading.items() if k != "key"}
    if run["flags"]["seed"] != MAP_SEED:
        run["snapshots"] = [{k: v for k, v in s.items() if k not in ("maps", "query")} for s in run["snapshots"]]
    return run


LAYER_METRICS = ("mean_distance", "mass_3x3", "entropy")
# What the report keeps of each head at each snapshot (per layer, a list over heads per metric).
HEAD_METRICS = (*LAYER_METRICS, "peak_offset")


def layer_summary(heads_metrics: list) -> dict:
    """One layer of one snapshot: each `LAYER_METRICS` averaged over heads, and the most local
    head's distance and mass (the head of smallest mean distance)."""
    local = min(heads_metrics, key=lambda m: m["mean_distance"])
    return {**{name: statistics.fmean(m[name] for m in heads_metrics) for name in LAYER_METRICS},
            "most_local_distance": local["mean_distance"], "most_local_mass": local["mass_3x3"]}


def _compact_snapshot(snapshot: dict) -> dict:
    if "layers" not in snapshot:
        return dict(snapshot)
    kept = {k: v for k, v in snapshot.items() if k != "layers"}
    kept["locality"] = [{name: _rounded(value) for name, value in layer_summary(heads).items()}
                        for heads in snapshot["layers"]]
    kept["heads"] = [{name: [head[name] for head in heads] for name in HEAD_METRICS} for heads in snapshot["layers"]]
    return kept


def compact_run(run: dict) -> dict:
    """``run`` (`read_run`'s whole reading) as the report keeps it: without ``history``, and each snapshot's
    ``layers`` (per layer, per head, `sa_conv.inspection.locality_metrics`) replaced by
    ``locality`` (per layer, `layer_summary`) and ``heads`` (per layer, each of `HEAD_METRICS`
    as a list over the heads). A compact run is returned as it is."""
    return {**{k: v for k, v in run.items() if k != "history"},
            "snapshots": [_compact_snapshot(s) for s in run["snapshots"]]}


def spread(values) -> dict | None:
    """Mean, sample std (None for one value), range and count, as `summarize` gives them."""
    import pandas as pd

    values = [v for v in values if v is not None]
    return _spreads(pd.DataFrame({"group": 0, "value": values}), ["group"])[0] if values else None


def _spreads(frame, by) -> dict:
    """``{group: spread}`` of ``frame``'s ``value`` over the rows of each ``by`` group: mean and
    sample std to 6 decimals (the pages show 3; no std for one row), min, max and count."""
    stats = frame.groupby(by, sort=False)["value"].agg(["mean", "std", "min", "max", "count"])
    return {group: {"mean": round(float(row["mean"]), 6),
                    "std": round(float(row["std"]), 6) if row["count"] > 1 else None,
                    "min": float(row["min"]), "max": float(row["max"]), "n": int(row["count"])}
            for group, row in stats.iterrows()}


def frame(runs: dict):
    """The recorded runs as one long pandas table: a row per run, snapshot (``-1``: the final
    model), layer (``-1``: the whole model) and metric (``test_accuracy``, or a `layer_summary`
    name), its ``value``."""
    import pandas as pd

    rows = []
    for key, run in runs.items():
        model, seed, epochs = split_key(key)
        rows.append((model, epochs, seed, -1, -1, "test_accuracy", run["test_accuracy"]))
        for snapshot in run["snapshots"]:
            rows.append((model, epochs, seed, snapshot["epoch"], -1, "test_accuracy", snapshot["test_accuracy"]))
            rows += [(model, epochs, seed, snapshot["epoch"], layer, name, value)
                     for layer, values in enumerate(snapshot.get("locality", ())) for name, value in values.items()]
    return pd.DataFrame(rows, columns=["model", "epochs", "seed", "snapshot", "layer", "metric", "value"])


def summarize(runs: dict) -> dict:
    """Per ``model|epochs=E``, over its seeds: ``seeds``; ``test_accuracy`` (mean, sample std,
    range, n); ``curve`` (per snapshot epoch every seed has, the test accuracy's spread);
    ``last_quarter_change`` (per seed, the test accuracy at the end minus at the last shared
    snapshot at or before three quarters of the epochs, and not before half; its spread) and
    ``flattened`` (whether its mean magnitude is below the final accuracy's std; None with one
    seed, seeds that end at the same accuracy, or no last quarter); for attention models
    ``locality`` (per snapshot epoch, per layer, each `layer_summary` value's spread);
    ``against_shorter``: None at a model's shortest budget, else the next shorter budget
    (``epochs``), the change of the mean test accuracy from it and ``within_spread`` (at most the
    larger of the two stds; None without one)."""
    table = frame(runs)
    spreads = _spreads(table, ["model", "epochs", "snapshot", "layer", "metric"])
    seeds = table.groupby(["model", "epochs"], sort=False)["seed"].unique()
    summary = {}
    for (model, epochs), members in sorted(seeds.items(), key=lambda item: summary_key(*item[0])):
        members = sorted(int(s) for s in members)
        at = table[(table.model == model) & (table.epochs == epochs)]
        accuracy = at[(at.layer == -1) & (at.snapshot >= 0)]
        counts = accuracy.groupby("snapshot")["seed"].nunique()
        common = sorted(int(e) for e, n in counts.items() if n == len(members))
        final = spreads[model, epochs, -1, -1, "test_accuracy"]
        quarter = max((e for e in common if e <= 0.75 * epochs), default=None)
        quarter = quarter if quarter is not None and quarter >= epochs / 2 and quarter != common[-1] else None
        change = None
        if quarter is not None:
            by_seed = accuracy.pivot(index="seed", columns="snapshot", values="value")
            change = spread((by_seed[common[-1]] - by_seed[quarter]).tolist())
        entry = {"seeds": members, "test_accuracy": final,
                 "curve": {str(e): spreads[model, epochs, e, -1, "test_accuracy"] for e in common},
                 "quarter_epoch": quarter, "last_quarter_change": change,
                 "flattened": None if _noise(final) is None or change is None else abs(change["mean"]) < _noise(final)}
        layers = at[at.layer >= 0].groupby("snapshot")["layer"].max()
        if common and all(e in layers.index and at[(at.snapshot == e) & (at.layer == 0)].seed.nunique() == len(members)
                          for e in common):
            names = (*LAYER_METRICS, "most_local_distance", "most_local_mass")
            entry["locality"] = {str(e): [{name: spreads[model, epochs, e, layer, name] for name in names}
                                          for layer in range(int(layers[e]) + 1)] for e in common}
        summary[summary_key(model, epochs)] = entry
    budgets: dict[str, list[int]] = {}
    for key in summary:
        model, epochs = split_summary_key(key)
        budgets.setdefault(model, []).append(epochs)
    for model, epochs_ in budgets.items():
        epochs_.sort()
        summary[summary_key(model, epochs_[0])]["against_shorter"] = None
        for shorter, longer in zip(epochs_, epochs_[1:]):
            before = summary[summary_key(model, shorter)]["test_accuracy"]
            after = summary[summary_key(model, longer)]["test_accuracy"]
            # The budget doubled, not the last quarter, says whether more epochs move a model: a
            # cosine schedule's last quarter anneals the learning rate, and gains at any budget.
            differs = _differs(before, after)
            summary[summary_key(model, longer)]["against_shorter"] = {
                "epochs": shorter, "change": round(after["mean"] - before["mean"], 6),
                "within_spread": None if differs is None else not differs}
    return summary


def starts_at_random(model: str) -> bool:
    """Whether ``model``'s attention starts from its random initialization (not a convolution)."""
    if model == "resnet18":
        return True
    import sa_conv

    return sa_conv.get_config(data_efficiency.parse_variant(model)["model"]).attention_init == "random"


def main_budget(runs: dict) -> int | None:
    """The epochs at which the most of the study's `MODELS` have a run (on a tie, the most runs,
    then the larger): the study's budget, the others the search for it. Counting models first keeps
    every model in the tables read at it however the runs land, and runs next keeps one seed each
    at a longer budget from replacing three; comparison variants do not choose it."""
    models: dict[int, set] = {}
    counts: dict[int, int] = {}
    for key in runs:
        model, _, epochs = split_key(key)
        if model in MODELS:
            models.setdefault(epochs, set()).add(model)
            counts[epochs] = counts.get(epochs, 0) + 1
    return max(models, key=lambda e: (len(models[e]), counts[e], e)) if models else None


def _noise(spread: dict) -> float | None:
    """The std of a `_spread` that a change is measured against: None with one seed, or with
    seeds that agree exactly, whose 0 measures no change."""
    return spread["std"] or None


def _differs(a: dict, b: dict) -> bool | None:
    """Whether two `_spread` means differ by more than the larger `_noise` (None without one)."""
    spreads = [n for n in map(_noise, (a, b)) if n is not None]
    return abs(a["mean"] - b["mean"]) > max(spreads) if spreads else None


def claims(summary: dict, epochs: int) -> list[dict]:
    """The paper's claims checked on `summarize`'s entries at ``epochs``: each row names the
    claim, the model, what was compared (means with spreads) and a verdict ``held``,
    ``partly`` or ``not here``; models not measured are left out.

    * Localized heads emerge in training (Sec. 4.2, Fig. 4): the first layer's mean attention
      distance falls from the start to the end and its 3x3 mass rises, each beyond the spread
      (models that start at random; ``gated`` starts as a convolution).
    * The first layers attend to close pixels, deeper ones to larger regions: the last layer's
      mean distance at the end is above the first's, beyond the spread (models of two layers
      or more).
    * Attention matches ResNet18's accuracy (Table 1): the model's final test accuracy is within
      the spread of ResNet18's or above it."""
    rows = []
    resnet = summary.get(summary_key("resnet18", epochs))
    for model in MODELS:
        entry = summary.get(summary_key(model, epochs))
        if entry is None:
            continue
        locality = entry.get("locality")
        if locality:
            start, end = locality[min(locality, key=int)], locality[max(locality, key=int)]
        if locality and starts_at_random(model):
            fell = _differs(start[0]["mean_distance"], end[0]["mean_distance"])
            rose = _differs(start[0]["mass_3x3"], end[0]["mass_3x3"])
            closer = end[0]["mean_distance"]["mean"] < start[0]["mean_distance"]["mean"]
            denser = end[0]["mass_3x3"]["mean"] > start[0]["mass_3x3"]["mean"]
            verdict = ("held" if closer and denser and fell and rose else
                       "partly" if closer or denser else "not here")
            rows.append({"claim": "localized heads emerge in the first layer", "model": model,
                         "start": {"mean_distance": start[0]["mean_distance"], "mass_3x3": start[0]["mass_3x3"]},
                         "end": {"mean_distance": end[0]["mean_distance"], "mass_3x3": end[0]["mass_3x3"]},
                         "seeds": len(entry["seeds"]), "verdict": verdict})
        if locality and len(end) > 1:
            first, last = end[0]["mean_distance"], end[-1]["mean_distance"]
            wider = last["mean"] > first["mean"]
            verdict = "held" if wider and _differs(first, last) else "partly" if wider else "not here"
            rows.append({"claim": "deeper layers attend to larger regions", "model": model,
                         "first_layer": first, "last_layer": last, "seeds": len(entry["seeds"]),
                         "verdict": verdict})
        if resnet is not None and model != "resnet18":
            ours, theirs = entry["test_accuracy"], resnet["test_accuracy"]
            gap = round(ours["mean"] - theirs["mean"], 6)
            spread = max([n for n in map(_noise, (ours, theirs)) if n is not None], default=None)
            verdict = ("held" if gap >= 0 or (spread is not None and -gap <= spread) else
                       "partly" if spread is not None and -gap <= 2 * spread else "not here")
            rows.append({"claim": "attention matches ResNet18's accuracy", "model": model, "accuracy": ours,
                         "resnet18": theirs, "difference": gap, "spread": spread, "seeds": len(entry["seeds"]),
                         "verdict": verdict})
    return rows


def efficiency_targets(summary: dict) -> list[dict]:
    """`benchmarks.data_efficiency.targets` (gated against content, convolutional against random
    initialization) on the final test accuracies of `summarize`'s entries, at every budget where
    both sides ran; the dataset is all of ``--data_dir``'s training images, ``cifar10-mini:100``."""
    as_efficiency = {}
    for key, entry in summary.items():
        model, epochs = split_summary_key(key)
        as_efficiency[f"{model}|cifar10-mini:100|epochs={epochs}"] = {**entry["test_accuracy"],
                                                                      "seeds": entry["seeds"]}
    return data_efficiency.targets(as_efficiency)


def least_disturbed_runs(runs) -> dict:
    """``{CPU class: run}``: per CPU class among ``runs`` (read runs, each with its ``cpu``), the
    timed run of the fastest median epoch, the least disturbed by other work on the machine."""
    fastest = {}
    for run in runs:
        cpu = run.get("cpu") or "unknown CPU"
        if run.get("median_epoch_seconds") is not None and (
                cpu not in fastest or run["median_epoch_seconds"] < fastest[cpu]["median_epoch_seconds"]):
            fastest[cpu] = run
    return fastest


CONTENT_GATE = 0.5  # a gate below it weighs a head's content attention above its positional one


def gate_summary(runs) -> list[dict] | None:
    """Per gated layer of ``runs`` (one model and budget, one per seed; those whose first and last
    snapshots record gates), over those runs: ``layer``; ``heads``; ``seeds``, how many runs;
    ``start`` and ``end``, the `_spread` of the mean over the layer's heads of the gate
    ``g_h = sigmoid(lambda_h)`` (`sa_conv.encodings.GatedPositionalEncoding`, the weight on
    positional attention) at the first and last snapshot; ``lowest``, of the smallest head's at
    the end; ``content_heads``, per run the number of heads below `CONTENT_GATE` at the end. None
    without gates."""
    gated = [(run["snapshots"][0]["gates"], run["snapshots"][-1]["gates"]) for run in runs
             if run["snapshots"] and run["snapshots"][0].get("gates") and run["snapshots"][-1].get("gates")]
    layers = [layer for layer in range(len(gated[0][1])) if all(end[layer] is not None for _, end in gated)] \
        if gated else []
    return [{"layer": layer, "heads": len(gated[0][1][layer]), "seeds": len(gated),
             "start": spread(statistics.fmean(start[layer]) for start, _ in gated),
             "end": spread(statistics.fmean(end[layer]) for _, end in gated),
             "lowest": spread(min(end[layer]) for _, end in gated),
             "content_heads": [sum(g < CONTENT_GATE for g in end[layer]) for _, end in gated]}
            for layer in layers] or None


def derive(runs: dict) -> dict:
    """What the report derives from its runs: `summarize`, `main_budget` and `claims`."""
    summary, budget = summarize(runs), main_budget(runs)
    return {"summary": summary, "budget": budget, "claims": claims(summary, budget)}


def main():
    parser = harness.arguments(__doc__, "reproduction.json", merge=False)
    harness.add_data_dir(parser)
    parser.add_argument("--directory", default=os.path.join(harness.ROOT, "runs"),
                        help="the study engine's directory (its project 'reproduction' holds a folder per run); "
                             "shared by every process of a distributed study")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, e.g. {','.join(MODELS)}; other data-efficiency variants "
                             f"(learned+convolutional@0.1) run as comparisons. With none of --models, --seeds "
                             f"and --epochs: every run docs/reproduction.md reports (see --dry_run)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--epochs", type=int, default=None, help=f"the budget (default {BUDGET})")
    parser.add_argument("--snapshot_every", type=int, default=None,
                        help=f"epochs between snapshots, with --epochs (default: epochs / {SNAPSHOTS}, rounded up)")
    parser.add_argument("--locality_images", type=int, default=32, help="test images the locality metrics average over")
    parser.add_argument("--dry_run", action="store_true", help="list the plan's runs and where each stands")
    parser.add_argument("--prune_snapshots", action="store_true", help="delete a read run's snapshots but its first "
                                                                       "and last")
    parser.add_argument("--note", default=None, help="a note kept in the report (e.g. why fewer seeds)")
    args = harness.parse(parser)

    def items(text):
        return [item.strip() for item in text.split(",") if item.strip()]

    if args.snapshot_every is not None and (args.epochs is None or args.snapshot_every < 1):
        parser.error("--snapshot_every needs --epochs and is positive: the study's budgets keep their own spacing.")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be positive, got {args.epochs}.")
    try:
        seeds = None if args.seeds is None else [int(s) for s in items(args.seeds)]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}.")
    try:
        runs_to_make = plan(None if args.models is None else items(args.models), seeds, args.epochs)
    except ValueError as error:
        parser.error(f"--models: {error}")
    if not runs_to_make:
        parser.error("The plan has no run: --models and --seeds each need at least one entry.")
    data_dir = os.path.abspath(harness.cifar10_dir(parser, args.data_dir))
    from trainers import data as data_lib
    from trainers import study

    data = data_lib.load_cifar10_files(data_dir)
    sizes = {"training_images": len(data.train), "test_images": len(data.test)}
    report = study.Report(args.output, derive=lambda runs: {**derive(runs), "data": sizes}, keep=keep, note=args.note)
    recorded = report.read()["runs"]
    runs = study_runs([r for r in runs_to_make if run_key(*r) not in recorded], data_dir, args.snapshot_every)
    if args.dry_run:
        states = study.status("reproduction", runs, args.directory)
        for model, seed, epochs in runs_to_make:
            key = run_key(model, seed, epochs)
            print(f"{key}: {'recorded' if key in recorded else states[key]}")
        return
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    study.run_study("reproduction", runs,
                    lambda model_dir, run: read_run(model_dir, run, args.locality_images, args.prune_snapshots, log),
                    report.record, os.path.abspath(args.directory), log=log)


if __name__ == "__main__":
    main()
