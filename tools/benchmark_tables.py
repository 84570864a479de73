"""The tables of the benchmarks' pages (throughput, memory, serving, the reference) from their committed JSON
(benchmarks/results/*.json), and the Markdown helpers every generated table uses; ``tools/performance_tables.py``
writes them into the pages beside the studies' tables.
"""

import functools
import json
import pathlib

import pandas as pd

from trainers import process

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BATCHES = ("batch1", "batch100")


def load(name):
    return json.loads((RESULTS / f"{name}.json").read_text())


def machine(data):
    """``(cores, memory GiB, float32 matmul GFLOP/s)`` of a report's machine (older reports had their own fields)."""
    facts = data["machine"]
    cpu = facts.get("cpu", {})
    peak = facts.get("matmul_gflops", {}).get("float32", facts.get("fp32_matmul_gflops_per_second"))
    return cpu.get("cores", facts.get("cpus")), cpu.get("memory_gb", facts.get("memory_gb")), peak


def num(x, digits=3):
    """``x`` with ``digits`` significant digits, plain notation; ``-`` for None."""
    if x is None or x == 0:
        return "-" if x is None else "0"
    return f"{x:.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def fixed(x, digits=2, unit=1):
    """``x / unit`` (a ratio; MB in GiB with ``unit=1024``) to ``digits`` decimals; ``-`` for None."""
    return "-" if x is None else f"{x / unit:.{digits}f}"


def pair(figures, prefix="", form=fixed):
    """``batch 1/batch 100`` of a report's figures (``prefix`` + ``batch1``, ...); ``-`` when not measured."""
    return "-" if figures is None else "/".join(form(figures.get(prefix + batch)) for batch in BATCHES)


def table(header, rows, caption=None):
    """A Markdown table of ``header`` (names, or "a | b") and ``rows``, every cell as written, after ``caption``."""
    columns = header.split(" | ") if isinstance(header, str) else header
    frame = pd.DataFrame([[str(c) for c in row] for row in rows], columns=columns)
    markdown = frame.to_markdown(index=False, disable_numparse=True)
    return f"{caption}\n\n{markdown}" if caption else markdown


SIDE_NAMES = {"sa_conv": "sa-conv", "reference": "reference", "sa_conv_no_remat": "sa-conv, no remat",
              "sa_conv_no_onednn": "sa-conv, oneDNN off", "sa_conv_mixed_bfloat16": "sa-conv, `mixed_bfloat16`",
              "sa_conv_mixed_float16": "sa-conv, `mixed_float16`"}
SPEEDS = ("train_speed", "inference_speed_batch1", "inference_speed_batch100")


def vs_reference_summary():
    """README: sa-conv's default side against the reference, ratios only."""
    rows = []
    for case, sides in load("vs_reference")["cases"].items():
        ratio = sides.get("ratios", {}).get("sa_conv")
        if "reference" in sides and ratio:
            rows.append([f"`{case}`"] + [fixed(ratio.get(k)) for k in (*SPEEDS, "peak_rss")])
    return table("preset | training speed | inference b=1 | inference b=100 | training peak RSS", rows)


def vs_reference_full():
    """Every side of every case: training images/s and peak RSS, and the ratios to the reference."""
    data = load("vs_reference")
    rows, dates = [], set()
    for case, sides in data["cases"].items():
        for side, run in sides.items():
            if side == "ratios":
                continue
            dates.add(run.get("date", data["date"]))
            r = sides.get("ratios", {}).get(side, {})
            extras = [what for what, key in (("remat", "remat"), ("XLA", "xla")) if run.get(key)]
            label = SIDE_NAMES.get(side, side) + (f" ({', '.join(extras)})" if extras and side != "reference" else "")
            rows.append([f"`{case}`", label, num(run.get("train_images_per_second")),
                         fixed(run.get("peak_rss_mb"), unit=1024),
                         "/".join(fixed(r.get(k)) for k in SPEEDS) if r else "-", fixed(r.get("peak_rss"))])
    days = sorted(dates)
    return table("case | side | train img/s | training peak RSS (GiB) | speed vs reference (train/b=1/b=100) | "
                  "RSS vs reference", rows,
                  f"Batch {data['batch']}; sides timed {days[0]} to {days[-1]} (each side's day in the JSON), so "
                  "speed ratios across days are indicative; memory ratios do not depend on the day.")


def throughput(name):
    """Per case: images/s, the training step's fraction of the matmul peak and peak RSS (batch and XLA named
    where they differ from the rest)."""
    data = load(name)
    results = [r for r in data["results"] if "train_images_per_second" in r]
    batches = [r.get("train_batch") for r in results]
    batch = max(set(batches), key=batches.count)
    rows = []
    for r in results:
        notes = [f"batch {r.get('train_batch')}"] * (r.get("train_batch") != batch)
        notes += ["XLA"] * bool(r.get("xla") and "xla" not in r["case"])
        rows.append([f"`{r['case']}`" + (f" ({', '.join(notes)})" if notes else ""),
                     num(r.get("train_images_per_second")), pair(r, "inference_images_per_second_", num),
                     fixed(r.get("train_fraction_of_matmul_peak")), fixed(r.get("peak_rss_mb"), unit=1024)])
    cpu = data["machine"].get("cpu", {})
    where = f", {process.cpu_class(cpu)}" if cpu.get("model") else ""
    return table("case | train img/s | infer img/s b=1/b=100 | train fraction of matmul peak | peak RSS (GiB)", rows,
                  f"{data['date']}{where}, batch {batch}, matmul peak {num(machine(data)[2])} GFLOP/s in that run.")


def throughput_ratios():
    """Ratios of two cases' figures timed in the same run."""
    rows = [[f"`{k}`", fixed(v)] for k, v in load("throughput")["ratios"].items()]
    return table("ratio (same run) | measured", rows)


def training_bfloat16():
    """Per preset (and XLA), its training images/s under ``mixed_bfloat16`` over float32's, timed in the same run, a
    column per CPU class (each ``throughput_bfloat16*`` report), with the float32 step's fraction of the matmul peak.
    Twins are matched by preset and XLA, which older reports name differently."""
    columns, cells = [], {}
    for path in sorted(RESULTS.glob("throughput_bfloat16*.json")):
        data = json.loads(path.read_text())
        peaks, where = data["machine"]["matmul_gflops"], process.cpu_class(data["machine"]["cpu"])
        columns.append(f"{where}, {data['date']} (matmul {peaks['bfloat16'] / peaks['float32']:.1f}x)")
        runs = {(r["preset"], bool(r["xla"]), r["precision"]): r for r in data["results"]}
        for (preset, xla, precision), r in runs.items():
            twin = runs.get((preset, xla, "float32"))
            if precision == "mixed_bfloat16" and twin:
                speed = r["train_images_per_second"] / twin["train_images_per_second"]
                cells.setdefault(f"`{preset}`" + (", XLA" * xla), {})[columns[-1]] = (
                    f"{speed:.2f}x ({fixed(twin.get('train_fraction_of_matmul_peak'))})")
    rows = [[case] + [per.get(column, "-") for column in columns] for case, per in sorted(cells.items())]
    return table(["case"] + columns, rows,
                 "Training images/s, bfloat16 over float32, both in one run, batch 100 (brackets: the float32 step's "
                 "fraction of its matmul peak; matmul: the bfloat16 peak over float32's).")


def malloc():
    """Speed and peak RSS keeping freed memory over returning it to the system, per preset."""
    data = load("malloc")
    rows = [[f"`{p}`", fixed(e["speedup_keep_over_return"]), fixed(e["peak_rss_ratio_keep_over_return"])]
            for p, e in data["presets"].items()]
    return table("preset | speed: keep / return freed memory | peak RSS: keep / return", rows,
                  "{date}, batch {batch}.".format_map(data))


def remat():
    """Speed and peak RSS of each remat variant over no remat, per preset."""
    data = load("remat_allocator")
    rows = [[f"`{preset}`", variant, fixed(r["speed_over_no_remat"]), fixed(r["peak_rss_over_no_remat"])]
            for preset, entry in data["presets"].items() for variant, r in entry["ratios"].items()]
    return table("preset | variant | speed / no remat | peak RSS / no remat", rows,
                  f"{', '.join(sorted({e['date'] for e in data['presets'].values()}))}, batch {data['batch']}, the "
                  "trainer's step.")


def epoch_overhead():
    """Seconds per epoch outside the optimizer steps, with tf.data's autotuning model and without."""
    data = load("epoch_overhead")
    names = {"autotune_model": "tf.data's autotuning model on (TensorFlow's default)",
             "no_model": "off (the pipeline's setting)"}
    rows = [[names[side]] + [f"{s[k]:.1f}" for k in ("median_outside_steps_seconds", "max_outside_steps_seconds",
                                                      "median_train_seconds")] for side, s in data["summary"].items()]
    return table("data pipeline | seconds outside the steps, median | max | seconds of steps, median", rows,
                  "{date}, {cpu_class}, `{preset}` on cifar10-mini, {epochs} epochs a run, ".format_map(data)
                  + f"{len(data['runs']['no_model'])} runs a side alternating, epochs after the first; the same final "
                  f"loss on both sides: {'yes' if data['same_final_loss'] else 'no'}.")


def iterator_deletion():
    """Seconds to delete an epoch's data iterator after epochs of several lengths, per input path."""
    data = load("iterator_deletion")
    names = {"tf_defaults": "model on, tf.distribute's iterator (TensorFlow's defaults)",
             "model_itself": "model on, the dataset itself", "distributed": "model off, tf.distribute's iterator",
             "trainer": "model off, the dataset itself (the trainer, one CPU replica)"}
    lengths = list(next(iter(data["runs"].values())))
    rows = [[names[side]] + [f"{s[n]['mean']:.1f} ({s[n]['max']:.1f}), {s[n]['waited']} waited" for n in lengths]
            for side, s in data["summary"].items()]
    return table(["input path"] + [f"epoch of {n} s" for n in lengths], rows,
                  "{date}, {cpu_class}, OneDeviceStrategy, the trainer's cifar10-mini pipeline ({batches} batches an "
                  "epoch), tf.data's autotuning model on or off: mean (max) seconds of deleting the iterator over "
                  "{repeats} epochs, and how many waited over {waited_seconds:g} s.".format_map(data))


def training_accuracy(name="vs_reference_training"):
    """Test accuracy of the reference and sa-conv trained alike, per encoding."""
    data = load(name)
    rows = [[encoding, ", ".join(map(str, t["seeds"])), num(t["reference"]), num(t["sa_conv"]),
             f"{t['difference_points']:+.1f}", num(t.get("sa_conv_keras_momentum"))]
            for encoding, t in data["table"].items()]
    return table("encoding | seeds | reference | sa-conv | difference (points) | sa-conv, Keras momentum", rows,
                  "{date}, {epochs} epochs, batch {batch_size}, test accuracy (mean over seeds).".format_map(data))


# {served side: (its name, the report's ratio of its images/s over the float32 SavedModel's in the same run)}.
SERVED = {"saved_model": ("SavedModel", None),
          "saved_model_bfloat16": ("bfloat16 SavedModel", "bfloat16_over_float32_export"),
          **{side: (name, f"{side}_over_saved_model") for side, name in (
              ("tflite", "TFLite"), ("tflite_int8", "TFLite int8"), ("onnx", "ONNX"), ("onnx_int8", "ONNX int8"),
              ("openvino", "OpenVINO"), ("openvino_int8", "OpenVINO int8"))}}


def _serving(cell):
    """``(CPU classes, rows)`` of the serving report: a row per preset, a cell per CPU class (its runs by date),
    ``cell(CPU class, the preset's entry or None)``."""
    runs = sorted(load("serving")["runs"].items(), key=lambda item: item[1]["date"])
    presets = sorted({preset for _, run in runs for preset in run["presets"]})
    rows = [[f"`{preset}`"] + [cell(cpu, run["presets"].get(preset)) for cpu, run in runs] for preset in presets]
    return [cpu for cpu, _ in runs], rows


def serving():
    """Per preset and exported form, its images/s over the float32 SavedModel's timed in the same run, a column
    per CPU class; each preset's first row is its float32 SavedModel's images/s."""
    cpus, rows = _serving(lambda cpu, entry: entry)
    forms = []
    for preset, *entries in rows:
        saved = [entry and entry["sides"].get("saved_model") for entry in entries]
        forms.append([preset, "SavedModel, img/s"] + [pair(s, "images_per_second_", num) for s in saved])
        for name, ratio in SERVED.values():
            cells = [pair(entry and entry["ratios"].get(ratio)) for entry in entries]
            if ratio and any(c != "-" for c in cells):
                forms.append(["", name] + cells)
    return table(["preset", "form", *cpus], forms,
                  "Images/s over the float32 SavedModel's, timed in the same run, batch 1/batch 100 (each preset's "
                  "first row: the SavedModel's own images/s); TFLite in LiteRT (XNNPACK), ONNX in ONNX Runtime, "
                  "OpenVINO's IR in OpenVINO; - not timed on that CPU.")


def serving_ratios():
    """The serving copy (`sa_conv.freeze_for_inference`) over the model as trained, per preset and CPU class."""
    cpus, rows = _serving(lambda cpu, entry: pair((entry or {}).get("ratios", {}).get("in_process_over_live")))
    return table(["preset", *cpus], rows, "Images/s of the serving copy over the model as trained, in process, "
                                           "batch 1/batch 100.")


def serving_choice():
    """Per preset and CPU class, the fastest exported form at batch 1 and at batch 100."""
    timed = {}

    def fastest(cpu, entry):
        if entry is None or "saved_model" not in entry["sides"]:
            return "-"
        over = {name: entry["ratios"][ratio] if ratio else {"batch1": 1.0, "batch100": 1.0}
                for name, ratio in SERVED.values() if ratio is None or ratio in entry["ratios"]}
        timed[cpu] = max(timed.get(cpu, 0), len(over))
        one, hundred = (max(over, key=lambda name: over[name][batch]) for batch in BATCHES)
        x1, x100 = fixed(over[one]["batch1"]), fixed(over[hundred]["batch100"])
        return f"{one} {x1}x/{x100}x" if one == hundred else f"{one} {x1}x, {hundred} {x100}x"

    cpus, rows = _serving(fastest)
    forms = ", ".join(f"{n} on {cpu.split(', ', 1)[-1]}" for cpu, n in timed.items())  # the CPU without its model
    return table(["preset", *cpus], rows, "The fastest exported form, as images/s over the float32 SavedModel's at "
                                           f"batch 1/batch 100 (two names: batch 1's, then batch 100's). Forms timed: "
                                           f"{forms}.")


def serving_summary():
    """README: the exported model against the reference, float32 and bfloat16 (the latest run with a reference)."""
    runs = sorted(load("serving")["runs"].items(), key=lambda item: item[1]["date"])
    cpu, run = [(cpu, run) for cpu, run in runs
                if any("saved_model_over_reference" in e["ratios"] for e in run["presets"].values())][-1]
    rows = [[f"`{preset}`"] + [fixed(e["ratios"][f"{form}_over_reference"][batch])
                               for form in ("saved_model", "saved_model_bfloat16") for batch in BATCHES]
            for preset, e in run["presets"].items() if "saved_model_over_reference" in e["ratios"]]
    return table("preset | SavedModel b=1 | SavedModel b=100 | bfloat16 SavedModel b=1 | bfloat16 SavedModel b=100",
                  rows, f"{cpu}, {run['date']}.")


def serving_aggregation():
    """The frozen layer's separable aggregation over the dense one, with constant probabilities."""
    data = load("serving_aggregation")
    cells = {}
    for r in data["aggregation"]:
        cells.setdefault(r["grid"], {})[r["batch"]] = fixed(r["separable_over_dense"])
    batches = sorted({r["batch"] for r in data["aggregation"]})
    rows = [[f"{grid}x{grid}"] + [by.get(b, "-") for b in batches] for grid, by in cells.items()]
    return table(["grid"] + [f"batch {b}" for b in batches], rows, "{date}, one paper-size layer (9 heads, 400 "
                  "channels): images/s of the separable aggregation over the dense one.".format_map(data))


def against_commit(*names):
    """Per report (a change) and preset, this tree's figures against an earlier commit's, both in one process, in
    turns: the training step, and the range over the inference figures (as trained, frozen and SavedModel in float32;
    as trained under a mixed precision)."""
    rows = []
    for name in names:
        data = load(name)
        change = f"`{data['before']}` → `{data['after']}`, {process.cpu_class(data['machine']['cpu'])}"
        for preset, entry in data["presets"].items():
            figures = dict(entry["figures"])
            step = figures.pop("train_step", None)
            best, medians = ([f[k] for f in figures.values()] for k in ("after_over_before", "round_ratios_median"))
            training = "-" if step is None else \
                f"{fixed(step['after_over_before'])} ({fixed(step['round_ratios_median'])})"
            rows.append([change, f"`{preset}`", entry.get("precision", "float32"), training,
                         f"{fixed(min(best))}-{fixed(max(best))} ({fixed(min(medians))}-{fixed(max(medians))})"])
    return table("change | preset | precision | training step | inference", rows,
                 "After / before images/s at the fastest rounds (per-round medians); inference at batch 1 and 100, "
                 "as trained, frozen and as SavedModel in float32, as trained under a mixed precision.")


def scaling():
    """Per preset and grid, the dense and separable paths (``dense/separable``): images/s, training's peak RSS,
    remat, and a training step's memory growth from the smallest grid against ``N (H + W)``."""
    data = load("scaling")
    cases, paths, failures, first, rows = data["cases"], ("dense", "separable"), [], {}, []

    def speed(result, what):
        """images/s, or ``failed`` (what it died of, how much it held and its limit go to the caption)."""
        if "error" not in result:
            return num(result.get("images_per_second"))
        error, seen, limit = result["error"], result.get("largest_rss_seen_mb"), result.get("memory_limit_gb")
        died = "out of memory" if ("OOM when allocating" in error or "MemoryError" in error) else error.split(":")[0]
        where = ", ".join(w for w in (seen and f"{float(seen) / 1024:.1f} GiB RSS reached",
                                      limit and f"allocations limited to {float(limit):.1f} GiB") if w)
        failures.append(f"{what}: {died}" + (f" ({where})" if where else ""))
        return "failed"

    # Case names (preset/GxG/path/mode) say what every case was, failed ones too.
    names = (name.split("/") for name in cases)
    for preset, grid in sorted({(preset, int(grid.split("x")[0])) for preset, grid, *_ in names}):
        train, infer = ({p: cases.get(f"{preset}/{grid}x{grid}/{p}/{mode}", {}) for p in paths}
                        for mode in ("train", "infer"))
        growth = {p: train[p].get("step_peak_growth_mb") for p in paths}
        base = {p: first.setdefault((preset, p), (grid, growth[p])) for p in paths}
        rows.append([f"`{preset}`", f"{grid}x{grid}", fixed((grid / base["dense"][0]) ** 3),  # N (H + W) = 2 G^3
                     "/".join(speed(train[p], f"`{preset}` {grid}x{grid} {p} training") for p in paths),
                     "/".join(fixed(train[p].get("peak_rss_mb"), 1, 1024) for p in paths),
                     "/".join(fixed(growth[p] / base[p][1]) if growth[p] and base[p][1] else "-" for p in paths),
                     "/".join("yes" if train[p].get("remat") else "no" if "remat" in train[p] else "-" for p in paths),
                     "/".join(speed(infer[p], f"`{preset}` {grid}x{grid} {p} inference") for p in paths)])
    cores, memory_gb, _ = machine(data)
    return table("preset | grid | N(H+W) / smallest | train img/s | train peak RSS (GiB) | "
                  "train step memory / smallest grid's | remat | infer img/s", rows,
                  f"{data['date']}, batch {data['batch']}, attention dropout 0, the trainer's step and `--remat=auto`, "
                  f"a {cores}-core machine with {memory_gb:.0f} GiB; each cell dense/separable"
                  + "".join(f"; {f}" for f in failures) + ".")


def resolution_transfer():
    """Test accuracy of a model trained at 32x32, evaluated at 64x64 with and without fine-tuning."""
    data = load("resolution_transfer")
    rows = {"32x32, as trained": "at_32", "64x64, the same weights, no fine-tuning": "at_64_without_fine_tuning",
            "64x64, after {fine_tune_epochs} epoch(s) of fine-tuning (learning rate {fine_tune_learning_rate:g})":
                "at_64_after_fine_tuning",
            "64x64, {fine_tune_epochs} epoch(s) from scratch (learning rate {learning_rate:g})":
                "at_64_from_scratch_same_epochs"}
    return table("evaluated at | test accuracy", [[row.format_map(data), fixed(data["test_accuracy"][key])]
                                                   for row, key in rows.items()],
                  "{date}: `{model}` on {data_dir} ({train_images} training, {test_images} test images), "
                  "{epochs_at_32} epochs at 32x32, batch {batch}; 64x64 = {what_64_means}.".format_map(data))



# {table: (the report it is made from, the function making it)}
TABLES = {
    "vs_reference_summary": ("vs_reference", vs_reference_summary), "vs_reference": ("vs_reference", vs_reference_full),
    "throughput_encodings": ("throughput_encodings", functools.partial(throughput, "throughput_encodings")),
    "throughput_xla": ("throughput_xla", functools.partial(throughput, "throughput_xla")),
    "throughput_ratios": ("throughput", throughput_ratios),
    "training_bfloat16": ("throughput_bfloat16", training_bfloat16), "remat": ("remat_allocator", remat),
    "malloc": ("malloc", malloc),
    "epoch_overhead": ("epoch_overhead", epoch_overhead), "iterator_deletion": ("iterator_deletion", iterator_deletion),
    "vs_reference_training": ("vs_reference_training", training_accuracy),
    "vs_reference_lockstep": ("vs_reference_lockstep", functools.partial(training_accuracy, "vs_reference_lockstep")),
    "serving": ("serving", serving), "serving_ratios": ("serving", serving_ratios),
    "serving_summary": ("serving", serving_summary), "serving_choice": ("serving", serving_choice),
    "serving_aggregation": ("serving_aggregation", serving_aggregation),
    "against_commit": ("against_commit*", functools.partial(
        against_commit, "against_commit", "against_commit_aggregation", "against_commit_bfloat16_softmax")),
    "scaling": ("scaling", scaling),
    "resolution_transfer": ("resolution_transfer", resolution_transfer),
}
