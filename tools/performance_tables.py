"""Writes the tables of README.md and docs/*.md and the figures docs/*.png from the committed benchmark JSON
(benchmarks/results/*.json), so that none can drift from the measurements: the studies' tables and figures here, the
benchmarks' tables from ``tools/benchmark_tables.py``. ``--check`` rewrites nothing and exits 1 if a committed table
differs. A table lives between ``<!-- table:NAME ... -->`` and ``<!-- end table:NAME -->``.
"""

import argparse
import functools
import pathlib
import re
import sys

import numpy as np
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the benchmarks package beside tools/
    sys.path.insert(0, str(ROOT))
from benchmarks import data_efficiency as efficiency, reproduction as study  # noqa: E402
from tools import benchmark_tables  # noqa: E402
from tools.benchmark_tables import fixed as _fixed, load as _load, table as _table  # noqa: E402

FILES = ("README.md", "docs/performance.md", "docs/reference.md", "docs/training.md", "docs/attention_init.md",
         "docs/reproduction.md", "docs/little_data.md")
# Each figure: (the report it is drawn from, the function drawing it to a path).
PLOTS = {"docs/data_efficiency.png": ("data_efficiency", "plot_data_efficiency"),
         **{f"docs/reproduction_{figure}.png": ("reproduction", f"plot_reproduction_{figure}")
            for figure in ("curves", "locality", "maps_learned", "maps_quadratic", "centers")},
         **{f"docs/little_data_{figure}.png": ("little_data", f"plot_little_data_{figure}")
            for figure in ("curves", "locality")}}


def _efficiency_cells():
    """``{(variant, epochs): {dataset: summary}}`` of the data-efficiency report, its datasets by training images
    (``shapes`` last) and ``{dataset: training images}``."""
    data, cells = _load("data_efficiency"), {}
    for key, summary in data["summary"].items():
        variant, dataset, epochs = efficiency.split_key(key)
        cells.setdefault((variant, epochs), {})[dataset] = summary
    sizes = data.get("training_images", {})
    datasets = sorted({d for per in cells.values() for d in per}, key=lambda d: (d not in sizes, sizes.get(d, 0), d))
    return cells, datasets, sizes


def data_efficiency():
    """Test accuracy per variant, epochs and dataset: mean ± std (seeds)."""
    cells, datasets, sizes = _efficiency_cells()
    rows = [[f"`{variant}`", epochs] + [_spread(per.get(d), seeds=True) for d in datasets]
            for (variant, epochs), per in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0]))]
    return _table(["variant", "epochs"] + [f"{d} ({sizes[d]} images)" if d in sizes else d for d in datasets], rows,
                  "Test accuracy: mean ± sample standard deviation (seeds in brackets).")


def efficiency_targets():
    """The targets the data-efficiency benchmark was built for, on its runs and on the reproduction study's."""
    data = _load("data_efficiency")
    # the reproduction study's final accuracies, on all training images
    final = {key.replace("|", "|cifar10-mini:100|"): {**entry["test_accuracy"], "seeds": entry["seeds"]}
             for key, entry in _load("reproduction")["summary"].items()}
    targets = efficiency.targets(data["summary"], data.get("training_images")) + efficiency.targets(final)
    rows = [[r["target"], f"{r['dataset']}, {r['epochs']}", f"`{r['variant']}` {r['mean']:.3f} ({r['seeds']})",
             f"`{r['against']}` {r['against_mean']:.3f} ({r['against_seeds']})", f"{r['difference']:+.3f}",
             "yes" if r["met"] else "no", _fixed(r["spread"], 3)] for r in targets]
    return _table("target | data, epochs | variant | against | difference | met | spread", rows,
                  "Seeds in brackets; met: the difference of the means reaches what the target needs; spread: the "
                  "larger standard deviation of the two sides.")


def _recorded(name) -> bool:
    """Whether ``benchmarks/results`` holds the report ``name`` (a study not yet run has none)."""
    return (benchmark_tables.RESULTS / f"{name}.json").exists()


def _reproduction(name="reproduction", budget=None):
    """``(report, budget, {model: its summary at the budget})`` of a study report (`benchmarks.reproduction`) at
    ``budget`` (default: the report's), in the order of `benchmarks.reproduction.study_models`."""
    data = _load(name)
    budget = data["budget"] if budget is None else budget
    return data, budget, {m: data["summary"][study.summary_key(m, budget)]
                          for m in study.study_models(data["summary"], budget)}


def _runs(data, model, budget):
    """``{seed: run}`` of ``model`` at ``budget``, by seed."""
    keyed = ((study.split_key(k), r) for k, r in data["runs"].items())
    return dict(sorted((seed, r) for (name, seed, epochs), r in keyed if (name, epochs) == (model, budget)))


def _spread(s, digits=3, seeds=False):
    """``mean ± std`` of a `benchmarks.reproduction.spread` (no ± with one seed), and with ``seeds`` their count."""
    if s is None:
        return "-"
    text = f"{s['mean']:.{digits}f}" + ("" if s["std"] is None else f" ± {s['std']:.{digits}f}")
    return f"{text} ({len(s['seeds'])})" if seeds else text


def _change(start, end):
    """``start → end`` of two spreads, to two digits."""
    return f"{_spread(start, 2)} → {_spread(end, 2)}"


def _preset(model, code=True):
    """The preset a study model trains, with a comparison variant's initialization after it (``code``: in backticks)."""
    start = model.partition("+")[2]
    name = efficiency.parse_variant(model)["model"] + (f"+{start}" if start else "")
    return f"`{name}`" if code else name


def _last_quarter(entry, epochs):
    """The cells "last quarter" (the mean change, its epochs) and "flattened" of a summary entry."""
    change = entry["last_quarter_change"]
    unknown = "- (one seed)" if len(entry["seeds"]) == 1 else "-"
    return ("-" if change is None else f"{change['mean']:+.3f} ({entry['quarter_epoch']}-{epochs})",
            {True: "yes", False: "no", None: unknown}[entry["flattened"]])


def _recipe(model):
    """The recipe a study model trains with: its ``:RECIPE``, else the paper's."""
    return efficiency.split_recipe(model)[1] or "paper"


def _at_budget(name="reproduction", budget=None):
    """``(report, budget, cells)`` of a study report: a frame of the cells of its models at ``budget`` (default: the
    report's)."""
    data, budget, entries = _reproduction(name, budget)
    rows = []
    for model, e in entries.items():
        runs = _runs(data, model, budget).values()
        # A run's minutes at the least disturbed seed's median epoch, per CPU class.
        timed = pd.DataFrame([(r.get("cpu") or "unknown CPU", r["median_epoch_seconds"]) for r in runs
                              if r.get("median_epoch_seconds") is not None], columns=["cpu", "seconds"])
        parameters = ", ".join(f"{c:,}" for c in sorted({r["parameters"] for r in runs}))
        rows.append([_preset(model), _recipe(model), parameters, len(e["seeds"]), _spread(e["test_accuracy"]),
                     e["test_accuracy"]["mean"],
                     f"{e['test_accuracy']['min']:.3f}-{e['test_accuracy']['max']:.3f}", *_last_quarter(e, budget),
                     "; ".join(f"{seconds * budget / 60:.0f} ({cpu})"
                               for cpu, seconds in timed.groupby("cpu")["seconds"].min().items()) or "-"])
    return data, budget, pd.DataFrame(rows, columns=["model", "recipe", "parameters", "seeds", "test accuracy", "mean",
                                                     "range", "last quarter", "flattened", "minutes a run (CPU)"])


def models():
    """The README's table: what each model of the reproduction study reaches, at its size and cost, then the
    little-data study's models under the same recipe and budget that the reproduction study lacks (`resnet20`)."""
    data, budget, cells = _at_budget()
    little = cells.iloc[:0]
    if _recorded("little_data"):
        little = _at_budget("little_data", budget)[2]
        little = little[(little["recipe"] == "paper") & ~little["model"].isin(cells["model"])]
    header = ["model", "parameters", "test accuracy", "seeds", "minutes a run (CPU)"]
    added = f" ({', '.join(little['model'])}: the little-data study's)" if len(little) else ""
    return _table(header, pd.concat([cells, little])[header].values,
                  f"cifar10-mini ({data['data']['training_images']} training images, a tenth held out), {budget} "
                  f"epochs of the paper's recipe{added}; test accuracy: mean ± std over seeds; minutes a run at its "
                  "least disturbed seed's median epoch, on the CPU named.")


def reproduction_accuracy():
    """Final test accuracy per model at the budget, its spread, whether its curve flattened, a run's minutes."""
    data, budget, cells = _at_budget()
    header = ["model", "parameters", "seeds", "test accuracy", "range", "last quarter", "flattened",
              "minutes a run (CPU)"]
    return _table(header, cells[header].values,
                  f"{budget} epochs, {data['data']['test_images']} test images, the last epoch's model. Flattened: "
                  "the last quarter's mean change is below the seeds' std. Minutes: a run's epochs at its least "
                  "disturbed seed's median epoch, per CPU class.")


def reproduction_budgets():
    """Every budget the study ran, per model (comparison variants last): final accuracy, the change from the next
    shorter budget and the last quarter's."""
    data = _load("reproduction")
    order = {m: i for i, m in enumerate(study.MODELS)}
    rows = []
    for key in sorted(data["summary"], key=lambda k: (order.get(study.split_key(k)[0], len(order)),
                                                      study.split_key(k))):
        (model, epochs), e = study.split_key(key), data["summary"][key]
        against = e["against_shorter"]
        change = "-" if against is None else f"{against['change']:+.3f} from {against['epochs']}" + {
            True: ", within the spread", False: ", beyond the spread", None: ""}[against["within_spread"]]
        rows.append([_preset(model), epochs, len(e["seeds"]), _spread(e["test_accuracy"]), change,
                     *_last_quarter(e, epochs)])
    return _table("model | epochs | seeds | test accuracy | from the shorter budget | last quarter | flattened", rows,
                  f"The budget is {data['budget']} epochs, where the most models ran; the others are the search for "
                  "it. Within the spread: the change is at most the larger std of the two budgets. "
                  "`+convolutional@0.1`: a comparison of docs/attention_init.md.")


@functools.lru_cache(maxsize=None)
def _uniform_attention(model):
    """`sa_conv.inspection.locality_metrics` of attention spread evenly over ``model``'s grid (its default queries):
    the baseline of a trained head's distance and entropy."""
    import sa_conv
    from sa_conv import inspection

    side = sa_conv.get_config(efficiency.parse_variant(model)["model"]).grid_size
    return inspection.locality_metrics(np.full((1, 1, side * side, side * side), 1 / (side * side)), (side, side))[0]


def reproduction_locality():
    """Per attention model and layer, the heads' mean attention distance, 3x3 mass and entropy at the start and
    the end, and the most local head at the end."""
    _, budget, entries = _reproduction()
    rows = []
    for model, e in entries.items():
        if "locality" not in e:
            continue
        start, end = e["locality"][min(e["locality"], key=int)], e["locality"][max(e["locality"], key=int)]
        for layer, (a, b) in enumerate(zip(start, end)):
            rows.append([_preset(model), layer, *(_change(a[m], b[m]) for m in study.LAYER_METRICS),
                         f"{_spread(b['most_local_distance'], 2)}, mass {_spread(b['most_local_mass'], 2)}",
                         len(e["seeds"])])
    uniform = _uniform_attention("learned")
    return _table("model | layer | distance | 3x3 mass | entropy | most local head (end) | seeds", rows,
                  f"Start → end of {budget} epochs: mean over a layer's heads, then over seeds. Distance in grid "
                  "pixels, mass in the 3x3 around the peak (1 for a convolution tap), entropy in nats; uniform "
                  f"attention: distance {uniform['mean_distance']:.2f}, entropy {uniform['entropy']:.2f}.")


def reproduction_gates():
    """Per gated model and layer, its heads' gates (`benchmarks.reproduction.gate_summary`)."""
    data, budget, entries = _reproduction()
    rows = [[_preset(m), g["layer"], _change(g["start"], g["end"]), _spread(g["lowest"], 2),
             ", ".join(map(str, g["content_heads"])), g["seeds"]]
            for m in entries for g in study.gate_summary(_runs(data, m, budget).values()) or []]
    return _table("model | layer | mean gate | lowest head | content heads | seeds", rows,
                  "A head's gate sigmoid(λ) weighs its positional attention, the rest goes to content. Mean over a "
                  f"layer's heads, then seeds, start → end of {budget} epochs; content heads: gates below "
                  f"{study.CONTENT_GATE} at the end, per seed.")


def _ahead_from(ours, theirs):
    """The first snapshot epoch from which the mean curve ``ours`` stays above ``theirs`` (initialization aside):
    "throughout", "from epoch E", "not at the end" or "-"."""
    epochs = sorted(set(map(int, ours)) & set(map(int, theirs)) - {0})
    above = [ours[str(e)]["mean"] > theirs[str(e)]["mean"] for e in epochs]
    if not epochs or not above[-1]:
        return "-" if not epochs else "not at the end"
    behind = [e for e, a in zip(epochs, above) if not a]
    return "throughout" if not behind else f"from epoch {epochs[epochs.index(behind[-1]) + 1]}"


def reproduction_gated_against_content():
    """Gated against content attention at every budget both ran."""
    summary = _load("reproduction")["summary"]
    rows = []
    for epochs in sorted({study.split_key(k)[1] for k in summary}):
        gated, content = (summary.get(study.summary_key(m, epochs)) for m in ("gated", "content"))
        if gated and content:
            rows.append([epochs, *(f"{_spread(e['test_accuracy'])} ({len(e['seeds'])})" for e in (gated, content)),
                         f"{gated['test_accuracy']['mean'] - content['test_accuracy']['mean']:+.3f}",
                         _ahead_from(gated["curve"], content["curve"])])
    return _table(f"epochs | {_preset('gated')} | {_preset('content')} | difference | gated ahead", rows,
                  "Seeds in brackets; gated ahead: the snapshot from which its mean test accuracy stays above "
                  "content's.")


def reproduction_claims():
    """The paper's claims, checked one line each (`benchmarks.reproduction.claims`)."""
    data, budget, _ = _reproduction()
    # Theorem 1 is proved, not measured on data: the tests check it, each kernel against its layer.
    rows = [["a self-attention layer of K² heads can express any KxK convolution (Theorem 1)", "`sa_conv.conversion`",
             "a convolution's output within 1e-4 in float32 in every case of `tests/test_conversion.py`", "-",
             "**held**"]]
    # The study at equal size under the small-data recipe answers the accuracy claim on its own report.
    little = _load("little_data") if _recorded("little_data") else None
    equal_size = [] if little is None else [r for r in study.claims(little["summary"], little["budget"])
                                            if "convolution" in r]
    for r in study.claims(data["summary"], budget) + equal_size:
        if "start" in r:
            evidence = ", ".join(f"{label} {_change(r['start'][m], r['end'][m])}"
                                 for label, m in (("layer 0 distance", "mean_distance"), ("3x3 mass", "mass_3x3")))
        elif "first_layer" in r:
            far = r["last_layer"]["mean"] > _uniform_attention(r["model"])["mean_distance"]
            evidence = (f"distance, first layer {_spread(r['first_layer'], 2)}, last {_spread(r['last_layer'], 2)}"
                        + (" (beyond uniform attention's: far pixels)" if far else ""))
        elif "convolution" in r:  # seeds of both sides: the study at equal size may still be under way
            evidence = (f"{_spread(r['accuracy'])} ({r['accuracy']['n']}) against {_preset(r['convolution'])}'s "
                        f"{_spread(r['against'])} ({r['against']['n']})")
        else:
            evidence = f"{_spread(r['accuracy'])} against ResNet18's {_spread(r['resnet18'])}"
        recipe = _recipe(r["model"])
        rows.append([r["claim"], _preset(r["model"]) + ("" if recipe == "paper" else f" (`{recipe}`)"), evidence,
                     r["seeds"], f"**{r['verdict']}**"])
    return _table("claim | model | measured (mean ± std) | seeds | verdict", rows,
                  "Held: the change goes the paper's way by more than the larger std over seeds (accuracy: within it "
                  "of the convolution's); partly: by less, with one seed or in one measure (accuracy: within "
                  "twice); not here: otherwise. Emergence is not asked of the gated model, which starts as a "
                  "convolution.")


def training_bfloat16_accuracy():
    """Test accuracy under ``--mixed_precision=auto`` (bfloat16 where the CPU has the units) beside the reproduction
    study's float32 runs of the same models at its budget; within the spread as `benchmarks.reproduction.differs`."""
    _, budget, cells = _reproduction()
    auto = _load("bfloat16_training")
    runs = {**auto.get("runs_without_snapshots", {}), **auto["runs"]}
    groups = {}  # {model: [runs at the budget]}
    for key, run in runs.items():
        model, _, epochs = study.split_key(key)
        if epochs == budget:
            groups.setdefault(model, []).append(run)
    rows = []
    for model in (m for m in cells if m in groups):
        float32, bfloat16 = cells[model]["test_accuracy"], study.spread(r["test_accuracy"] for r in groups[model])
        difference = bfloat16["mean"] - float32["mean"]
        differs = study.differs(float32, bfloat16)
        within = "-" if differs is None else "no" if differs else "yes"
        rows.append([_preset(model), f"{_spread(float32)} ({float32['n']})", f"{_spread(bfloat16)} ({bfloat16['n']})",
                     ", ".join(sorted({r["precision"] for r in groups[model]})), f"{difference:+.3f}", within])
    return _table("model | float32 | `auto` | `auto` ran | difference | within the spread", rows,
                  f"Test accuracy, mean ± std (seeds), {budget} epochs; float32: "
                  "[reproduction.md](reproduction.md)'s.")


def little_data():
    """The little-data study's models, best first, beside the paper recipe's runs of the same presets and ResNet18
    (docs/reproduction.md's study)."""
    data, budget, cells = _at_budget("little_data")
    _, _, paper = _at_budget("reproduction", budget)
    presets, ran = set(cells["model"]) | {_preset("resnet18")}, set(zip(cells["model"], cells["recipe"]))
    paper = paper[[model in presets and (model, recipe) not in ran
                   for model, recipe in zip(paper["model"], paper["recipe"])]]
    header = ["model", "recipe", "parameters", "test accuracy", "seeds", "minutes a run (CPU)"]
    frame = pd.concat([cells, paper]).sort_values("mean", ascending=False, kind="stable")
    return _table(header, frame[header].values,
                  f"cifar10-mini ({data['data']['training_images']} training images, a tenth held out), {budget} "
                  "epochs; test accuracy: mean ± std over seeds (the last epoch's model, the weights' average under "
                  "`small_data`); minutes a run at its least disturbed seed's median epoch, on the CPU named.")


def _little_data_localities():
    """``(budget, [(model, its summary entry, its preset's locality under the paper's recipe or None)])`` for each
    attention model of the little-data study; the paper's runs are docs/reproduction.md's study's at that budget."""
    _, budget, entries = _reproduction("little_data")
    _, _, paper = _reproduction("reproduction", budget)
    return budget, [(m, e, paper.get(efficiency.split_recipe(m)[0], {}).get("locality"))
                    for m, e in entries.items() if "locality" in e]


def little_data_locality():
    """Per attention preset and layer, the heads' mean attention distance, 3x3 mass and entropy at the end under the
    paper's recipe (docs/reproduction.md's study) and under the little-data study's."""
    budget, columns = _little_data_localities()
    rows = []
    for model, e, before in columns:
        if not before:
            continue
        ends = [locality[max(locality, key=int)] for locality in (before, e["locality"])]
        for layer, (a, b) in enumerate(zip(*ends)):
            rows.append([_preset(model), layer, *(_change(a[m], b[m]) for m in study.LAYER_METRICS)])
    uniform = _uniform_attention("learned")
    return _table("model | layer | distance | 3x3 mass | entropy", rows,
                  f"Paper's recipe → `small_data`, after {budget} epochs: mean over a layer's heads, then seeds; "
                  f"distance in grid pixels, entropy in nats (uniform attention: {uniform['mean_distance']:.2f}, "
                  f"{uniform['entropy']:.2f}).")


def little_data_ablation():
    """The models under `small_data` with each `--augmentation` of the ablation study, at the little-data study's
    budget: test and best validation accuracy. The little-data study's own runs of those models are the recipe's
    augmentation (one run a seed where both reports have it)."""
    from trainers.recipes import RECIPES

    little, ablation = _load("little_data"), _load("small_data_ablation")["runs"].values()
    budget, models = little["budget"], {run["flags"]["model"] for run in ablation}
    seeds = {}  # {(preset, augmentation, seed): run}
    for run in [*little["runs"].values(), *ablation]:
        flags = run["flags"]
        if (flags.get("recipe"), flags["epochs"]) == ("small_data", budget) and flags["model"] in models:
            augmentation = flags.get("augmentation", RECIPES["small_data"]["augmentation"])
            seeds[flags["model"], augmentation, flags["seed"]] = run
    groups = {}  # {(preset, augmentation): runs}
    for (model, augmentation, _), run in seeds.items():
        groups.setdefault((model, augmentation), []).append(run)
    rows = [[model, augmentation, *(study.spread(r[name] for r in runs) for name in (
        "test_accuracy", "best_val_accuracy")), len(runs)] for (model, augmentation), runs in groups.items()]
    rows.sort(key=lambda row: (row[0], -row[2]["mean"]))
    return _table("model | augmentation | test accuracy | best validation accuracy | seeds",
                  [[f"`{model}`", f"`{augmentation}`", _spread(test), _spread(validation), seeds]
                   for model, augmentation, test, validation, seeds in rows],
                  f"{budget} epochs of `small_data` with the `--augmentation` named (the recipe's: "
                  f"`{RECIPES['small_data']['augmentation']}`); mean ± std over seeds; validation: the "
                  "held-out tenth.")


def _plt():
    """``matplotlib.pyplot`` drawing to files only (the Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(figure, path):
    """Writes ``figure`` to ``path`` laid out and closes it; no matplotlib version in its metadata, so that a PNG
    changes only with its data."""
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    _plt().close(figure)


def _label(model, entry, budget=None):
    """A study model's legend label: its preset, the budget when it is not the study's, and its seeds."""
    seeds = len(entry["seeds"])
    return f"{_preset(model, False)}{f', {budget} epochs' if budget else ''} ({seeds} seed{'s' if seeds > 1 else ''})"


def _band(axis, epochs, values, colour=None, label=None):
    """The means of ``values`` (spreads) against ``epochs`` in a band from their min to their max, in ``colour``
    or the axes' next ones."""
    axis.plot(epochs, [v["mean"] for v in values], marker="o", markersize=3, color=colour, label=label)
    # A colour for the band draws its edge too: none when the colour is the axes' own.
    axis.fill_between(epochs, [v["min"] for v in values], [v["max"] for v in values], alpha=0.2,
                      **({"color": colour} if colour else {}))


def plot_data_efficiency(path):
    """Mean test accuracy against training images on the cifar10-mini subsets at the report's most measured
    epochs, a line per variant, bars from the lowest to the highest seed."""
    plt = _plt()
    cells, _, sizes = _efficiency_cells()
    epochs = max({e for _, e in cells}, key=lambda e: sum(len(per) for (_, e2), per in cells.items() if e2 == e))
    figure, axis = plt.subplots(figsize=(9, 4.8))
    colours, markers = plt.get_cmap("tab20").colors, "osD^vPX<>"
    for index, (variant, per) in enumerate(sorted((v, per) for (v, e), per in cells.items() if e == epochs)):
        points = sorted((sizes[d], s) for d, s in per.items() if d in sizes)
        if points:
            mean, low, high = (np.array([s[k] for _, s in points]) for k in ("mean", "min", "max"))
            # one colour and marker a variant (more variants than a default cycle's ten colours)
            axis.errorbar([size for size, _ in points], mean, yerr=[mean - low, high - mean], capsize=3, label=variant,
                          marker=markers[index % len(markers)], color=colours[index % len(colours)])
    axis.set(xscale="log", xlabel="training images (cifar10-mini subsets)", ylabel="test accuracy",
             title=f"Data efficiency, {epochs} epochs")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(figure, path)


def plot_reproduction_curves(path):
    """Test accuracy against epochs, a line per model at the budget (mean over seeds, band min-max), dashed at the
    other budgets the study ran."""
    plt = _plt()
    data, budget, entries = _reproduction()
    figure, axis = plt.subplots(figsize=(10.5, 4.2))
    for colour, (model, e) in zip(plt.get_cmap("tab10").colors, entries.items()):
        epochs = sorted(int(k) for k in e["curve"])
        _band(axis, epochs, [e["curve"][str(k)] for k in epochs], colour, _label(model, e))
        for other_budget in sorted(n for m, n in map(study.split_key, data["summary"])
                                   if m == model and n != budget):
            other = data["summary"][study.summary_key(model, other_budget)]
            points = sorted((int(k), v["mean"]) for k, v in other["curve"].items())
            axis.plot(*zip(*points), linestyle="--", linewidth=1, color=colour,
                      label=_label(model, other, other_budget))
    axis.set(xlabel="epoch", ylabel="test accuracy",
             title=f"Test accuracy during training ({budget} epochs, cifar10-mini; dashed: other budgets)")
    axis.grid(alpha=0.3)
    # Beside the axes: inside, the legend of eleven lines hid the curves' last epochs.
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(figure, path)


def plot_little_data_curves(path):
    """Test accuracy against epochs of the little-data study's models and of the same presets' runs in
    docs/reproduction.md's study: a colour per preset, solid under a recipe (mean over seeds, band min-max), dashed
    under the paper's (mean)."""
    plt = _plt()
    _, budget, entries = _reproduction("little_data")
    _, _, paper = _reproduction("reproduction", budget)
    colours = dict(zip(dict.fromkeys(_preset(m) for m in entries), plt.get_cmap("tab10").colors))
    runs = [*entries.items(), *((m, e) for m, e in paper.items() if _preset(m) in colours and m not in entries)]
    figure, axis = plt.subplots(figsize=(10.5, 4.2))
    for model, e in sorted(runs, key=lambda run: list(colours).index(_preset(run[0]))):
        epochs, label = sorted(int(k) for k in e["curve"]), f"{_label(model, e)}, {_recipe(model)}"
        if _recipe(model) == "paper":
            axis.plot(epochs, [e["curve"][str(k)]["mean"] for k in epochs], linestyle="--", linewidth=1,
                      color=colours[_preset(model)], label=label)
        else:
            _band(axis, epochs, [e["curve"][str(k)] for k in epochs], colours[_preset(model)], label)
    axis.set(xlabel="epoch", ylabel="test accuracy",
             title=f"Test accuracy during training ({budget} epochs, cifar10-mini; dashed: the paper's recipe)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(figure, path)


def _plot_locality(path, columns, title):
    """A column per ``(model, its summary entry, the paper recipe's locality or None)``: each layer's mean attention
    distance, 3x3 mass and entropy (a row each) against epochs (mean over seeds, band min-max; dashed: the mean under
    the paper's recipe), distance and entropy with uniform attention's (dotted)."""
    # Uniform attention has no peak to centre a 3x3 on (the metric would take a corner's): the
    # mass row has no baseline.
    metrics = (("mean_distance", "mean attention distance\n(grid pixels)", True),
               ("mass_3x3", "mass in the 3x3\naround the peak", False), ("entropy", "entropy (nats)", True))
    width = max(len(columns), 1)
    figure, axes = _plt().subplots(len(metrics), width, figsize=(3.6 * width, 2.6 * len(metrics)), squeeze=False,
                                   sharex="col", sharey="row")
    for row, (metric, label, baseline) in enumerate(metrics):
        for axis, (model, entry, paper) in zip(axes[row], columns):
            for locality, dashed in ((entry["locality"], False), (paper, True)):
                epochs = sorted(int(k) for k in locality or {})
                for layer in range(len(locality[str(epochs[0])]) if epochs else 0):
                    means = [locality[str(k)][layer][metric] for k in epochs]
                    if dashed:
                        axis.plot(epochs, [m["mean"] for m in means], linestyle="--", linewidth=1, color=f"C{layer}",
                                  label=f"layer {layer}, paper's recipe")
                    else:
                        _band(axis, epochs, means, label=f"layer {layer}")  # colour C{layer}: the axes' next
            if baseline:
                axis.axhline(_uniform_attention(model)[metric], color="grey", linestyle=":", linewidth=1,
                             label="uniform attention")
            if row == 0:
                recipe = _recipe(model)
                axis.set_title(_label(model, entry) + ("" if recipe == "paper" else f", {recipe}"), fontsize=9)
            if row == len(metrics) - 1:
                axis.set_xlabel("epoch")
            axis.grid(alpha=0.3)
        axes[row, 0].set_ylabel(label, fontsize=8)
    axes[0, -1].legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    _save(figure, path)


def plot_reproduction_locality(path):
    """`_plot_locality` of each attention model of the reproduction study."""
    _, budget, entries = _reproduction()
    _plot_locality(path, [(m, e, None) for m, e in entries.items() if "locality" in e],
                   f"Locality per layer during training ({budget} epochs)")


def plot_little_data_locality(path):
    """`_plot_locality` of each attention model of the little-data study, beside its preset's runs under the
    paper's recipe (docs/reproduction.md's study, dashed)."""
    budget, columns = _little_data_localities()
    _plot_locality(path, columns, f"Locality per layer during training ({budget} epochs; solid: the recipe named, "
                   "dashed: the paper's)")


def _plot_reproduction_maps(path, model):
    """The paper's Figure 5 for ``model``: each head's attention at the grid's center pixel, per layer, averaged
    over test images, after training (the lowest seed's run that keeps maps, `benchmarks.reproduction`'s choice)."""
    from sa_conv import plotting

    data, budget, _ = _reproduction()
    runs = _runs(data, model, budget)
    mapped = [(seed, run) for seed, run in runs.items() if "maps" in run["snapshots"][-1]]
    if not runs:
        return
    if not mapped:
        raise ValueError(f"No {model} run at {budget} epochs in the report keeps its attention maps: the report "
                         f"keeps those of seed {study.MAP_SEED} of {', '.join(study.MAP_MODELS)} "
                         f"(benchmarks.reproduction.MAP_MODELS); every run's are in {study.DETAIL} in its trial "
                         f"directory.")
    seed, run = mapped[0]
    last = run["snapshots"][-1]
    images = f"{run['locality_images']} test images" if run.get("locality_images") else "test images"
    figure = plotting.attention_grid_figure(np.array(last["maps"]), last["query"], title=(
        f"{_preset(model, False)}, seed={seed}, after {last['epoch']} epochs: attention of the center pixel, mean "
        f"over {images}"))
    figure.savefig(path, dpi=plotting.DPI, metadata={"Software": None})  # as `_save`, not laid out again
    _plt().close(figure)


plot_reproduction_maps_learned = functools.partial(_plot_reproduction_maps, model="learned")
plot_reproduction_maps_quadratic = functools.partial(_plot_reproduction_maps, model="quadratic")


def plot_reproduction_centers(path):
    """The paper's Figures 3 and 4 for the quadratic model's lowest seed: per layer, each head's center of
    attention ``Delta_h`` (Eq. 9) relative to the query at every snapshot, from initialization (open circle) to
    the end (filled); a head nearly uniform at the end (`sa_conv.plotting.near_uniform`) ends in a grey cross."""
    from sa_conv import plotting

    plt = _plt()
    data, budget, _ = _reproduction()
    runs = _runs(data, "quadratic", budget)
    if not runs:
        return
    seed, run = next(iter(runs.items()))
    snapshots = run["snapshots"]
    tracks = np.array([s["centers"] for s in snapshots])  # (snapshots, layers, heads, 2)
    maps = snapshots[-1].get("maps")
    if maps and np.shape(maps)[:2] != tracks.shape[1:3]:
        raise ValueError(f"The quadratic run's maps (layers, heads) {np.shape(maps)[:2]} do not match its centers' "
                         f"{tracks.shape[1:3]}: read the run again (benchmarks.reproduction.read_run).")
    # A nearly uniform head's Gaussian is so wide that its center no longer says where it looks.
    # Without maps (a run whose report keeps none), no head is marked: the title says so.
    uniform = np.array([[plotting.near_uniform(m) for m in layer] for layer in maps]) if maps else \
        np.zeros(tracks.shape[1:3], bool)
    limit = max(3.0, float(np.abs(tracks).max()) + 0.5)
    figure, axes = plt.subplots(1, tracks.shape[1], figsize=(3.3 * tracks.shape[1], 3.5), squeeze=False)
    colours = plt.get_cmap("tab10").colors
    for layer, axis in enumerate(axes[0]):
        for head in range(tracks.shape[2]):
            # Offsets are (row, column): drawn with columns across and rows down, as an image.
            rows, cols, colour = tracks[:, layer, head, 0], tracks[:, layer, head, 1], colours[head % len(colours)]
            axis.plot(cols, rows, color=colour, linewidth=1, alpha=0.7)
            axis.plot(cols[0], rows[0], "o", markerfacecolor="none", color=colour, markersize=5)
            if uniform[layer, head]:
                axis.plot(cols[-1], rows[-1], "x", color="0.5", markersize=6, label=f"head {head}: near-uniform")
            else:
                axis.plot(cols[-1], rows[-1], "o", color=colour, markersize=5, label=f"head {head}")
        axis.plot(0, 0, "x", color="black", markersize=8)
        axis.set(xlim=(-limit, limit), ylim=(limit, -limit), aspect="equal", xlabel="column offset (grid pixels)")
        axis.grid(alpha=0.3)
        axis.set_title(f"layer {layer}", fontsize=9)
        marked = [(h, text) for h, text in zip(*axis.get_legend_handles_labels()) if "near-uniform" in text]
        if marked and layer < len(axes[0]) - 1:  # the last panel's legend, beside it, names every head
            axis.legend(*zip(*marked), fontsize=6, loc="lower left")
    axes[0, 0].set_ylabel("row offset (grid pixels)")
    axes[0, -1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    crosses = ("a grey cross: the head's attention is nearly uniform at the end, its center says nothing" if maps
               else "no maps kept for this run: nearly uniform heads are not marked")
    figure.suptitle(f"{_preset('quadratic', False)}, seed={seed}: the heads' centers from initialization (open) to "
                    f"epoch {snapshots[-1]['epoch']} (filled); black x: the query\n({crosses})", fontsize=9)
    _save(figure, path)


# {table: (the report it is made from, the function making it)}
TABLES = {
    "models": ("reproduction", models), "reproduction_accuracy": ("reproduction", reproduction_accuracy),
    "reproduction_locality": ("reproduction", reproduction_locality),
    "reproduction_claims": ("reproduction", reproduction_claims),
    "reproduction_gates": ("reproduction", reproduction_gates),
    "reproduction_gated_against_content": ("reproduction", reproduction_gated_against_content),
    "reproduction_budgets": ("reproduction", reproduction_budgets),
    "little_data": ("little_data", little_data), "little_data_locality": ("little_data", little_data_locality),
    "little_data_ablation": ("small_data_ablation", little_data_ablation),
    "training_bfloat16_accuracy": ("bfloat16_training", training_bfloat16_accuracy),
    "data_efficiency": ("data_efficiency", data_efficiency),
    "efficiency_targets": ("data_efficiency", efficiency_targets),
    **benchmark_tables.TABLES,
}
BLOCK = re.compile(r"(<!-- table:(?P<name>\w+) [^>]*-->\n)(?P<body>.*?)(<!-- end table:(?P=name) -->)", re.S)


def render(text: str) -> str:
    """``text`` with every table block regenerated from the JSON; KeyError for an unknown name."""
    def fill(match):
        source, make = TABLES[match["name"]]
        return (f"<!-- table:{match['name']} (generated by tools/performance_tables.py from "
                f"benchmarks/results/{source}.json; do not edit) -->\n{make()}\n{match[4]}")

    return BLOCK.sub(fill, text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when a table differs")
    check = parser.parse_args(argv).check
    stale = []
    for name in FILES:
        text = (ROOT / name).read_text()
        new = render(text)
        if new != text:
            stale.append(name)
            if not check:
                (ROOT / name).write_text(new)
    if check and stale:
        print(f"Stale tables in {', '.join(stale)}: run tools/performance_tables.py", file=sys.stderr)
        return 1
    for name, (source, make) in PLOTS.items():
        if not check and _recorded(source):
            globals()[make](ROOT / name)
    print(("stale: " if check else "rewritten: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
