"""Serving speed: inference of the in-process model and of every exported file in its own
runtime, float32, bfloat16 and int8, at batch 1 and 100, each in its own process, as images/s and
as a fraction of the matching matmul peak measured in the same process.

    .venv/bin/python -m benchmarks.serving                       # benchmarks/results/serving.json
    .venv/bin/python -m benchmarks.serving --presets=sa_quadratic_small --steps=5 --merge
    .venv/bin/python -m benchmarks.serving --aggregation_only   # benchmarks/results/serving_aggregation.json
    .venv/bin/python -m benchmarks.serving --reference_dir=PATH --reference_python=PY   # + the reference

For each preset (random weights: speed does not depend on their values) the parent writes the
model, exports it (``export.export``: the frozen copy, `sa_conv.freeze_for_inference`, float32
with its TFLite and ONNX files, and ``--precision=bfloat16``), quantizes the ONNX file to int8
the TFLite file and the OpenVINO IR to int8 as ``--precision=int8`` does (`export.int8`; the OpenVINO
file calibrated on generated images) and starts one child per side:

* ``in_process_live``: the Keras model as trained, ``model(x, training=False)`` in a tf.function;
* ``in_process``: its frozen copy (what the export serves);
* ``saved_model``, ``saved_model_bfloat16``: ``serving_default`` of each export, reloaded; the
  float32 one also times its first batch-1 call after replaying the export's TensorFlow Serving
  warm-up records, against the steady call (`first_call`);
* ``tflite``, ``tflite_int8``: the TFLite file and its dynamic-range int8 quantization in LiteRT's
  interpreter (its default XNNPACK delegate), with LiteRT's own float32 and int8 peaks;
* ``onnx``, ``onnx_int8``: the ONNX file and its dynamic int8 quantization in ONNX Runtime,
  with ONNX Runtime's own float32 and int8 (``MatMulInteger``) peaks;
* ``openvino``, ``openvino_int8``: the export's OpenVINO IR (``--formats=...,openvino``) and its
  NNCF int8 quantization in OpenVINO's CPU plugin (int8 products with weights, the rest in its
  default precision for the CPU: bfloat16 where the CPU has it, float32 otherwise; recorded), with
  OpenVINO's own float32 matmul peak.
  Optional: without ``pip install openvino nncf`` the sides are recorded as skipped.

* ``reference`` (with ``--reference_dir``, a clone of ``epfml/attention-cnn``, and
  ``--reference_python``, an interpreter with torch): the reference's ``BertImage`` of the same
  size (`epfml_reference.reference_config`) or its ResNet18, eval mode, ``torch.no_grad``.

Ratios: saved_model / in_process (the target: within 10%), frozen / live, bfloat16 /
float32 export, each runtime / the float32 SavedModel, and every side / the reference.
``--aggregation_only`` times one paper-size attention layer with constant probabilities on the
dense and the separable path per grid and batch, the measurements behind the frozen layer's
choice. Results go to JSON; nothing here is a test.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import tempfile

from benchmarks import harness

PAPER = ["sa_quadratic", "sa_quadratic_full", "sa_learned", "sa_content_plus_learned_bias", "resnet18"]
SIDES = ("in_process_live", "in_process", "saved_model", "saved_model_bfloat16", "tflite", "tflite_int8", "onnx",
         "onnx_int8", "openvino", "openvino_int8")
# The sides that read an exported file (`runtime_formats`: which format's; export is imported in
# the functions, after the process is configured).
RUNTIME_SIDES = ("tflite", "tflite_int8", "onnx", "onnx_int8", "openvino", "openvino_int8")


def runtime_formats() -> dict:
    """``{side: the export format whose file it reads}`` for the `RUNTIME_SIDES`: the float32
    formats of `export.formats.FORMATS` and the int8 ones of `export.int8.QUANTIZED`, by name."""
    from export import formats, int8

    named = {**formats.FORMATS, **{fmt.name: fmt for fmt in int8.QUANTIZED}}
    return {side: named[side] for side in RUNTIME_SIDES}


def runtime_files() -> dict:
    """``{side: the file it reads}``, relative to the export's version directory."""
    return {side: fmt.file for side, fmt in runtime_formats().items()}


def missing_runtimes(side: str) -> list[str]:
    """The packages this interpreter lacks of the format ``side`` reads (`Format.packages`), an
    int8 file's with those of the float32 format it quantizes (its export writes that one first)."""
    formats = runtime_formats()
    if side not in formats:
        return []
    chain = [formats[side]]
    if getattr(chain[0], "quantizes", None):
        chain.insert(0, formats[chain[0].quantizes])
    needed = dict.fromkeys(package for fmt in chain for package in fmt.packages)
    return [package for package in needed if importlib.util.find_spec(package) is None]


# The precision of each side's products, whose matmul peak it is a fraction of (float32 otherwise;
# the int8 OpenVINO file stores int8 weights and computes in the plugin's float precision).
SIDE_PRECISION = {"saved_model_bfloat16": "bfloat16", "tflite_int8": "int8", "onnx_int8": "int8"}
BATCHES = (1, 100)


def child(args):
    """One side in this process: prints ``RESULT {json}``."""
    import numpy as np
    import tensorflow as tf

    result = {"side": args.side}
    rng = np.random.default_rng(0)
    if args.side in RUNTIME_SIDES:
        run, shape = runtime(args.side, args.path, result)
    elif args.side.startswith("saved_model"):
        loaded = tf.saved_model.load(args.path)
        serve = loaded.signatures["serving_default"]
        shape = tuple(serve.structured_input_signature[1]["images"].shape[1:])

        def run(x):
            return serve(images=x)["probabilities"].numpy()

        result.update(first_call(args.path, loaded, run, shape, rng))
    else:
        import keras

        import sa_conv

        model = keras.models.load_model(args.path)
        if args.side == "in_process":
            model = sa_conv.freeze_for_inference(model)
        shape = tuple(model.inputs[0].shape[1:])
        fn = tf.function(lambda images: tf.nn.softmax(model(images, training=False)))

        def run(x):
            return fn(x).numpy()
    for batch in BATCHES:
        x = rng.integers(0, 256, (batch,) + shape).astype(np.uint8)
        x = x if args.side in RUNTIME_SIDES else tf.constant(x)
        steps = args.steps if batch == 1 else max(2, args.steps // 5)
        result[f"images_per_second_batch{batch}"] = batch / harness.fastest(lambda: run(x), steps)
    # ONNX Runtime's, OpenVINO's and LiteRT's own peaks for their sides.
    framework = ("onnxruntime" if args.side.startswith("onnx") else "openvino" if args.side.startswith("openvino")
                 else "tflite" if args.side.startswith("tflite") else "tensorflow")
    result["matmul_gflops"] = harness.matmul_peaks(framework, args.matmul_size)
    harness.print_result(result)


def first_call(path, loaded, run, shape, rng, steady_calls=5) -> dict:
    """The first batch-1 call of the SavedModel at ``path``, freshly ``loaded``, after replaying its
    TensorFlow Serving warm-up records (what the model server does on load), against the steady
    call: seconds and their ratio. Without records (exported without tensorflow-serving-api): the
    cold first call."""
    import time

    import numpy as np
    import tensorflow as tf

    from export import tf_serving

    x = tf.constant(rng.integers(0, 256, (1,) + shape).astype(np.uint8))
    records = os.path.join(path, tf_serving.WARMUP_FILE)
    replayed = os.path.exists(records) and tf_serving.available()
    if replayed:
        tf_serving.replay(loaded, tf_serving.read_warmup(records))
    start = time.perf_counter()
    run(x)
    first = time.perf_counter() - start
    steady = harness.fastest(lambda: run(x), steady_calls)
    return {"first_call_batch1": first, "after_warmup_records": replayed, "steady_call_batch1": steady,
            "first_over_steady_batch1": first / steady}


def runtime(side, path, result, float32=False):
    """``(run, image shape)`` of an exported file in its own runtime: the TFLite interpreter
    (LiteRT, its default XNNPACK delegate), which takes the serving signature's uint8 pixels, or ONNX
    Runtime, which takes the Keras model's float32 input (the same pixels as floats: the
    normalization is inside the model), on all cores. A runtime that picks its precision by
    itself (OpenVINO: bfloat16 on CPUs with AVX512_BF16 or AMX) keeps its default, which is what
    a user serving the file gets, unless ``float32``: for comparing with float32 results."""
    import numpy as np

    threads = os.cpu_count()
    result["file"], result["file_megabytes"] = os.path.basename(path), os.path.getsize(path) / 2**20
    if side.startswith("tflite"):
        from importlib import metadata

        from export import runtimes

        interpreter = runtimes.tflite_interpreter(path, num_threads=threads)
        runner = interpreter.get_signature_runner("serving_default")
        shape = tuple(runner.get_input_details()["images"]["shape"][1:])
        result["runtime"] = f"litert {metadata.version('ai-edge-litert')}"
        return (lambda x: runner(images=x)["probabilities"]), shape
    if side.startswith("openvino"):
        import openvino

        from export import runtimes

        result["file_megabytes"] = os.path.getsize(path.replace(".xml", ".bin")) / 2**20  # the IR's weights
        compiled = runtimes.openvino_compiled(path, "f32" if float32 else None, threads)
        request = compiled.create_infer_request()
        result["runtime"] = f"openvino {openvino.__version__}"
        result["inference_precision"] = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        shape = tuple(int(d.get_length()) for d in compiled.input(0).get_partial_shape()[1:])  # batch is dynamic
        output = compiled.output(0)
        return (lambda x: request.infer({0: x.astype(np.float32)})[output]), shape
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    result["runtime"] = f"onnxruntime {onnxruntime.__version__}"
    shape = tuple(session.get_inputs()[0].shape[1:])
    return (lambda x: session.run(None, {name: x.astype(np.float32)})[0]), shape


def reference_child(args):
    """The reference's model in this process (torch, no TensorFlow): its images/s and matmul peaks."""
    import numpy as np
    import torch

    import epfml_reference

    models = harness.reference_models(args.reference_dir)

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    preset = json.loads(args.path)
    if preset["architecture"] == "resnet18":
        model = models.ResNet18(num_classes=10)
    else:
        fields = ("num_layers", "num_heads", "hidden_size", "mlp_size", "dropout", "attention_dropout", "pooling_width")
        model = models.BertImage(epfml_reference.reference_config(preset["encoding"], **{f: preset[f] for f in fields}),
                                 num_classes=10)
    model.eval()
    rng = np.random.default_rng(0)
    result = {"side": "reference", "torch": torch.__version__}
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.from_numpy(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32))
            steps = args.steps if batch == 1 else max(2, args.steps // 5)
            result[f"images_per_second_batch{batch}"] = batch / harness.fastest(lambda: model(x), steps)
        result["matmul_gflops"] = harness.matmul_peaks("torch", args.matmul_size)
    return result


def _child(side, path, steps, matmul_size, python=None, reference_dir=None):
    from trainers import process

    args = [f"--path={path}", f"--steps={steps}", f"--matmul_size={matmul_size}"]
    args += [f"--reference_dir={reference_dir}"] if reference_dir else []
    return harness.run_side(__name__, side, args, python, env=process.child_environment())


def earlier_presets(path: str) -> dict:
    """The presets of this CPU class's run in the report at ``path`` (none if there is no report),
    each with the run's ``other_load`` unless it has its own (an entry kept from a run before)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        run = json.load(f).get("runs", {}).get(harness.cpu_class(), {})
    return {name: {"other_load": run.get("other_load"), **entry} for name, entry in run.get("presets", {}).items()}


def kept_sides(earlier: dict | None) -> dict:
    """The sides of ``earlier`` (a preset's entry in `earlier_presets`), each with the day it was
    timed and the other load beside it unless it has its own: a run that times some sides again
    dates and loads only those."""
    earlier = earlier or {}
    return {side: {"date": earlier.get("date"), "other_load": earlier.get("other_load"), **run}
            for side, run in earlier.get("sides", {}).items()}


def measure_preset(preset, steps, workdir, reference_dir=None, reference_python=None, matmul_size=2048,
                   only=SIDES, earlier=None):
    """The sides ``only`` of ``preset`` (and the reference's with ``reference_dir``), beside the
    sides of ``earlier`` (this preset's entry of an earlier run, with ``--merge``) not measured
    again; each side's fraction of its peak and the ratios between sides."""
    import sa_conv
    from benchmarks import flops
    from export import int8
    from export.export import export

    config = sa_conv.get_config(preset)
    model = sa_conv.build_model(config, name=preset)
    path = os.path.join(workdir, f"{preset}.keras")
    model.save(path)
    requested, only = only, [side for side in only if not missing_runtimes(side)]
    formats = [name for name in ("tflite", "onnx", "openvino") if any(s.startswith(name) for s in only)]
    exports = {"saved_model": export(model_path=path, export_dir=os.path.join(workdir, "f32"),
                                     formats=["saved_model", *formats], log=lambda s: None)}
    # The int8 files the export writes for --precision=int8 (see export.int8), from the float32 ones.
    frozen = sa_conv.freeze_for_inference(model)
    if "onnx_int8" in only:
        int8.OnnxDynamicInt8().quantize(exports["saved_model"], frozen)
    if "tflite_int8" in only:
        int8.TFLiteDynamicRange().quantize(exports["saved_model"])
    if "openvino_int8" in only:  # calibrated on generated images: with random weights only its speed is measured
        from export.formats import CALIBRATION_IMAGES
        from trainers.data import make_synthetic

        images = make_synthetic(1, CALIBRATION_IMAGES, seed=0, image_shape=tuple(model.inputs[0].shape[1:])).test.images
        int8.OpenVINOInt8().quantize(exports["saved_model"], frozen, images)
    exports.update({side: os.path.join(exports["saved_model"], name) for side, name in runtime_files().items()})
    # Random weights decide nothing of speed, but the agreement check needs a trained model's
    # margins: it is measured by the export tests, not here.
    from export import export as export_lib

    minimum, export_lib.MIN_TOP1_AGREEMENT = export_lib.MIN_TOP1_AGREEMENT, 0.0
    try:
        if "saved_model_bfloat16" in only:
            exports["saved_model_bfloat16"] = export(model_path=path, export_dir=os.path.join(workdir, "bf16"),
                                                     precision="bfloat16", tf_serving_files=False,
                                                     log=lambda s: None)
    finally:
        export_lib.MIN_TOP1_AGREEMENT = minimum
    today = datetime.date.today().isoformat()
    sides = kept_sides(earlier)
    for side in [side for side in SIDES if side in requested]:
        missing = missing_runtimes(side)
        if missing:
            sides[side] = {"skipped": f"{', '.join(missing)} not installed (pip install {' '.join(missing)})"}
        else:
            print(f"{preset}: timing {side} ...", flush=True)
            sides[side] = {**_child(side, exports.get(side, path), steps, matmul_size), "date": today}
    if reference_dir:
        sides["reference"] = {**_child("reference", json.dumps(config.to_dict()), steps, matmul_size,
                                       reference_python, reference_dir), "date": today}
    # Each side's own arithmetic: the served copy folds maps (`flops.forward_flops` frozen), the
    # reference aggregates densely and maps twice (as the model as trained with the dense path).
    forwards = {"in_process_live": flops.forward_flops(config), "reference": flops.forward_flops(config, fast=False)}
    measured = {side: run for side, run in sides.items() if "skipped" not in run}
    for side, run in measured.items():  # the reference computes in float32
        if side not in only and not (side == "reference" and reference_dir):
            continue  # an earlier run's, with its own figures
        peak = run["matmul_gflops"][SIDE_PRECISION.get(side, "float32")]
        forward = forwards.get(side, flops.forward_flops(config, frozen=True))
        run["forward_gflops_per_image"] = forward / 1e9
        for batch in BATCHES:
            achieved = run[f"images_per_second_batch{batch}"] * forward / 1e9
            run[f"fraction_of_matmul_peak_batch{batch}"] = achieved / peak
    fresh = set(only) | ({"reference"} if reference_dir else set())
    ratios = ratios_of(sides, fresh, (earlier or {}).get("ratios", {}))
    slower = slower_than_float32(ratios)
    for side, by_batch in slower.items():
        print(f"{preset}: {side} serves slower than the float32 file it comes from: {by_batch}", flush=True)
    return {"date": today, "forward_gflops_per_image": forwards["in_process_live"] / 1e9,
            "sides": sides, "ratios": ratios, "slower_than_float32": slower}


RATIOS = {"saved_model_over_in_process": ("saved_model", "in_process"),
          "in_process_over_live": ("in_process", "in_process_live"),
          "bfloat16_over_float32_export": ("saved_model_bfloat16", "saved_model"),
          "tflite_over_saved_model": ("tflite", "saved_model"),
          "onnx_over_saved_model": ("onnx", "saved_model"),
          "tflite_int8_over_saved_model": ("tflite_int8", "saved_model"),
          "tflite_int8_over_tflite": ("tflite_int8", "tflite"),
          "onnx_int8_over_saved_model": ("onnx_int8", "saved_model"),
          "onnx_int8_over_onnx": ("onnx_int8", "onnx"),
          "openvino_over_saved_model": ("openvino", "saved_model"),
          "openvino_over_onnx": ("openvino", "onnx"),
          "openvino_int8_over_saved_model": ("openvino_int8", "saved_model"),
          "openvino_int8_over_openvino": ("openvino_int8", "openvino")}


# Each low-precision side, by the ratio to the float32 side it is made from.
LOW_PRECISION = {"saved_model_bfloat16": "bfloat16_over_float32_export", "tflite_int8": "tflite_int8_over_tflite",
                 "onnx_int8": "onnx_int8_over_onnx", "openvino_int8": "openvino_int8_over_openvino"}


def slower_than_float32(ratios: dict) -> dict:
    """``{side: {"batch<n>": ratio}}``: the low-precision sides (`LOW_PRECISION`) that serve
    slower than their float32 side at some batch size, with those batches' ratios."""
    return {side: {batch: ratio for batch, ratio in ratios[name].items() if ratio < 1}
            for side, name in LOW_PRECISION.items() if name in ratios and min(ratios[name].values()) < 1}


def ratios_of(sides: dict, fresh: set, earlier: dict) -> dict:
    """``{name: {"batch<n>": images/s of a over b}}`` for the pairs of `RATIOS` and every side over
    the reference, from ``sides`` (``{side: its record}``, skipped ones without figures). A ratio is
    of two sides timed side by side in one run: of two ``fresh`` sides (timed now), computed; else
    the earlier run's (``earlier``), where it timed both; never of one side of each run."""
    measured = {side for side, run in sides.items() if "skipped" not in run}
    pairs = {**RATIOS, **{f"{side}_over_reference": (side, "reference") for side in SIDES}}
    ratios = {}
    for name, (a, b) in pairs.items():
        if a not in measured or b not in measured:
            continue
        if a in fresh and b in fresh:
            ratios[name] = {f"batch{n}": sides[a][f"images_per_second_batch{n}"] / sides[b][f"images_per_second_batch{n}"]
                            for n in BATCHES}
        elif name in earlier:
            ratios[name] = earlier[name]
    return ratios


def aggregation(steps, grids=(4, 8, 12, 16, 24), batches=BATCHES):
    """One paper-size attention layer (9 heads, 400 channels) with constant probabilities, on
    the dense and on the separable path: images/s per grid and batch."""
    import numpy as np
    import tensorflow as tf

    import sa_conv
    from sa_conv import serving

    rows = []
    for grid in grids:
        for batch in batches:
            x = tf.constant(np.random.default_rng(0).normal(size=(batch, grid, grid, 400)).astype(np.float32))
            row = {"grid": grid, "batch": batch}
            for path, fast in (("dense", False), ("separable", True)):
                trained = sa_conv.MultiHeadSelfAttention2D(9, encoding="quadratic", max_grid_size=grid,
                                                           fast_position_attention=fast)
                trained.build(x.shape)
                layer = serving.serving_attention(trained, x.shape)
                fn = tf.function(lambda t, layer=layer: layer(t, training=False))
                row[path] = batch / harness.fastest(lambda: fn(x).numpy(), steps if batch == 1 else max(2, steps // 5))
            row["separable_over_dense"] = row["separable"] / row["dense"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main():
    parser = harness.arguments(__doc__, "serving.json")
    parser.add_argument("--presets", default=",".join(PAPER))
    parser.add_argument("--steps", type=int, default=10, help="timed calls at batch 1 (batch 100: a fifth)")
    parser.add_argument("--sides", default=",".join(SIDES), help="the sides to time (with --merge, the others of "
                        "each preset's earlier entry stay)")
    parser.add_argument("--aggregation_only", action="store_true")
    parser.add_argument("--reference_dir", help="a clone of epfml/attention-cnn: adds the reference side")
    parser.add_argument("--reference_python", default=None, help="an interpreter with torch for the reference side")
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--matmul_size", type=int, default=2048, help="side of the square matmul whose GFLOP/s is "
                        "the peak each side is a fraction of")
    args = harness.parse(parser, reference_child, {"aggregation_only": "serving_aggregation.json"})
    if args is None:
        return
    from trainers import process

    if args.side:
        return child(args)
    record = {"process": process.describe("float32")}
    if args.aggregation_only:
        record["aggregation"] = aggregation(args.steps)
        harness.write_report(args.output, record, merge=args.merge)
        return
    record["presets"] = {}
    only = [side for side in args.sides.split(",") if side]
    unknown = sorted(set(only) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {unknown}; the sides are {', '.join(SIDES)}")
    if set(only) != set(SIDES) and not args.merge:
        parser.error("--sides times part of a run: add --merge, which keeps the other sides of each preset's "
                     "earlier entry")
    earlier = earlier_presets(args.output) if args.merge else {}
    with tempfile.TemporaryDirectory() as workdir:
        for preset in [p for p in args.presets.split(",") if p]:
            record["presets"][preset] = measure_preset(preset, args.steps, workdir, args.reference_dir,
                                                       args.reference_python, args.matmul_size, only,
                                                       earlier.get(preset))
            print(preset, json.dumps(record["presets"][preset]["ratios"]), flush=True)
            # After every preset (an interrupted run keeps the ones it finished), under this CPU's
            # class: which format serves fastest depends on the CPU's matrix units, so the runs of
            # other classes stay beside it.
            harness.write_report(args.output, record, merge=args.merge, section=harness.cpu_class())


if __name__ == "__main__":
    main()
