"""One TFLite file, two interpreters: LiteRT (``ai-edge-litert``, what sa-conv runs TFLite files
in) against TensorFlow's own bundled ``tf.lite.Interpreter``, on the float32 file, the
full-integer int8 file the export writes (`export.int8.TFLiteFullInteger`) and a dynamic-range
int8 file (int8 weights; activations quantized per call by XNNPACK), each at batch 1 and 100:

    .venv/bin/python -m benchmarks.tflite_runtimes   # benchmarks/results/tflite_runtimes.json

The dynamic-range file is the one the export writes (`export.int8.TFLiteDynamicRange`); the
full-integer one is what it wrote before. ``ops`` times one-op full-integer files of the shapes of
``sa_quadratic``'s attention (`OPS`) in each interpreter with its default delegate and without any
(``BUILTIN_WITHOUT_DEFAULT_DELEGATES``): an op whose time does not change without the delegate is
not delegated.

For each preset (random weights: speed does not depend on their values) the parent exports the
float32 SavedModel and TFLite file, writes the two int8 files from them (the full-integer one
calibrated on random images, as the serving benchmark does), and starts one child per
interpreter, which times every file alternately (the fastest of ``--steps`` calls, after a
warm-up call), both with their default XNNPACK delegate, on all cores. Ratios are of files timed
in one child (an int8 file over the float32 file, in that interpreter) or of the two children
run back to back (LiteRT over TensorFlow's, per file). Each child also counts the nodes and
delegate partitions its interpreter makes of each file. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from benchmarks import harness
from benchmarks.serving import PAPER as PRESETS  # the serving benchmark's presets
FILES = {"float32": "model.tflite", "full_integer": "model_full_integer.tflite", "dynamic_range": "model_int8.tflite"}
# One-op int8 files: (heads, positions, head size) of sa_quadratic's attention at batch 8.
HEADS, POSITIONS, HEAD_SIZE, OPS_BATCH = 9, 256, 44, 8
OPS = {
    "aggregation": "BATCH_MATMUL of a constant (heads, N, N) probability tensor by the values",
    "content_logits": "BATCH_MATMUL of two activations (queries by keys)",
    "dense": "FULLY_CONNECTED of the activations by a 400 x 400 weight",
}
INTERPRETERS = ("litert", "tensorflow")
BATCHES = (1, 100)


def interpreter(side: str, path: str):
    """``side``'s interpreter of the file at ``path``, on all cores, its default delegate."""
    if side == "litert":
        from ai_edge_litert.interpreter import Interpreter
    else:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter  # noqa: N806
    return Interpreter(model_path=path, num_threads=os.cpu_count())


def child(side: str, directory: str, steps: int) -> dict:
    """Every file of `FILES` in ``directory`` in the ``side`` interpreter: images/s per batch and
    its nodes and delegate partitions; the files alternate within each batch size."""
    from importlib import metadata

    import numpy as np
    import tensorflow as tf

    runners, result = {}, {"version": metadata.version("ai-edge-litert") if side == "litert" else tf.__version__}
    for name, file in FILES.items():
        it = interpreter(side, os.path.join(directory, file))
        it.allocate_tensors()
        ops = it._get_ops_details()  # the interpreter's public API has no other view of its delegation
        result[name] = {"nodes": len(ops), "delegate_partitions": sum(o["op_name"] == "DELEGATE" for o in ops)}
        runners[name] = it.get_signature_runner("serving_default")
    shape = tuple(runners["float32"].get_input_details()["images"]["shape"][1:])
    for batch in BATCHES:
        images = np.random.default_rng(0).integers(0, 256, (batch, *shape), dtype=np.uint8)
        for name, runner in runners.items():
            seconds = harness.fastest(lambda: runner(images=images), steps if batch == 1 else max(2, steps // 5))
            result[name][f"images_per_second_batch{batch}"] = batch / seconds
    return result


def child_ops(side: str, directory: str, steps: int) -> dict:
    """Milliseconds per call of each `OPS` file in ``directory``, with ``side``'s default delegate and
    without any."""
    import numpy as np

    if side == "litert":
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    else:
        import tensorflow as tf

        Interpreter, OpResolverType = tf.lite.Interpreter, tf.lite.experimental.OpResolverType  # noqa: N806
    result = {}
    for name in OPS:
        result[name] = {}
        for label, resolver in (("default", "AUTO"), ("without_delegate", "BUILTIN_WITHOUT_DEFAULT_DELEGATES")):
            it = Interpreter(model_path=os.path.join(directory, f"{name}.tflite"), num_threads=os.cpu_count(),
                             experimental_op_resolver_type=getattr(OpResolverType, resolver))
            it.allocate_tensors()
            detail = it.get_input_details()[0]
            x = np.random.default_rng(0).integers(-100, 100, detail["shape"]).astype(detail["dtype"])

            def call():
                it.set_tensor(detail["index"], x)
                it.invoke()

            result[name][f"{label}_ms"] = 1e3 * harness.fastest(call, steps)
    return result


def op_files(directory: str) -> None:
    """Writes the full-integer one-op files of `OPS` into ``directory``."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    probabilities = tf.constant(rng.random((HEADS, POSITIONS, POSITIONS)).astype(np.float32) / POSITIONS)
    weight = tf.constant(rng.standard_normal((400, 400)).astype(np.float32) / 20)
    attention = (OPS_BATCH, HEADS, POSITIONS, HEAD_SIZE)
    functions = {
        "aggregation": (lambda v: tf.einsum("hnm,bhmd->bhnd", probabilities, v), attention),
        "content_logits": (lambda q: tf.matmul(q, q, transpose_b=True), attention),
        "dense": (lambda x: tf.matmul(x, weight), (OPS_BATCH * POSITIONS, 400)),
    }
    for name, (function, shape) in functions.items():
        concrete = tf.function(function, input_signature=[tf.TensorSpec(shape, tf.float32)]).get_concrete_function()
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([rng.standard_normal(shape).astype(np.float32)] for _ in range(4))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        with open(os.path.join(directory, f"{name}.tflite"), "wb") as f:
            f.write(converter.convert())


def export_files(preset: str, workdir: str) -> str:
    """The float32 export of ``preset`` with its TFLite file and the two int8 files of `FILES`;
    returns the directory that holds them."""
    import numpy as np
    import tensorflow as tf

    import sa_conv
    from export import int8
    from export.export import export

    model = sa_conv.build_model(sa_conv.get_config(preset), name=preset)
    path = os.path.join(workdir, f"{preset}.keras")
    model.save(path)
    version = export(model_path=path, export_dir=os.path.join(workdir, "export"), formats=["saved_model", "tflite"],
                     tf_serving_files=False, log=lambda s: None)
    int8.TFLiteDynamicRange().quantize(version)
    calibration = np.random.default_rng(1).integers(0, 256, (100, *model.inputs[0].shape[1:]), dtype=np.uint8)
    converter = tf.lite.TFLiteConverter.from_saved_model(version, signature_keys=["serving_default"])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ({"images": calibration[i: i + 1]} for i in range(len(calibration)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    directory = os.path.dirname(os.path.join(version, int8.TFLiteDynamicRange.file))
    with open(os.path.join(directory, FILES["full_integer"]), "wb") as f:
        f.write(converter.convert())
    return directory


def ratios(sides: dict) -> dict:
    """Per interpreter, each int8 file over the float32 file; per file, LiteRT over TensorFlow's."""
    out = {}
    for side in INTERPRETERS:
        for name in ("full_integer", "dynamic_range"):
            out[f"{side}_{name}_over_float32"] = {
                f"batch{b}": sides[side][name][f"images_per_second_batch{b}"]
                / sides[side]["float32"][f"images_per_second_batch{b}"] for b in BATCHES}
    for name in FILES:
        out[f"litert_over_tensorflow_{name}"] = {
            f"batch{b}": sides["litert"][name][f"images_per_second_batch{b}"]
            / sides["tensorflow"][name][f"images_per_second_batch{b}"] for b in BATCHES}
    return out


def main() -> None:
    parser = harness.arguments(__doc__, "tflite_runtimes.json")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--steps", type=int, default=20, help="timed calls at batch 1 (a fifth at batch 100)")
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--ops", action="store_true", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.side:
        return harness.print_result((child_ops if args.ops else child)(args.side, args.directory, args.steps))
    with tempfile.TemporaryDirectory() as workdir:
        print("one-op files: timing ...", flush=True)
        op_files(workdir)
        ops = {side: harness.run_side(__name__, side, [f"--directory={workdir}", f"--steps={args.steps}", "--ops"])
               for side in INTERPRETERS}
        print(json.dumps(ops), flush=True)
    presets = {}
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        with tempfile.TemporaryDirectory() as workdir:
            print(f"{preset}: exporting ...", flush=True)
            directory = export_files(preset, workdir)
            sides = {}
            for side in INTERPRETERS:
                print(f"{preset}: timing in {side} ...", flush=True)
                sides[side] = harness.run_side(__name__, side, [f"--directory={directory}", f"--steps={args.steps}"])
            presets[preset] = {"sides": sides, "ratios": ratios(sides)}
            print(json.dumps(presets[preset]["ratios"]), flush=True)
    harness.write_report(args.output, {"cpu_class": harness.cpu_class(), "ops": {"shapes": OPS, **ops},
                                       "presets": presets}, merge=args.merge)


if __name__ == "__main__":
    main()
