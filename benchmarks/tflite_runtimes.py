"""One TFLite file, two interpreters: LiteRT (``ai-edge-litert``, what sa-conv runs TFLite files
in) against TensorFlow's own bundled ``tf.lite.Interpreter``, on the float32 file, the
full-integer int8 file the export writes (`export.int8.TFLiteFullInteger`) and a dynamic-range
int8 file (int8 weights; activations quantized per call by XNNPACK), each at batch 1 and 100:

    .venv/bin/python -m benchmarks.tflite_runtimes   # benchmarks/results/tflite_runtimes.json

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

PRESETS = ["sa_quadratic", "sa_quadratic_full", "sa_learned", "sa_content_plus_learned_bias", "resnet18"]
FILES = {"float32": "model.tflite", "full_integer": "model_int8.tflite", "dynamic_range": "model_dynamic_range.tflite"}
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
    calibration = np.random.default_rng(1).integers(0, 256, (int8.CALIBRATION_IMAGES, *model.inputs[0].shape[1:]),
                                                    dtype=np.uint8)
    int8.TFLiteFullInteger().quantize(version, calibration)
    converter = tf.lite.TFLiteConverter.from_saved_model(version, signature_keys=["serving_default"])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]  # no representative data: dynamic range
    directory = os.path.dirname(os.path.join(version, int8.TFLiteFullInteger.file))
    with open(os.path.join(directory, FILES["dynamic_range"]), "wb") as f:
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
    args = harness.parse(parser)
    if args.side:
        return harness.print_result(child(args.side, args.directory, args.steps))
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
    harness.write_report(args.output, {"cpu_class": harness.cpu_class(), "presets": presets}, merge=args.merge)


if __name__ == "__main__":
    main()
