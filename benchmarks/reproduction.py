"""The paper's findings on cifar10-mini: accuracy against epochs and what the heads learned.

    .venv/bin/python -m benchmarks.reproduction --dry_run  # the plan, and where each run stands
    .venv/bin/python -m benchmarks.reproduction            # the study: every run docs/reproduction.md reports
    .venv/bin/python -m benchmarks.reproduction --models=gated --seeds=3,4 --output=/tmp/more.json
    # the little-data study: the small-data recipe (MODEL:small_data) in bfloat16 where the CPU has it
    .venv/bin/python -m benchmarks.reproduction --seeds=0,1,2 --epochs=240 --mixed_precision=auto \
        --models=quadratic:small_data,resnet20:small_data,learned:small_data,resnet20 \
        --output=benchmarks/results/little_data.json

A plan of data-efficiency variants trained with the trainer's defaults (or a variant's recipe) on the study engine
(`trainers.study`), a reader of each run's snapshots (`read_run`), a summary over seeds (`summarize`) and the paper's
`claims` checked on it; ``tools/performance_tables.py`` makes ``docs/reproduction.md``'s tables and figures from the
report.
"""

from __future__ import annotations

import collections
import os
import statistics

import numpy as np

from benchmarks import data_efficiency, harness

MODELS = ("learned", "quadratic", "resnet18", "content", "gated")
BUDGET = 240  # epochs: the budget the search settled on (docs/reproduction.md, "Choosing the budget")
FIRST_BUDGET = 120  # epochs: the study's budget before the search doubled it
SNAPSHOTS = 12  # snapshots a run besides its initialization
# The runs docs/reproduction.md reports, (models, seeds, epochs), in the order they ran: every model at the first
# budget; the search for the budget (twice it, then 60 epochs); every model at the budget, three seeds, the content
# and gated models two (their runs take several times a position-only model's); the comparison variant of
# docs/attention_init.md. Why each was added: the report's notes.
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
MAP_MODELS = ("learned", "quadratic")  # the models whose maps docs/reproduction.md draws; the others', in `DETAIL`
DECIMALS = 6  # of a spread's mean and std: the pages show 3
LAYER_METRICS = ("mean_distance", "mass_3x3", "entropy")
HEAD_METRICS = (*LAYER_METRICS, "peak_offset")  # what the report keeps of each head at each snapshot
EQUAL_SIZE = "resnet20"  # the convolution of the small presets' size (1.4-1.6x their parameters)
CONTENT_GATE = 0.5  # a gate below it weighs a head's content attention above its positional one
# ``(model, seed, epochs)`` of a `run_key`, ``(model, epochs)`` of a `summary_key`.
split_key = data_efficiency.split_key


def run_key(model: str, seed: int, epochs: int) -> str:
    return f"{model}|seed={seed}|epochs={epochs}"


def summary_key(model: str, epochs: int) -> str:
    """The key of `summarize`'s entry for ``model`` at ``epochs``."""
    return f"{model}|epochs={epochs}"


def plan(models=None, seeds=None, epochs=None) -> list[tuple[str, int, int]]:
    """The ``(model, seed, epochs)`` runs, model by model: `STUDY`'s, or with any of the three every model (its
    `data_efficiency.variant_name`: ValueError for one it refuses) and seed at ``epochs`` (defaults `MODELS`,
    seeds 0, 1, 2 and `BUDGET`)."""
    parts = STUDY if models is None and seeds is None and epochs is None else \
        ((MODELS if models is None else [data_efficiency.variant_name(model) for model in models],
          (0, 1, 2) if seeds is None else seeds, BUDGET if epochs is None else epochs),)
    return [(model, seed, epochs_) for models_, seeds_, epochs_ in parts for model in models_ for seed in seeds_]


def study_runs(runs_to_make, data_dir: str, snapshot_every: int | None = None, precision: str = "float32"):
    """The `trainers.study.Run` of each ``(model, seed, epochs)``, with the trainer's defaults but what the study
    fixes; by default at most `SNAPSHOTS` snapshots a run (the trainer also keeps the last epoch's). ``precision``:
    their ``--mixed_precision``, named in their flags so that a run keeps it whatever the trainer's default (the
    recorded study's: float32)."""
    from trainers.study import Run

    return [Run(run_key(model, seed, epochs),
                {**data_efficiency.parse_variant(model), "dataset": "cifar10", "data_dir": data_dir,
                 "epochs": epochs, "seed": seed, "snapshot_every": snapshot_every or -(-epochs // SNAPSHOTS),
                 "mixed_precision": precision})
            for model, seed, epochs in runs_to_make]


def _rounded(value, decimals: int = 5):
    if isinstance(value, list):
        return [_rounded(v, decimals) for v in value]
    return round(value, decimals) if isinstance(value, float) else value


def analyse_snapshot(model, test, locality_images: int, maps: bool) -> dict:
    """What a classifier shows on the test `trainers.data.Split`: ``test_accuracy``; for attention models ``layers``
    (per layer and head, `sa_conv.inspection.locality_metrics` on ``locality_images`` images), ``centers`` (per layer
    ``(heads, 2)`` grid offsets), ``gates`` (per layer ``(heads,)``) and with ``maps`` ``query`` (the grid's center)
    and ``maps`` (per layer ``(heads, H, W)``, each head's attention from it, mean over the images)."""
    import sa_conv
    from keras import ops
    from sa_conv import heads, inspection, plotting

    logits = model.predict(test.images, batch_size=250, verbose=0)
    result = {"test_accuracy": float(np.mean(np.argmax(logits, -1) == test.labels))}
    if not sa_conv.attention_blocks(model):
        return result
    grid, _ = sa_conv.attention_grid(model)
    query = (grid[0] // 2, grid[1] // 2)
    probabilities = plotting.model_attention(model, test.images[:locality_images])
    gates = heads.head_gates(model)
    metrics = [inspection.locality_metrics(p, grid, gates=g) for p, g in zip(probabilities, gates)]
    result["layers"] = [[{k: _rounded(v) for k, v in head.items()} for head in layer] for layer in metrics]
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


def run_timing(history: list, reader: str) -> dict:
    """From a trainer's ``history.json`` read on the CPU class ``reader`` (that of epochs that name none): ``cpu``,
    the class of most epochs (on a tie, of the last), ``median_epoch_seconds`` over them (whole epochs, or their steps
    where only those were timed; the median leaves out epochs slowed or paused) and, if others ran, ``cpu_epochs``."""
    order = [h.get("cpu") or reader for h in history]
    classes = collections.Counter(order)
    cpu = max(classes, key=lambda c: (classes[c], len(order) - order[::-1].index(c)))
    seconds = [h.get("epoch_seconds", h.get("train_seconds", 0.0)) for h, c in zip(history, order) if c == cpu]
    return {"median_epoch_seconds": round(statistics.median(seconds), 2), "cpu": cpu,
            **({"cpu_epochs": dict(sorted(classes.items()))} if len(classes) > 1 else {})}


def read_run(model_dir: str, run, locality_images: int = 32, prune_snapshots: bool = False, log=print) -> dict:
    """The study's reader: the run in ``model_dir`` as the report keeps it (`compact_run`), its results, `run_timing`
    and every snapshot's `analyse_snapshot` (maps at the last). The whole reading goes to `DETAIL` beside it; then the
    checkpoints are deleted and, with ``prune_snapshots``, the snapshots but the first and last."""
    import json
    import shutil

    import keras

    from trainers import data as data_lib
    from trainers import files, run_files

    detail = os.path.join(model_dir, DETAIL)
    if os.path.exists(detail):  # read before a kill cut its reading short
        with open(detail) as f:
            return compact_run(json.load(f))
    results, history = run_files.read_results(model_dir, required=True), run_files.read_history(model_dir)
    epochs = run_files.snapshot_epochs(model_dir)
    if not epochs or not history:
        raise RuntimeError(f"{model_dir} has no snapshots or no history: train it with --snapshot_every.")
    test = data_lib.load_cifar10_files(run.flags["data_dir"]).test
    snapshots = []
    for epoch in epochs:
        log(f"    reading the snapshot at epoch {epoch} ...")
        model = keras.models.load_model(run_files.snapshot_path(model_dir, epoch), compile=False)
        snapshots.append({"epoch": epoch, **analyse_snapshot(model, test, locality_images, maps=epoch == epochs[-1])})
        keras.backend.clear_session()
    whole = {**{name: results[name] for name in ("test_accuracy", "best_val_accuracy", "best_epoch", "train_accuracy",
                                                 "parameters", "images_per_second", "weights_sha256")},
             "train_seconds": round(sum(h.get("train_seconds", 0.0) for h in history), 1),  # the optimizer steps'
             **run_timing(history, harness.cpu_class()), "locality_images": locality_images,
             "flags": {k: v for k, v in run.flags.items() if k != "data_dir"},
             "history": [{k: _rounded(h[k]) for k in ("epoch", "train_seconds", "epoch_seconds", "cpu", "train_loss",
                                                      "train_accuracy", "val_accuracy") if k in h} for h in history],
             "snapshots": snapshots}
    files.write_json(detail, whole, inline_numbers=True)
    shutil.rmtree(os.path.join(model_dir, run_files.CHECKPOINTS), ignore_errors=True)
    for epoch in epochs[1:-1] if prune_snapshots else ():  # ResNet18's are 45 MB each
        os.remove(run_files.snapshot_path(model_dir, epoch))
    return compact_run(whole)


def keep(reading: dict) -> dict:
    """What the report keeps of a run's reading (`data_efficiency.keep`), with the attention maps of `MAP_SEED`'s run
    of each of `MAP_MODELS` only: a map is 2,304 numbers a layer, and the pages draw no other model's."""
    run = data_efficiency.keep(reading)
    if (reading["key"].split("|")[0], run["flags"]["seed"]) not in [(model, MAP_SEED) for model in MAP_MODELS]:
        run["snapshots"] = [{k: v for k, v in s.items() if k not in ("maps", "query")} for s in run["snapshots"]]
    return run


def compact_run(run: dict) -> dict:
    """A whole reading (`read_run`) as the report keeps it: no ``history``, and each snapshot's ``layers`` (per layer
    and head, the locality metrics) made ``locality`` (per layer: each of `LAYER_METRICS` averaged over the heads, the
    most local head's ``most_local_distance`` and ``most_local_mass``) and ``heads`` (per layer, each of
    `HEAD_METRICS` as a list over the heads). A compact run stays as it is."""
    def locality(heads):
        local = min(heads, key=lambda head: head["mean_distance"])
        summary = {**{name: statistics.fmean(head[name] for head in heads) for name in LAYER_METRICS},
                   "most_local_distance": local["mean_distance"], "most_local_mass": local["mass_3x3"]}
        return {name: _rounded(value) for name, value in summary.items()}

    def compact(snapshot):
        if "layers" not in snapshot:
            return dict(snapshot)
        layers = snapshot["layers"]
        return {**{k: v for k, v in snapshot.items() if k != "layers"}, "locality": [locality(h) for h in layers],
                "heads": [{name: [head[name] for head in heads] for name in HEAD_METRICS} for heads in layers]}

    return {**{k: v for k, v in run.items() if k != "history"}, "snapshots": [compact(s) for s in run["snapshots"]]}


def spread(values) -> dict | None:
    """``{"mean", "std", "min", "max", "n"}`` of ``values`` (Nones left out) as `summarize` gives them; None if none."""
    import pandas as pd

    frame = pd.DataFrame({"group": 0, "value": [v for v in values if v is not None]})
    return data_efficiency.spreads(frame, "group", DECIMALS)[0] if len(frame) else None


def _noise(*spreads) -> float | None:
    """The largest std of ``spreads``, which a change is measured against: None without one (one seed, or seeds that
    agree exactly: their 0 measures no change)."""
    return max((s["std"] for s in spreads if s["std"]), default=None)


def differs(a: dict, b: dict) -> bool | None:
    """Whether the means of two spreads differ by more than their `_noise` (None without one)."""
    noise = _noise(a, b)
    return None if noise is None else abs(a["mean"] - b["mean"]) > noise


def summarize(runs: dict) -> dict:
    """Per `summary_key`, over its seeds (each value a `spread`): ``seeds``, ``test_accuracy``, ``curve`` (per snapshot
    epoch all seeds have, the test accuracy), ``quarter_epoch`` (the last of those at or before 3/4 of the epochs, if
    neither before half nor the last; else None), ``last_quarter_change`` (the accuracy's from it to the end),
    ``flattened`` (that change below the final accuracy's `_noise`; None without either); for attention models
    ``locality`` (per snapshot epoch and layer, each `compact_run` ``locality`` value); ``against_shorter``: None at
    a model's shortest budget, else the next shorter one's ``epochs``, the ``change`` of the mean accuracy and
    ``within_spread`` (within their `_noise`; None without one)."""
    import pandas as pd

    rows, snapshots = [], collections.defaultdict(dict)  # snapshots: {(model, epochs): {seed: {epoch: snapshot}}}
    for key, run in runs.items():
        model, seed, epochs = split_key(key)
        snapshots[model, epochs][seed] = {s["epoch"]: s for s in run["snapshots"]}
        rows.append((model, epochs, -1, -1, "test_accuracy", run["test_accuracy"]))  # snapshot -1: the final model
        for s in run["snapshots"]:  # layer -1: the whole model
            rows.append((model, epochs, s["epoch"], -1, "test_accuracy", s["test_accuracy"]))
            rows += [(model, epochs, s["epoch"], layer, name, value)
                     for layer, values in enumerate(s.get("locality", ())) for name, value in values.items()]
    columns = ["model", "epochs", "snapshot", "layer", "metric"]
    spreads = data_efficiency.spreads(pd.DataFrame(rows, columns=[*columns, "value"]), columns, DECIMALS)
    summary = {}
    for (model, epochs), by_seed in sorted(snapshots.items(), key=lambda item: summary_key(*item[0])):
        seeds, common = sorted(by_seed), sorted(set.intersection(*map(set, by_seed.values())))
        final = spreads[model, epochs, -1, -1, "test_accuracy"]
        quarter = max((e for e in common if e <= 0.75 * epochs), default=None)
        quarter = quarter if quarter is not None and quarter >= epochs / 2 and quarter != common[-1] else None
        change = None if quarter is None else spread(
            by_seed[s][common[-1]]["test_accuracy"] - by_seed[s][quarter]["test_accuracy"] for s in seeds)
        noise = _noise(final)
        entry = summary[summary_key(model, epochs)] = {
            "seeds": seeds, "test_accuracy": final,
            "curve": {str(e): spreads[model, epochs, e, -1, "test_accuracy"] for e in common},
            "quarter_epoch": quarter, "last_quarter_change": change,
            "flattened": None if noise is None or change is None else abs(change["mean"]) < noise}
        if common and all(by_seed[s][e].get("locality") for s in seeds for e in common):
            names = (*LAYER_METRICS, "most_local_distance", "most_local_mass")
            entry["locality"] = {str(e): [{name: spreads[model, epochs, e, layer, name] for name in names} for layer
                                          in range(max(len(by_seed[s][e]["locality"]) for s in seeds))] for e in common}
    for key, entry in summary.items():
        model, epochs = split_key(key)
        shorter = max((e for m, e in map(split_key, summary) if m == model and e < epochs), default=None)
        entry["against_shorter"] = None
        if shorter is not None:
            # The budget doubled, not the last quarter, says whether more epochs move a model: a cosine schedule's
            # last quarter anneals the learning rate, and gains at any budget.
            before, after = summary[summary_key(model, shorter)]["test_accuracy"], entry["test_accuracy"]
            moved = differs(before, after)
            entry["against_shorter"] = {"epochs": shorter, "change": round(after["mean"] - before["mean"], 6),
                                        "within_spread": None if moved is None else not moved}
    return summary


def starts_at_random(model: str) -> bool:
    """Whether ``model``'s attention starts from its random initialization (not a convolution)."""
    import sa_conv

    return sa_conv.get_config(data_efficiency.parse_variant(model)["model"]).attention_init == "random"


def main_budget(runs: dict) -> int | None:
    """The epochs at which the most models have a run (on a tie, the most runs, then the larger): the study's budget.
    Models first keeps every model in the tables however the runs land; runs next keeps one seed each at a longer
    budget from replacing three."""
    models, counts = collections.defaultdict(set), collections.Counter()
    for model, _, epochs in map(split_key, runs):
        if "attention_init" not in data_efficiency.parse_variant(model):  # comparison variants do not choose it
            models[epochs].add(model)
            counts[epochs] += 1
    return max(models, key=lambda e: (len(models[e]), counts[e], e)) if models else None


def study_models(summary: dict, epochs: int) -> list[str]:
    """The models (not comparison variants) with a `summarize` entry at ``epochs``: `MODELS` first in their order,
    then the others (recipe variants, ``resnet20``) by preset order of `MODELS` and name."""
    found = {split_key(key)[0] for key in summary if split_key(key)[1] == epochs}

    def order(model):
        variant = data_efficiency.split_recipe(model)[0]
        return model not in MODELS, MODELS.index(variant) if variant in MODELS else len(MODELS), model
    return sorted((model for model in found if "attention_init" not in data_efficiency.parse_variant(model)), key=order)


def _matches(ours: dict, theirs: dict) -> dict:
    """What an accuracy claim of the spread ``ours`` against ``theirs`` says: ``accuracy`` (ours), ``difference`` of
    the means, ``spread`` (their `_noise`) and ``verdict``: held above it or within the spread, partly within twice,
    else not here."""
    gap, noise = round(ours["mean"] - theirs["mean"], 6), _noise(ours, theirs)
    return {"accuracy": ours, "difference": gap, "spread": noise,
            "verdict": "held" if gap >= 0 or (noise is not None and -gap <= noise) else
                       "partly" if noise is not None and -gap <= 2 * noise else "not here"}


def claims(summary: dict, epochs: int) -> list[dict]:
    """The paper's claims on `summarize`'s entries of the `study_models` at ``epochs``: rows of the claim, the model,
    the spreads compared, the seeds and a verdict ``held``, ``partly`` (the right way, not beyond the spread) or ``not
    here``. Localized heads emerge (Sec. 4.2): from the first snapshot to the last, the first layer's mean distance
    falls and its 3x3 mass rises (models that start at random). Deeper layers attend to larger regions: the last
    layer's mean distance ends above the first's. Attention matches ResNet18's accuracy (Table 1), and under a recipe
    ``:RECIPE`` that of `EQUAL_SIZE` under the same recipe (the paper compares at similar size): `_matches`."""
    rows = []
    resnet = summary.get(summary_key("resnet18", epochs))
    for model in study_models(summary, epochs):
        entry = summary[summary_key(model, epochs)]
        seeds, locality = len(entry["seeds"]), entry.get("locality")
        end = locality[max(locality, key=int)] if locality else []
        if locality and starts_at_random(model):
            start, end_ = ({k: layers[0][k] for k in ("mean_distance", "mass_3x3")}
                           for layers in (locality[min(locality, key=int)], end))
            closer = end_["mean_distance"]["mean"] < start["mean_distance"]["mean"]
            denser = end_["mass_3x3"]["mean"] > start["mass_3x3"]["mean"]
            beyond = all(differs(start[k], end_[k]) for k in start)
            rows.append({"claim": "localized heads emerge in the first layer", "model": model, "start": start,
                         "end": end_, "seeds": seeds, "verdict": "held" if closer and denser and beyond else
                         "partly" if closer or denser else "not here"})
        if len(end) > 1:
            first, last = end[0]["mean_distance"], end[-1]["mean_distance"]
            wider = last["mean"] > first["mean"]
            rows.append({"claim": "deeper layers attend to larger regions", "model": model, "first_layer": first,
                         "last_layer": last, "seeds": seeds,
                         "verdict": "held" if wider and differs(first, last) else "partly" if wider else "not here"})
        flags = data_efficiency.parse_variant(model)
        if flags["model"] in data_efficiency.RESNETS:
            continue
        if "recipe" in flags:
            convolution = f"{EQUAL_SIZE}:{flags['recipe']}"
            against = summary.get(summary_key(convolution, epochs))
            if against is not None:
                rows.append({"claim": "attention matches a ResNet of its size", "model": model, "seeds": seeds,
                             "convolution": convolution, "against": against["test_accuracy"],
                             **_matches(entry["test_accuracy"], against["test_accuracy"])})
        elif resnet is not None:
            rows.append({"claim": "attention matches ResNet18's accuracy", "model": model, "seeds": seeds,
                         "resnet18": resnet["test_accuracy"], **_matches(entry["test_accuracy"],
                                                                         resnet["test_accuracy"])})
    return rows


def gate_summary(runs) -> list[dict] | None:
    """Per gated layer of ``runs`` (a run per seed; those with gates at the first and last snapshot): ``layer``,
    ``heads``, ``seeds``, ``start`` and ``end`` (the `spread` of the mean over the heads of the gate sigmoid(lambda_h),
    the weight on positional attention), ``lowest`` (the smallest head's at the end) and ``content_heads`` (per run,
    the heads below `CONTENT_GATE` at the end). None without gates."""
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
    parser.add_argument("--directory", default=os.path.join(harness.ROOT, "runs"), help="the study engine's directory")
    parser.add_argument("--models", help=f"comma-separated (default {','.join(MODELS)}); without --models, --seeds and "
                                         f"--epochs, the runs docs/reproduction.md reports")
    parser.add_argument("--seeds", help="comma-separated (default 0,1,2)")
    parser.add_argument("--epochs", type=int, help=f"the budget (default {BUDGET})")
    parser.add_argument("--snapshot_every", type=int, help=f"with --epochs (default: {SNAPSHOTS} snapshots a run)")
    parser.add_argument("--locality_images", type=int, default=32, help="test images the locality metrics average over")
    parser.add_argument("--dry_run", action="store_true", help="list the plan's runs and where each stands")
    parser.add_argument("--prune_snapshots", action="store_true",
                        help="delete a read run's snapshots but the first and last")
    parser.add_argument("--note", help="a note kept in the report (e.g. why fewer seeds)")
    parser.add_argument("--mixed_precision", default="float32", choices=("float32", "auto", "mixed_bfloat16"),
                        help="the runs' --mixed_precision (the recorded study's: float32)")
    args = harness.parse(parser)
    # The study's trials live under the report's name: another report is another plan, in its own directory.
    name = os.path.splitext(os.path.basename(args.output))[0]
    if args.snapshot_every is not None and (args.epochs is None or args.snapshot_every < 1):
        parser.error("--snapshot_every needs --epochs and is positive: the study's budgets keep their own spacing.")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be positive, got {args.epochs}.")
    try:
        seeds = None if args.seeds is None else [int(s) for s in data_efficiency.items(args.seeds)]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}.")
    try:
        runs_to_make = plan(None if args.models is None else data_efficiency.items(args.models), seeds, args.epochs)
    except ValueError as error:
        parser.error(f"--models: {error}")
    if not runs_to_make:
        parser.error("The plan has no run: --models and --seeds each need at least one entry.")
    data_dir = harness.cifar10_dir(parser, args.data_dir)
    from trainers import data as data_lib
    from trainers import study  # after the checks: they need no keras-tuner

    data = data_lib.load_cifar10_files(data_dir)
    sizes = {"training_images": len(data.train), "test_images": len(data.test)}
    report = study.Report(args.output, derive=lambda runs: {**derive(runs), "data": sizes}, keep=keep, note=args.note)
    # Runs read before the report kept snapshots count as recorded too: they are not trained again.
    read = report.read()
    recorded = {**read.get("runs_without_snapshots", {}), **read["runs"]}
    runs = study_runs([r for r in runs_to_make if run_key(*r) not in recorded], data_dir, args.snapshot_every,
                      args.mixed_precision)
    if args.dry_run:
        states = study.status(name, runs, args.directory)
        for key in (run_key(*r) for r in runs_to_make):
            print(f"{key}: {'recorded' if key in recorded else states[key]}")
        return

    def read(model_dir, run):
        return read_run(model_dir, run, args.locality_images, args.prune_snapshots, data_efficiency.log)

    study.run_study(name, runs, read, report.record, os.path.abspath(args.directory), log=data_efficiency.log)


if __name__ == "__main__":
    main()
