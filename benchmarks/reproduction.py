"""The paper's findings on cifar10-mini: accuracy against epochs and what the heads learned.

Test accuracy and the attention heads' locality, over seeds, at a budget the same for every model.

    .venv/bin/python -m benchmarks.reproduction --dry_run  # what it would train
    .venv/bin/python -m benchmarks.reproduction            # the study: every run docs/reproduction.md reports
    .venv/bin/python -m benchmarks.reproduction --models=gated --seeds=1,2 --output=/tmp/more.json
    .venv/bin/python -m benchmarks.reproduction --carry    # runs under way, kept for another machine

With none of ``--models``, ``--seeds`` and ``--epochs`` the plan is `STUDY`, the runs
``docs/reproduction.md`` reports (a run recorded in ``benchmarks/results/reproduction.json``
belongs in `STUDY`, so that this command makes it again; a test checks); with any of them it is
every model and seed at one budget (`plan`; defaults `MODELS`, seeds 0, 1, 2 and `BUDGET`
epochs). Every run is one ``sa-conv-train`` process with the trainer's defaults (SGD with
momentum, cosine decay after warm-up, batch 100, its 10% validation split) on the CIFAR-10 files
of ``--data_dir``, keeping the model `SNAPSHOTS` times a run (`default_snapshot_every`;
``--snapshot_every`` overrides it for a plan at one ``--epochs``; `trainers.train`). Models
(`MODELS`): the small presets ``sa_ENCODING_small`` of the paper's encodings and ConViT's gated
one (`benchmarks.data_efficiency.parse_variant`: ``learned``, ``quadratic``, ``content``,
``gated``) and ``resnet18``; any other variant `parse_variant` names
(``learned+convolutional@0.1``) runs as a comparison, asked the data-efficiency benchmark's
questions at this budget (`efficiency_targets`) but not the paper's claims.

Each snapshot is then read (`analyse_snapshot`): its accuracy on the test split and, for attention
models, per layer and head the locality metrics of `sa_conv.inspection` (mean attention distance,
mass in the 3x3 around the most attended pixel, entropy, the most attended offset) averaged over
``--locality_images`` test images and the interior query pixels, the quadratic heads' centers and
the gated heads' gates. The last snapshot also keeps each head's attention map at the grid's center
pixel, averaged over those images (the paper's Figure 5). That whole reading, with the run's
per-epoch history, is written to `DETAIL` in the run's model directory; the report keeps what
``docs/reproduction.md`` reads and each head's `HEAD_METRICS` (`compact_run`: per layer the heads'
`layer_summary` and ``heads``, no history; the maps of one seed per model and budget, the figure's).

Resumable at every level: a run's model directory lives in ``--work_dir`` (outside the
repository), so an interrupted training resumes where it stopped (bit-identical to an
uninterrupted one on the same CPU class); ``--carry`` copies the runs under way into
``--carry_dir``, a folder of the repository, so that committed, they resume on a clean checkout
on another machine too (`carry`, `resume_carried`). A run is written to ``--output`` as soon as
it is read, and a rerun skips the runs the report has, but derives its summary, budget and claims
from every recorded run again (`_derived`), rewriting the report when this version of the
analysis reads them otherwise. Several study processes can share the work (one per core, say, or
one per model with ``--models``): each skips a run another one is training or reading, and writes
the report under a lock of its folder, keeping the runs the others recorded.
`summarize` gives per model and budget the mean and spread over seeds of the final accuracy, of
the learning curve and of the per-layer locality at every snapshot; `claims` checks the paper's
claims on it. Budgets are searched upward: a run at another ``--epochs`` is kept beside the
others, and the report's budget is the one at which the most models have run (`main_budget`;
`BUDGET` once `STUDY` has run). ``tools/performance_tables.py`` makes
``docs/reproduction.md``'s tables and figures from the report.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
import re
import shutil
import statistics
import sys
import time

import numpy as np

from benchmarks import data_efficiency, harness

MODELS = ("learned", "quadratic", "resnet18", "content", "gated")
BUDGET = 240  # epochs: the budget the search settled on (docs/reproduction.md, "Choosing the budget")
FIRST_BUDGET = 120  # epochs: the study's budget before the search doubled it
# Where `carry` keeps the runs under way for a study on another machine: committed, a clean
# checkout resumes them where they stood (`resume_carried`), as a work directory outside the
# repository does not outlive its machine.
CARRY_DIR = os.path.join(harness.ROOT, "benchmarks", "carried_runs")
SNAPSHOTS = 12  # snapshots a run besides its initialization, as the study's runs were made
# The runs docs/reproduction.md reports, (models, seeds, epochs) in the order they run: every model
# at the first budget, three seeds where the CPU time allowed (the content and gated models one),
# the comparison variant of docs/attention_init.md (its three runs, each a fraction of a content or
# gated run, before the gated model's: a study stopped every few hours records them sooner); the
# search for the budget: twice it for the model that climbed most from 60 to 120 (it left the
# budget at 120) and for the learned model (its last quarter at 120 moved it more than its seeds'
# unusually narrow spread there; doubling moved it beyond that spread and made 240 the budget),
# and 60 epochs, where the attention models' curves still climbed; then every model at the budget:
# three seeds, the content and gated models two each (the fewest whose spread tells whether a
# curve flattened: their attention logits depend on the pixels, and their runs take several times
# the position-only models', as long as ResNet18's or longer), the comparison variant's runs first
# and every model's first seed before a second. A run the committed report records belongs here, so that the
# program's default plan makes it again.
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
DETAIL = "analysis.json"  # a run's whole reading (`analyse_run`), in its model directory


def run_key(model: str, seed: int, epochs: int) -> str:
    return f"{model}|seed={seed}|epochs={epochs}"


def split_key(key: str) -> tuple[str, int, int]:
    """``(model, seed, epochs)`` of a `run_key`."""
    model, seed, epochs = key.split("|")
    return model, int(seed.split("=")[1]), int(epochs.split("=")[1])


def run_dir(work_dir: str, model: str, seed: int, epochs: int) -> str:
    """The model directory of one run; a variant's ``@0.1/2`` (strength/distance) nests none."""
    return os.path.join(work_dir, f"{model.replace('/', '-')}_seed{seed}_epochs{epochs}")


def plan(models=None, seeds=None, epochs=None) -> list[tuple[str, int, int]]:
    """The ``(model, seed, epochs)`` runs to make: `STUDY`'s when none of the three is given, else
    every model and seed at ``epochs`` (defaults `MODELS`, seeds 0, 1, 2 and `BUDGET`), model by
    model, each model's seeds in order; each model by its `data_efficiency.variant_name` (ValueError
    for a name `data_efficiency.parse_variant` refuses)."""
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


def train_flags(model: str, seed: int, epochs: int, snapshot_every: int, data_dir: str) -> dict:
    """The trainer flags of one run: only what the study fixes; the rest is the trainer's default."""
    return {**data_efficiency.parse_variant(model), "dataset": "cifar10", "data_dir": data_dir, "epochs": epochs,
            "seed": seed, "snapshot_every": snapshot_every}


def train(flags: dict, model_dir: str) -> None:
    """Runs ``sa-conv-train`` with ``flags`` into ``model_dir`` (resuming what is there), its
    per-epoch lines passed through to this process's output; RuntimeError when it fails."""
    from trainers import process

    args = [f"--{k}={v}" for k, v in {**flags, "model_dir": model_dir}.items()]
    proc = harness.run_module("trainers.train", args, env=process.child_environment(), capture=False)
    if proc.returncode:
        raise RuntimeError(f"sa-conv-train {' '.join(args)} failed (exit {proc.returncode}); its output is above. "
                           f"Rerun the benchmark to resume it.")


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


def analyse_run(model_dir: str, data_dir: str, locality_images: int, log=print) -> dict:
    """The run in ``model_dir`` as read: its results, history and every snapshot's
    `analyse_snapshot` (maps at the last), and its `run_timing` read on this machine's CPU class;
    the report keeps its `compact_run`."""
    import keras

    from trainers import data as data_lib
    from trainers import run_files

    results = run_files.read_results(model_dir, required=True)
    history = run_files.read_history(model_dir)
    test = data_lib.load_cifar10_files(data_dir).test
    epochs = run_files.snapshot_epochs(model_dir)
    if not epochs or not history:
        raise RuntimeError(f"{model_dir} has no snapshots or no history: train it with --snapshot_every "
                           f"(delete the directory to train it again).")
    snapshots = []
    for epoch in epochs:
        log(f"    reading the snapshot at epoch {epoch} ...")
        model = keras.models.load_model(run_files.snapshot_path(model_dir, epoch), compile=False)
        snapshots.append({"epoch": epoch, **analyse_snapshot(model, test, locality_images,
                                                              maps=epoch == epochs[-1])})
        keras.backend.clear_session()
    return {
        "test_accuracy": results["test_accuracy"],
        "best_val_accuracy": results["best_val_accuracy"],
        # Where validation peaked and how far the last epoch fits its training images: whether a
        # model overfits, beside its test accuracy.
        "best_epoch": results["best_epoch"],
        "train_accuracy": results["train_accuracy"],
        "parameters": results["parameters"],
        # The epochs' optimizer steps, timed as they ran (validation and snapshots are outside
        # them, a pause of the process during them inside); the median epoch is robust to pauses
        # and to epochs slowed by other work on the machine (a run beside the test suite).
        "train_seconds": round(sum(h.get("train_seconds", 0.0) for h in history), 1),
        **run_timing(history, harness.cpu_class()),
        "locality_images": locality_images,
        "images_per_second": results["images_per_second"],
        "weights_sha256": results["weights_sha256"],
        "history": [{k: (round(h[k], 5) if isinstance(h[k], float) else h[k])
                     for k in ("epoch", "train_seconds", "epoch_seconds", "cpu", "train_loss", "train_accuracy",
                               "val_accuracy") if k in h}
                    for h in history],
        "snapshots": snapshots,
    }


def _spread(values):
    """Mean, sample std (None for one value), range and count of ``values``, to 6 decimals (the
    page shows 3)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": round(statistics.fmean(values), 6),
            "std": round(statistics.stdev(values), 6) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


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
    """``run`` (`analyse_run`'s) as the report keeps it: without ``history``, and each snapshot's
    ``layers`` (per layer, per head, `sa_conv.inspection.locality_metrics`) replaced by
    ``locality`` (per layer, `layer_summary`) and ``heads`` (per layer, each of `HEAD_METRICS`
    as a list over the heads). A compact run is returned as it is."""
    return {**{k: v for k, v in run.items() if k != "history"},
            "snapshots": [_compact_snapshot(s) for s in run["snapshots"]]}


def is_compact(run: dict) -> bool:
    return "history" not in run and not any("layers" in s for s in run["snapshots"])


def summarize(runs: dict) -> dict:
    """Per ``model|epochs=E``, over its seeds (``runs`` as read or as the report keeps them):
    ``seeds``; ``test_accuracy`` (`_spread`: mean, sample std, range, n); ``curve`` (per snapshot
    epoch, the test accuracy's spread); ``last_quarter_change`` (per seed, the test accuracy at the
    end minus at the last snapshot at or before three quarters of the epochs; its spread) and
    ``flattened`` (whether its mean magnitude is below the final accuracy's std; None with one
    seed, seeds that end at the same accuracy (no spread to measure a change against), or without
    a last quarter); and for attention models ``locality`` (per snapshot epoch, per layer, each
    `layer_summary` value's spread); ``against_shorter``: None at a model's shortest budget, else
    the model's next shorter budget (``epochs``), the change of the mean test accuracy from it
    (``change``) and ``within_spread``: whether that change is at most the larger of the two
    budgets' stds (None when neither has a std)."""
    groups: dict[str, list] = {}
    for key, run in sorted(runs.items()):
        model, seed, epochs = split_key(key)
        groups.setdefault(summary_key(model, epochs), []).append((seed, run))
    summary = {}
    for group, members in groups.items():
        epochs = split_summary_key(group)[1]
        runs_ = [compact_run(run) for _, run in members]
        final = _spread([r["test_accuracy"] for r in runs_])
        snapshot_sets = [{s["epoch"]: s for s in r["snapshots"]} for r in runs_]
        common = sorted(set.intersection(*(set(s) for s in snapshot_sets)))
        curve = {str(e): _spread([s[e]["test_accuracy"] for s in snapshot_sets]) for e in common}
        # The last snapshot at or before three quarters of training; none when the snapshots are
        # too sparse to tell a last quarter from the whole run.
        quarter = max((e for e in common if e <= 0.75 * epochs), default=None)
        quarter = quarter if quarter is not None and quarter >= epochs / 2 else None
        changes = [s[common[-1]]["test_accuracy"] - s[quarter]["test_accuracy"] for s in snapshot_sets] \
            if quarter is not None and common and quarter != common[-1] else []
        change = _spread(changes)
        entry = {"seeds": [seed for seed, _ in members], "test_accuracy": final,
                 "curve": curve,
                 "quarter_epoch": quarter, "last_quarter_change": change,
                 "flattened": (None if _noise(final) is None or change is None
                               else abs(change["mean"]) < _noise(final))}
        if all("locality" in s[e] for s in snapshot_sets for e in common):
            entry["locality"] = {
                str(e): [{name: _spread([s[e]["locality"][layer][name] for s in snapshot_sets])
                          for name in (*LAYER_METRICS, "most_local_distance", "most_local_mass")}
                         for layer in range(len(snapshot_sets[0][e]["locality"]))]
                for e in common}
        summary[group] = entry
    budgets: dict[str, list[int]] = {}
    for group in summary:
        model, epochs = split_summary_key(group)
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


def read_report(path: str) -> dict:
    if not os.path.exists(path):
        return {"runs": {}}
    with open(path) as f:
        return json.load(f)


def describe_plan(runs_to_make, recorded: dict, work_dir: str, cpu: str | None = None,
                  carry_dir: str | None = None) -> list[str]:
    """One line per planned run: its key and whether the report has it (``recorded``), it has a
    model directory in ``work_dir`` or a copy in ``carry_dir`` (`carry`) to resume (at the epoch
    the further along one's ``history.json`` reached), or it is still to train, with the minutes its
    epochs left take on ``cpu`` (a `harness.cpu_class`): from its preset's recorded runs on ``cpu``
    (`estimated_minutes`), else from the median epoch of its preset's planned runs under way on
    ``cpu`` (`_epochs_under_way`), else from recorded runs on another class, said so; a run another
    process is training also names that process (`_held_elsewhere`) and the minutes left at the pace
    of its last epochs (`_recent_pace`). Then the count and the hours of training left, from the
    estimates."""
    from trainers import run_files

    def furthest(model, seed, epochs):
        folders = [run_dir(folder, model, seed, epochs) for folder in (work_dir, carry_dir) if folder]
        return max(folders, key=run_files.checkpointed_epoch)

    histories = {run_key(model, seed, epochs): run_files.read_history(furthest(model, seed, epochs))
                 for model, seed, epochs in runs_to_make if run_key(model, seed, epochs) not in recorded}
    under_way = _epochs_under_way(histories, cpu)
    lines, hours, todo, untimed = [], 0.0, 0, 0
    for model, seed, epochs in runs_to_make:
        key = run_key(model, seed, epochs)
        if key not in histories:
            lines.append(f"{key}: recorded")
            continue
        todo += 1
        done = min(run_files.last_epoch(histories[key]), epochs)
        state = f"to resume after epoch {done} of {epochs}" if done else "to train"
        minutes, timed_on = estimated_minutes(recorded, model, epochs - done, cpu)
        timing = under_way.get(data_efficiency.parse_variant(model)["model"])
        # Epochs under way on this CPU class tell more than a recorded run on another class.
        if timing and (minutes is None or (cpu is not None and timed_on != cpu)):
            seconds, timed_by = timing
            minutes, timed_on = seconds * (epochs - done) / 60, cpu
            state = f"{state} (timed by {_timed_by(key, timed_by)})"
        holder = _held_elsewhere(run_dir(work_dir, model, seed, epochs))
        under_way_in = f", under way in {holder}" if holder else ""
        # The process training it keeps its cores and neighbours: its own last epochs say when it
        # lands better than another run's speed (a run pinned to one core of two takes about twice).
        pace = _recent_pace(histories[key], cpu) if holder else None
        if pace:
            last = "epoch's" if pace[1] == 1 else f"{pace[1]} epochs'"
            under_way_in += f" (about {pace[0] * (epochs - done) / 60:.0f} min at its last {last} pace)"
        if minutes is None:
            untimed += 1
            lines.append(f"{key}: {state} (not timed yet){under_way_in}")
            continue
        hours += minutes / 60
        lines.append(f"{key}: {state}, about {minutes:.0f} min" + (" left" if done else "")
                     + ("" if timed_on == cpu else f" on an {timed_on}") + under_way_in)
    total = ([f"about {hours:.1f} h of training"] if todo > untimed else []) + \
        ([f"{untimed} not timed yet"] if untimed else [])
    return lines + [f"{todo} of {len(lines)} runs to make" + (f": {' and '.join(total)}" if todo else "")]


RECENT_EPOCHS = 10  # the epochs `_recent_pace` reads: the conditions a run trains under now


def _recent_pace(history: list, cpu: str | None) -> tuple[float, int] | None:
    """``(median seconds, epochs)`` of a run's last timed epochs in its ``history.json``, at most
    `RECENT_EPOCHS`, those after its last epoch on another CPU class than ``cpu``; None before any.
    The median leaves out the slow first epoch after a resume."""
    recent = []
    for record in reversed(history):
        if cpu is not None and epoch_cpu(record, cpu) != cpu:
            break
        if epoch_seconds(record):
            recent.append(epoch_seconds(record))
        if len(recent) == RECENT_EPOCHS:
            break
    return (statistics.median(recent), len(recent)) if recent else None


def _timed_by(key: str, timed_by: dict) -> str:
    """Which runs under way time run ``key``: ``timed_by`` is ``{run key: epochs timed}``."""
    def epochs(n):
        return f"{n} epoch{'s' * (n != 1)}"

    if list(timed_by) == [key]:
        return f"its own {epochs(timed_by[key])}"
    return ", ".join(f"{epochs(n)} of {k}" for k, n in timed_by.items())


def _epochs_under_way(histories: dict, cpu: str | None = None) -> dict:
    """``{preset: (median epoch seconds, {run key: epochs timed})}`` over the timed epochs on ``cpu``
    (`epoch_cpu`; any class when None) of ``histories`` (``{run key: its history.json}``, the
    planned runs the report does not have yet), per preset: what times a preset before any of its
    runs is recorded. The first epoch of a run, slowed by the start, is one of many once a run is
    under way for a while, and the median leaves it out."""
    seconds, timed_by = {}, {}
    for key, history in histories.items():
        own = [s for s in (epoch_seconds(record) for record in history
                           if cpu is None or epoch_cpu(record, cpu) == cpu) if s]
        if own:
            preset = data_efficiency.parse_variant(split_key(key)[0])["model"]
            seconds.setdefault(preset, []).extend(own)
            timed_by.setdefault(preset, {})[key] = len(own)
    return {preset: (statistics.median(seconds[preset]), timed_by[preset]) for preset in seconds}


def estimated_minutes(recorded: dict, model: str, epochs: int, cpu: str | None) -> tuple[float | None, str | None]:
    """``(minutes, CPU class)`` ``epochs`` of a ``model`` run take, from the recorded runs of
    its preset (any budget or initialization, per epoch): the fastest median epoch on ``cpu`` (the
    least disturbed run, `least_disturbed_runs`), else on any CPU class; ``(None, None)`` when
    the preset has no timed run."""
    preset = data_efficiency.parse_variant(model)["model"]
    fastest = least_disturbed_runs(
        run for run in recorded.values() if run.get("flags", {}).get("model") == preset)
    if not fastest:
        return None, None
    timed_on = cpu if cpu in fastest else min(fastest, key=lambda c: fastest[c]["median_epoch_seconds"])
    return training_minutes(fastest[timed_on], epochs), timed_on


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
             "start": _spread(statistics.fmean(start[layer]) for start, _ in gated),
             "end": _spread(statistics.fmean(end[layer]) for _, end in gated),
             "lowest": _spread(min(end[layer]) for _, end in gated),
             "content_heads": [sum(g < CONTENT_GATE for g in end[layer]) for _, end in gated]}
            for layer in layers] or None


def measure(output: str, data_dir: str, work_dir: str, runs_to_make, snapshot_every: int | None = None,
            locality_images: int = 32, prune_snapshots: bool = False, note: str | None = None,
            carry_dir: str | None = None, train=train, log=print) -> dict:
    """Trains and reads every ``(model, seed, epochs)`` of ``runs_to_make`` (a `plan`) that the report
    at ``output`` does not have (`train(flags, model_dir)`, resuming a run ``work_dir`` holds; a
    snapshot every ``snapshot_every`` epochs, `default_snapshot_every` when None), writes each run's
    whole reading to `DETAIL` in its model directory and the report after each run, with the runs as
    `_keep_what_the_page_reads` keeps them and what it derives from them (`_derived`: summary,
    budget, claims), and returns it; with nothing to train, rewrites it only where the current
    analysis (or ``note``, or ``data_dir``'s image counts, or runs another study process recorded
    since) reads otherwise than the recorded report. Once a run is read, its checkpoints are deleted
    and, with ``prune_snapshots``, its snapshots but the first and last (ResNet18's are 45 MB each;
    kept, they let a later version of the analysis read the run again). With ``carry_dir``, a run
    that folder holds further along than ``work_dir`` resumes from it (`resume_carried`), and a
    run's copy there is deleted once the run is recorded. A run another process is training or
    reading (it holds the model directory's lock, `_claimed`) is skipped, left to that process to
    record, so that several study processes can share one plan."""
    # One spelling per variant, so that a run resumes under any of its names; ValueError naming
    # the forms before any run.
    runs_to_make = [(data_efficiency.variant_name(model), seed, epochs) for model, seed, epochs in runs_to_make]
    if not runs_to_make:
        raise ValueError("The plan has no run: give at least one model and seed.")
    for model, _, epochs in runs_to_make:
        if epochs < 1:
            raise ValueError(f"--epochs must be positive, got {epochs}.")
    if snapshot_every is not None and snapshot_every < 1:
        raise ValueError(f"--snapshot_every must be positive, got {snapshot_every}.")
    from trainers import data as data_lib
    from trainers import run_files

    data = data_lib.load_cifar10_files(data_dir)  # fails here, before any run, on a wrong --data_dir
    report = read_report(output)
    runs = report.setdefault("runs", {})
    notes = report.setdefault("notes", [])
    if note and note not in notes:
        notes.append(note)
    report["data"] = {"training_images": len(data.train), "test_images": len(data.test)}
    if carry_dir:
        resume_carried(runs_to_make, runs, work_dir, carry_dir, log)
    for index, (model, seed, epochs) in enumerate(runs_to_make, 1):
        key = run_key(model, seed, epochs)
        _add_recorded_since(report, output)
        if key in runs:
            continue
        model_dir = run_dir(work_dir, model, seed, epochs)
        flags = train_flags(model, seed, epochs, snapshot_every or default_snapshot_every(epochs), data_dir)
        start = time.perf_counter()

        def train_run():
            log(f"[{index}/{len(runs_to_make)}] {key}: training in {model_dir} ...")
            train(flags, model_dir)

        with _claimed(model_dir, train_run) as holder:
            if holder:
                # Another study process (one per core, say) has it, and records it.
                log(f"[{index}/{len(runs_to_make)}] {key}: skipped, left to {holder}, which holds its "
                    f"folder's lock")
                continue
            _add_recorded_since(report, output)
            if key in runs:  # another process read it between this one's look and its lock
                continue
            log(f"[{index}/{len(runs_to_make)}] {key}: reading its snapshots ...")
            run = analyse_run(model_dir, data_dir, locality_images, log=log)
            run["flags"] = {k: v for k, v in flags.items() if k != "data_dir"}
            run["session_seconds"] = round(time.perf_counter() - start, 1)
            _write_detail(os.path.join(model_dir, DETAIL), run)
            with _report_lock(output):
                _add_recorded_since(report, output)
                runs[key] = compact_run(run)
                _keep_what_the_page_reads(runs, work_dir)
                report.update(_derived(runs))
                _write(output, report)
            log(f"[{index}/{len(runs_to_make)}] {key}: test accuracy {run['test_accuracy']:.4f} "
                f"({training_minutes(run, epochs):.0f} min of training at the median epoch's speed)")
            shutil.rmtree(os.path.join(model_dir, run_files.CHECKPOINTS), ignore_errors=True)
            if carry_dir:
                shutil.rmtree(run_dir(carry_dir, model, seed, epochs), ignore_errors=True)
            if prune_snapshots:
                taken = run_files.snapshot_epochs(model_dir)
                for epoch in set(taken) - {min(taken), max(taken)}:
                    os.remove(run_files.snapshot_path(model_dir, epoch))
    with _report_lock(output):
        recorded = _add_recorded_since(report, output)
        if runs:
            _keep_what_the_page_reads(runs, work_dir)
            report.update(_derived(runs))
            if _content(report) != _content(recorded):
                # An earlier version of the analysis may have derived them otherwise, or another
                # study process recorded runs since this one's last write; the runs stay as measured.
                _write(output, report)
                log(f"{output}: rewritten, its {len(runs)} runs read again by the current analysis")
    return report


def carry(runs_to_make, recorded: dict, work_dir: str, carry_dir: str, log=print) -> list[str]:
    """Copies into ``carry_dir`` each run of ``runs_to_make`` that ``work_dir`` holds under way (with
    a checkpoint, and not among ``recorded``, the report's runs) as far as resuming it needs: its
    config, history, best model and snapshots and its newest complete checkpoint, not its
    TensorBoard logs nor older checkpoints. A copy replaces the run's earlier one whole, and only
    once it is complete; the copies of runs ``recorded`` has are deleted. Kept where the work
    directory is not (a folder of the repository, committed), they let a study on another machine
    resume those runs where they stood (`resume_carried`) instead of at their first epoch. A run
    can be carried while it trains. Returns the keys of the runs copied."""
    from trainers import run_files

    os.makedirs(carry_dir, exist_ok=True)
    copied = []
    for model, seed, epochs in runs_to_make:
        key = run_key(model, seed, epochs)
        carried = run_dir(carry_dir, model, seed, epochs)
        if key in recorded:
            shutil.rmtree(carried, ignore_errors=True)
            continue
        source, partial = run_dir(work_dir, model, seed, epochs), f"{carried}.partial"
        for attempt in range(3):
            epoch = run_files.checkpointed_epoch(source)
            if epoch <= run_files.checkpointed_epoch(carried):
                break
            shutil.rmtree(partial, ignore_errors=True)
            try:
                _copy_resumable(source, partial, epoch)
            except BaseException as error:
                shutil.rmtree(partial, ignore_errors=True)
                # FileNotFoundError: the trainer deleted that checkpoint meanwhile, having written newer ones.
                if isinstance(error, FileNotFoundError) and attempt < 2:
                    continue
                raise
            shutil.rmtree(carried, ignore_errors=True)
            os.replace(partial, carried)
            copied.append(key)
            log(f"{key}: carried after epoch {epoch} into {carried}")
            break
    return copied


def resume_carried(runs_to_make, recorded: dict, work_dir: str, carry_dir: str, log=print) -> list[str]:
    """Puts back into ``work_dir`` each run of ``runs_to_make`` that ``carry_dir`` holds (`carry`)
    further along than ``work_dir``'s copy of it, by their newest checkpoints, unless ``recorded``
    has it or ``work_dir``'s copy is finished or in use by a trainer (`trainers.files.held`): the
    trainer then resumes it after the carried checkpoint's epoch. Returns their keys."""
    from trainers import files, run_files

    resumed = []
    for model, seed, epochs in runs_to_make:
        key = run_key(model, seed, epochs)
        carried, target = run_dir(carry_dir, model, seed, epochs), run_dir(work_dir, model, seed, epochs)
        if key in recorded or run_files.finished(target) or \
                run_files.checkpointed_epoch(carried) <= run_files.checkpointed_epoch(target):
            continue
        try:
            with files.held(target, wait=False, what="training in"):
                # The carried state file names only the carried checkpoint: the older ones would be
                # left behind, never restored nor deleted.
                shutil.rmtree(os.path.join(target, run_files.CHECKPOINTS), ignore_errors=True)
                shutil.copytree(carried, target, dirs_exist_ok=True)
        except files.Busy as busy:
            log(f"{key}: not resumed from {carried}: {busy}")
            continue
        resumed.append(key)
        log(f"{key}: resumes after epoch {run_files.checkpointed_epoch(target)}, carried in {carried}")
    return resumed


def _copy_resumable(source: str, target: str, epoch: int) -> None:
    """Copies what resuming the run in model directory ``source`` after ``epoch`` needs into a new
    folder ``target`` (`carry`): FileNotFoundError when that checkpoint has gone meanwhile."""
    from trainers import files, run_files

    os.makedirs(os.path.join(target, run_files.CHECKPOINTS))
    checkpoint = os.path.join(source, run_files.CHECKPOINTS, f"ckpt-{epoch}")
    written = os.path.getmtime(f"{checkpoint}.index")
    for name in (run_files.CONFIG, run_files.HISTORY, run_files.BEST_MODEL):
        path = os.path.join(source, name)
        # A best model saved after the checkpoint is of an epoch the resumed run trains again, which
        # saves one when it beats the history's best; nothing the study reads needs it.
        if os.path.exists(path) and (name != run_files.BEST_MODEL or os.path.getmtime(path) <= written):
            shutil.copy2(path, os.path.join(target, name))
    for snapshot in run_files.snapshot_epochs(source):
        if snapshot <= epoch:
            os.makedirs(os.path.dirname(run_files.snapshot_path(target, snapshot)), exist_ok=True)
            shutil.copy2(run_files.snapshot_path(source, snapshot), run_files.snapshot_path(target, snapshot))
    for name in os.listdir(os.path.dirname(checkpoint)):
        if name.startswith(f"ckpt-{epoch}."):
            shutil.copy2(os.path.join(os.path.dirname(checkpoint), name), os.path.join(target, run_files.CHECKPOINTS, name))
    if not os.path.exists(f"{checkpoint}.index"):
        raise FileNotFoundError(f"{checkpoint}.index")
    # Last, so that a folder with a state file is a whole copy. The manager lists only the
    # checkpoints written after its last preserved time, hence the two times.
    files.write_text(os.path.join(target, run_files.CHECKPOINTS, run_files.CHECKPOINT_STATE),
                     f'model_checkpoint_path: "ckpt-{epoch}"\nall_model_checkpoint_paths: "ckpt-{epoch}"\n'
                     f"all_model_checkpoint_timestamps: {written}\nlast_preserved_timestamp: {written - 1}\n")


def _keep_what_the_page_reads(runs: dict, work_dir: str) -> None:
    """Makes ``runs`` what the report keeps: every run `compact_run` (one an earlier version of
    the study recorded whole first has its reading written to `DETAIL` in its model directory in
    ``work_dir``, unless that holds one already), and the last snapshot's maps only in the
    lowest seed's run of each model and budget (at the report's budget, the page's figures after
    the paper's Figure 5)."""
    lowest: dict[tuple[str, int], int] = {}
    for key in runs:
        model, seed, epochs = split_key(key)
        lowest[model, epochs] = min(seed, lowest.get((model, epochs), seed))
    for key, run in runs.items():
        model, seed, epochs = split_key(key)
        if not is_compact(run):
            detail = os.path.join(run_dir(work_dir, model, seed, epochs), DETAIL)
            if not os.path.exists(detail):
                _write_detail(detail, run)
            run = runs[key] = compact_run(run)
        if seed != lowest[model, epochs]:
            for snapshot in run["snapshots"]:
                snapshot.pop("maps", None)
                snapshot.pop("query", None)


@contextlib.contextmanager
def _claimed(model_dir: str, train_run):
    """The run in ``model_dir`` for this study process to read: trains it first with ``train_run()``
    (`train`) unless finished, then yields None holding its lock (`trainers.files.held`) so that no
    other study process reads it too, nor the snapshots this one prunes; yields the holder
    (`_held_elsewhere`) instead when another process trains or reads it, including when this one's
    trainer failed because another's, started at the same moment, took the lock first."""
    from trainers import files, run_files

    holder = _held_elsewhere(model_dir)
    if not holder and not run_files.finished(model_dir):
        try:
            train_run()
        except RuntimeError:
            holder = _held_elsewhere(model_dir, try_lock=True)
            if not holder:
                raise
    with contextlib.ExitStack() as stack:
        if not holder:
            try:
                stack.enter_context(files.held(model_dir, wait=False, what="reading"))
            except files.Busy:
                holder = _held_elsewhere(model_dir) or "another process"
        yield holder


def _held_elsewhere(model_dir: str, try_lock: bool = False) -> str | None:
    """Which process holds ``model_dir``'s lock (`trainers.files.held`: a trainer training there,
    or a study process reading the finished run), as ``"process N"``, or ``"another process"``;
    None when none does. Read from ``/proc/locks`` where the system has it, taking no lock that a
    trainer starting at that moment would find taken; by trying the lock where it has none, or with
    ``try_lock`` where ``/proc/locks`` names nobody (it does not show a lock of another PID
    namespace, nor, on some file systems, match the folder's device)."""
    from trainers import files

    holder = files.lock_holder(model_dir)
    if holder is not None:
        return f"process {holder}"
    if (os.path.exists("/proc/locks") and not try_lock) or not os.path.isdir(model_dir):
        return None
    try:
        with files.held(model_dir, wait=False):
            return None
    except files.Busy:
        return "another process"


def _write_detail(path: str, run: dict) -> None:
    from trainers import files

    files.write_json(path, run, inline_numbers=True)


def _report_lock(output: str):
    """The report's folder lock, held while a study process reads, merges and writes the report,
    so that two processes' writes cannot cross (`trainers.files.held`)."""
    from trainers import files

    return files.held(os.path.dirname(os.path.abspath(output)))


def _add_recorded_since(report: dict, output: str) -> dict:
    """Adds to ``report`` the runs and notes the report at ``output`` holds and ``report`` lacks:
    those another study process recorded since this one read it (each writes all it knows after
    each run, which would otherwise drop them). A run in both stays as this process has it: runs
    are written once, as measured. Returns the report read from ``output``."""
    recorded = read_report(output)
    for key, run in recorded.get("runs", {}).items():
        # A copy: the runs are then kept as the report keeps them (`_keep_what_the_page_reads`),
        # and ``recorded`` must stay as read to tell whether that changed anything.
        report["runs"].setdefault(key, copy.deepcopy(run))
    report["notes"] += [note for note in recorded.get("notes", []) if note not in report["notes"]]
    return recorded


def _content(report: dict) -> dict:
    """A copy of ``report`` without the date and machine record that every write stamps."""
    return copy.deepcopy({k: v for k, v in report.items() if k not in ("date", "machine")})


def _derived(runs: dict) -> dict:
    """What the report derives from its runs: `summarize`, `main_budget` and `claims`."""
    summary, budget = summarize(runs), main_budget(runs)
    return {"summary": summary, "budget": budget, "claims": claims(summary, budget)}


def _write(output: str, report: dict) -> None:
    """Writes ``report`` without the date and machine record of its last write (`_content`):
    `harness.write_report` stamps those of this write, which may only have read the runs again;
    each run keeps its own CPU class."""
    harness.write_report(output, _content(report), inline_numbers=True)


def main():
    parser = harness.arguments(__doc__, "reproduction.json", merge=False)
    harness.add_data_dir(parser)
    parser.add_argument("--work_dir", default=os.path.join(harness.ROOT, "runs", "reproduction"),
                        help="the runs' model directories: an interrupted run resumes from here")
    parser.add_argument("--carry_dir", default=None,
                        help="where --carry copies the runs under way, and where a study resumes a run from "
                             "when this folder has it further along than --work_dir; a folder of the "
                             "repository: committed, it carries the runs to a clean checkout on another machine "
                             "(default: benchmarks/carried_runs with the default --output, none with another)")
    parser.add_argument("--carry", action="store_true",
                        help="copy the plan's runs under way in --work_dir into --carry_dir (config, history, "
                             "best model, snapshots, newest checkpoint), delete the copies of the runs --output "
                             "records, and train nothing; a study may be training them meanwhile")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, e.g. {','.join(MODELS)}; other data-efficiency variants "
                             f"(learned+convolutional@0.1) run as comparisons. With none of --models, --seeds "
                             f"and --epochs: every run docs/reproduction.md reports (see --dry_run); with any of "
                             f"them, every model and seed at one budget, the others' defaults {','.join(MODELS)}, "
                             f"0,1,2 and {BUDGET}")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--epochs", type=int, default=None, help=f"the budget, the same for every model "
                                                                  f"(default {BUDGET})")
    parser.add_argument("--snapshot_every", type=int, default=None,
                        help=f"epochs between snapshots, with --epochs (default: epochs / {SNAPSHOTS}, "
                             f"rounded up)")
    parser.add_argument("--locality_images", type=int, default=32,
                        help="test images the locality metrics average over")
    parser.add_argument("--dry_run", action="store_true",
                        help="list the plan's runs, which the report has and how long the others take "
                             "on this CPU class (from the recorded runs, or for a model no recorded run timed, "
                             "its runs under way), and train nothing")
    parser.add_argument("--prune_snapshots", action="store_true",
                        help="delete a read run's snapshots but its first and last")
    parser.add_argument("--note", default=None, help="a note kept in the report (e.g. why fewer seeds)")
    args = harness.parse(parser)

    def items(text):
        return [item.strip() for item in text.split(",") if item.strip()]

    if args.snapshot_every is not None and args.epochs is None:
        parser.error("--snapshot_every needs --epochs: the study's budgets each keep their own spacing.")
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
    carry_dir = args.carry_dir or (CARRY_DIR if os.path.abspath(args.output) == os.path.abspath(
        parser.get_default("output")) else None)
    if args.carry:
        if carry_dir is None:
            parser.error("--carry with another --output needs --carry_dir: the committed folder carries the "
                         "runs of the committed report.")
        if not carry(runs_to_make, read_report(args.output).get("runs", {}), os.path.abspath(args.work_dir),
                     os.path.abspath(carry_dir)):
            print(f"No run under way in {args.work_dir} is further along than its copy in {carry_dir}.")
        return
    if args.dry_run:
        for line in describe_plan(runs_to_make, read_report(args.output).get("runs", {}), args.work_dir,
                                  harness.cpu_class(), carry_dir):
            print(line)
        return
    measure(args.output, harness.cifar10_dir(parser, args.data_dir), os.path.abspath(args.work_dir), runs_to_make,
            args.snapshot_every, args.locality_images, args.prune_snapshots, args.note,
            carry_dir and os.path.abspath(carry_dir),
            log=lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()
