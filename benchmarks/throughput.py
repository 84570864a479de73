"""Training and inference throughput of the presets, as ratios to this machine's limits.

    .venv/bin/python -m benchmarks.throughput            # benchmarks/results/throughput.json
    .venv/bin/python -m benchmarks.throughput --cases=sa_quadratic_small,fast_vs_dense_16 --train_steps=3

Every case runs in its own process (so peak resident memory is its own) and reports: training
images/s (forward + backward + SGD update, batch 100 unless stated, the fastest of
``--train_steps`` steps, XLA as the trainer's default under ``--remat=none`` or as the case says), inference images/s at
batch 1 and 100, peak RSS, parameters, analytic FLOPs per image (`benchmarks.flops`: a
multiply-add is 2 FLOPs, attention aggregation included, training = 3 x forward), with the trainer's default allocator setting (`--keep_freed_memory`), achieved
GFLOP/s and its fraction of the fp32 matmul GFLOP/s measured in the same run. Ratios: the exact
separable path against the dense path at 16x16 and 32x32 grids, Keras's MultiHeadAttention in
the same architecture, XLA against the default graph step, and the exported SavedModel against
the in-process Keras model.
With ``--profile_steps=N``, each case also profiles N training steps (``tf.profiler``) into its
``op_breakdown``: the step's op time by op type and by what the op does (`OP_CATEGORIES`):

    .venv/bin/python -m benchmarks.throughput --cases=bfloat16 --profile_steps=5 \
        --output=benchmarks/results/throughput_bfloat16.json

Results go to a JSON file; nothing here is a test.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time

from benchmarks import harness

PAPER = ["sa_quadratic", "sa_quadratic_full", "sa_learned", "sa_content_plus_learned_bias", "sa_sinusoidal", "sa_mlp",
         "sa_gated", "resnet18"]
SMALL = ["sa_quadratic_small", "sa_quadratic_full_small", "sa_learned_small", "sa_content_plus_learned_bias_small",
         "sa_sinusoidal_small", "sa_mlp_small", "sa_gated_small"]
NO_ATTENTION_DROPOUT = {"attention_dropout": 0.0}
GRID_32 = {**NO_ATTENTION_DROPOUT, "pooling_width": 1, "max_grid_size": 32}
DENSE = {"fast_position_attention": False}
# name -> (preset, model overrides, batch, XLA); XLA None: the trainer's default for the model (remat as the case says,
# else none).
CASES = {name: (name, {}, 100, None) for name in PAPER + SMALL}
CASES.update({
    # The paper's model without attention dropout: the separable path also runs in training.
    "sa_quadratic_noattndrop_fast": ("sa_quadratic", NO_ATTENTION_DROPOUT, 100, False),
    "sa_quadratic_noattndrop_dense": ("sa_quadratic", {**NO_ATTENTION_DROPOUT, **DENSE}, 100, False),
    # 32x32 grid, no pooling (N = 1024): the N^2 term dominates. Small batch: slow on 2 cores.
    "sa_quadratic_32x32_fast": ("sa_quadratic", GRID_32, 8, False),
    "sa_quadratic_32x32_dense": ("sa_quadratic", {**GRID_32, **DENSE}, 8, False),
    "keras_mha_paper": ("keras_mha", {}, 100, False),
    # The paper's content preset as the trainer runs it at batch 100, its blocks rematerialized (--remat=auto).
    "sa_content_plus_learned_bias_remat": ("sa_content_plus_learned_bias", {"remat": "blocks"}, 100, False),
})
# The same steps compiled with XLA (--jit_compile): "<case>_xla".
XLA_TWINS = ["sa_quadratic", "resnet18", "sa_quadratic_small", "sa_quadratic_noattndrop_fast",
             "sa_quadratic_noattndrop_dense", "sa_quadratic_32x32_fast", "sa_quadratic_32x32_dense",
             "sa_content_plus_learned_bias_small", "sa_gated_small"]
CASES.update({f"{name}_xla": (*CASES[name][:3], True) for name in [*XLA_TWINS, "sa_content_plus_learned_bias_remat"]})
# The same steps under --mixed_precision=mixed_bfloat16 (trainer settings ride in the overrides):
# "<case>_bfloat16"; profile the no-XLA cases (the defaults): an XLA cluster hides its op types.
SMALL_BF16_TWINS = ["sa_quadratic_small", "sa_gated_small", "sa_gated_small_xla", "sa_content_plus_learned_bias_small",
                    "sa_content_plus_learned_bias_small_xla", "resnet18"]
PAPER_BF16_TWINS = ["sa_content_plus_learned_bias_remat", "sa_content_plus_learned_bias_remat_xla"]
BF16_TWINS = SMALL_BF16_TWINS + PAPER_BF16_TWINS
TRAINER_FIELDS = ("mixed_precision", "remat")
CASES.update({f"{name}_bfloat16": (CASES[name][0], {**CASES[name][1], "mixed_precision": "mixed_bfloat16"},
                                   *CASES[name][2:]) for name in BF16_TWINS})
GROUPS = {
    "paper": PAPER,
    "small": SMALL,
    "fast_vs_dense_16": ["sa_quadratic_noattndrop_fast", "sa_quadratic_noattndrop_dense"],
    "fast_vs_dense_32": ["sa_quadratic_32x32_fast", "sa_quadratic_32x32_dense"],
    "baseline": ["keras_mha_paper", "sa_quadratic"],
    "xla": [f"{name}_xla" for name in XLA_TWINS],
    "gated": ["sa_content_plus_learned_bias_small", "sa_gated_small", "sa_quadratic_small",
              "sa_content_plus_learned_bias_small_xla", "sa_gated_small_xla"],
    # The small presets' steps in both precisions (with --profile_steps: where each step's time goes).
    "bfloat16": [name for twin in SMALL_BF16_TWINS for name in (twin, f"{twin}_bfloat16")],
    # XLA for the paper's content preset (rematerialized, as trained): both precisions.
    "xla_paper_content": [name for twin in PAPER_BF16_TWINS for name in (twin, f"{twin}_bfloat16")],
}
# (label, numerator case, denominator case): ratios of training images/s in the same run.
RATIOS = [
    ("fast_over_dense_train_16x16", "sa_quadratic_noattndrop_fast", "sa_quadratic_noattndrop_dense"),
    ("fast_over_dense_train_32x32", "sa_quadratic_32x32_fast", "sa_quadratic_32x32_dense"),
    ("fast_over_dense_train_16x16_both_xla", "sa_quadratic_noattndrop_fast_xla", "sa_quadratic_noattndrop_dense_xla"),
    ("fast_over_dense_train_32x32_both_xla", "sa_quadratic_32x32_fast_xla", "sa_quadratic_32x32_dense_xla"),
    ("sa_quadratic_over_keras_mha_train", "sa_quadratic", "keras_mha_paper"),
    ("sa_quadratic_xla_over_default_train", "sa_quadratic_xla", "sa_quadratic"),
    ("resnet18_xla_over_default_train", "resnet18_xla", "resnet18"),
    ("sa_quadratic_small_xla_over_default_train", "sa_quadratic_small_xla", "sa_quadratic_small"),
    ("sa_gated_small_over_content_train", "sa_gated_small", "sa_content_plus_learned_bias_small"),
    *((f"{name}{p}_xla_over_no_xla_train", f"{name}_xla{p}", f"{name}{p}") for p in ("", "_bfloat16")
      for name in ("sa_gated_small", "sa_content_plus_learned_bias_small", "sa_content_plus_learned_bias_remat")),
    *((f"{name}_bfloat16_over_float32_train", f"{name}_bfloat16", name) for name in BF16_TWINS),
]
# Op types of TensorFlow's profiler by what they do (first match by substring; the rest: "elementwise").
OP_CATEGORIES = {
    "matmul": ("MatMul", "Einsum", "Conv2D", "Conv3D"),
    "random": ("Random",),
    "layout": ("Transpose", "Tile", "BroadcastTo", "Reshape", "Pad", "Slice", "Concat", "Gather", "Pack", "Unpack",
               "Split", "Identity", "Squeeze", "ExpandDims", "Reverse"),
    "reduction": ("Sum", "Mean", "Max", "Min", "Prod", "BiasAddGrad", "ArgMax"),
    "softmax_and_norm": ("Softmax", "BatchNorm", "LayerNorm"),
    "cast": ("Cast",),
    "variables_and_optimizer": ("Variable", "ApplyGradient", "ResourceApply", "AssignAdd", "AssignSub"),
    "input_pipeline": ("Dataset", "Iterator"),
}


def build_keras_mha_classifier(config):
    """The paper's classifier with keras.layers.MultiHeadAttention (content only, key_dim =
    hidden / heads) in place of the 2-D attention: Keras's own layer as a baseline."""
    import keras

    from sa_conv import InvertiblePooling, PixelNormalization

    g, d = config.grid_size, config.hidden_size
    inputs = keras.Input((32, 32, 3), name="image")
    x = InvertiblePooling(config.pooling_width)(PixelNormalization()(inputs))
    x = keras.layers.Reshape((g * g, -1))(keras.layers.Dense(d)(x))
    for _ in range(config.num_layers):
        a = keras.layers.MultiHeadAttention(config.num_heads, key_dim=d // config.num_heads,
                                            dropout=config.attention_dropout)(x, x)
        x = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon)(x + keras.layers.Dropout(config.dropout)(a))
        y = keras.layers.Dense(d)(keras.layers.Dense(config.mlp_size, activation="gelu")(x))
        x = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon)(x + keras.layers.Dropout(config.dropout)(y))
    logits = keras.layers.Dense(config.num_classes)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, logits, name="keras_mha")


def keras_mha_flops(config):
    g = config.grid_size
    n, h, d, m = g * g, config.num_heads, config.hidden_size, config.mlp_size
    kd = d // h
    per_layer = 2 * n * d * (3 * h * kd) + 2 * 2 * h * n * n * kd + 2 * n * h * kd * d + 2 * 2 * n * d * m
    return 2 * n * 12 * d + config.num_layers * per_layer + 2 * d * config.num_classes


def _time(fn, steps):
    """Seconds per call: the fastest of ``steps`` calls (`harness.timings`) and the median."""
    times = harness.timings(fn, steps)
    return times[0], times[len(times) // 2]


def op_category(op_type: str) -> str:
    """The `OP_CATEGORIES` name of a profiler op type (``_MklBatchMatMulV2`` -> ``matmul``)."""
    return next((name for name, parts in OP_CATEGORIES.items() if any(part in op_type for part in parts)),
                "elementwise")


def op_breakdown(fn, steps: int) -> dict:
    """Where ``steps`` calls of ``fn`` spend their time, by TensorFlow's profiler (``tf.profiler``,
    its framework op statistics): ``{"types": {op type: fraction}, "categories": {`OP_CATEGORIES`
    name: fraction}, "op_seconds_per_step": ...}``, fractions of the ops' total self time summed
    over threads (idle time left out), the 15 largest types kept and the rest as ``"other"``."""
    import glob

    import tensorflow as tf
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as profiler_plugin

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                fn()
        finally:
            tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        table = json.loads(profiler_plugin.xspace_to_tools_data(paths, "framework_op_stats", {})[0])[0]
    columns = [column["id"] for column in table["cols"]]
    seconds = {}
    for row in table["rows"]:
        op = dict(zip(columns, (cell.get("v") if cell else None for cell in row["c"])))
        if op["type"] != "IDLE":
            seconds[op["type"]] = seconds.get(op["type"], 0.0) + op["total_self_time"] / 1e6
    total = sum(seconds.values())
    ranked = sorted(seconds.items(), key=lambda item: -item[1])
    types = {name: value / total for name, value in ranked[:15]}
    types["other"] = sum(value for _, value in ranked[15:]) / total
    categories = {}
    for name, value in ranked:
        categories[op_category(name)] = categories.get(op_category(name), 0.0) + value / total
    return {"op_seconds_per_step": total / steps, "types": types,
            "categories": dict(sorted(categories.items(), key=lambda item: -item[1]))}


def measure(case: str, train_steps: int, infer_steps: int, profile_steps: int = 0) -> dict:
    """Runs one case in this process: the trainer's own step (`trainers.task.Task`: its loss,
    weight decay, SGD, XLA decision, precision and allocator setting), without remat unless the
    case says; with ``profile_steps``, also the training step's `op_breakdown`."""
    import numpy as np
    import tensorflow as tf

    from benchmarks import flops
    from trainers import distribute, process
    from trainers.config import make_config
    from trainers.task import Task

    preset, overrides, batch, jit = CASES[case]
    trainer = {k: v for k, v in overrides.items() if k in TRAINER_FIELDS}
    overrides = {k: v for k, v in overrides.items() if k not in TRAINER_FIELDS}
    config = make_config(overrides=dict(
        model="sa_quadratic" if preset == "keras_mha" else preset, dataset="synthetic", global_batch_size=batch,
        eval_batch_size=batch, validation_size=100, epochs=1, strategy="one_device", jit_compile=jit,
        model_dir=tempfile.mkdtemp(prefix="throughput_"), **{"remat": "none", "mixed_precision": "float32", **trainer}))
    task = Task(config, log=lambda s: None, model_fields=None if preset == "keras_mha" else overrides)
    process.keep_freed_memory(task.keeps_freed_memory())  # the trainer's setting for the model
    model_config = task.model_config
    if preset == "keras_mha":
        model = build_keras_mha_classifier(model_config)
        fwd = train_fwd = keras_mha_flops(model_config)
    else:
        model = task.build_model()
        fwd = flops.forward_flops(model_config, fast=True)
        train_fwd = flops.training_flops(model_config) // 3
    jit = task.use_xla()
    train_function = distribute.local_train_steps(task, model, task.build_optimizer(model, task.build_schedule(
        task.total_steps())))
    iterator = iter(task.train_dataset(0).repeat())  # --train_steps may outlast one epoch of the synthetic data
    one = tf.constant(1)
    train_seconds, train_median = _time(lambda: train_function(iterator, one).numpy(), train_steps)
    rng = np.random.default_rng(0)
    infer = tf.function(lambda x: model(x, training=False), jit_compile=jit)
    infer_results = {}
    for b in (1, 100):
        x = tf.constant(rng.integers(0, 256, size=(b, 32, 32, 3), dtype=np.uint8))
        seconds, _ = _time(lambda: infer(x).numpy(), infer_steps)
        infer_results[f"inference_images_per_second_batch{b}"] = b / seconds
    train_ips = batch / train_seconds
    breakdown = {}
    if profile_steps and jit:  # the compiled cluster is not a framework op: the statistics would miss the step
        breakdown["op_breakdown"] = "none: an XLA step (profile its no-XLA twin)"
    elif profile_steps:
        breakdown["op_breakdown"] = op_breakdown(lambda: train_function(iterator, one).numpy(), profile_steps)
    return {
        "case": case, "preset": preset, "overrides": {**overrides, **trainer}, "train_batch": batch, "xla": jit,
        "precision": task.precision,
        "keep_freed_memory": task.keeps_freed_memory(),
        "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        "train_images_per_second": train_ips,
        "train_images_per_second_median": batch / train_median,
        **infer_results,
        "forward_gflops_per_image": fwd / 1e9,
        "train_gflops_per_image": 3 * train_fwd / 1e9,
        "train_achieved_gflops_per_second": 3 * train_fwd * train_ips / 1e9,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "process": process.describe(),  # the measuring process's own configuration
        **breakdown,
    }


def measure_export(steps: int) -> dict:
    """Inference of the exported SavedModel vs the in-process Keras model (same graph, no XLA)."""
    import numpy as np
    import tensorflow as tf

    import sa_conv
    from export.export import export

    model = sa_conv.build_model("sa_quadratic_small")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        version = export(model_path=path, export_dir=tmp, log=lambda s: None)
        served = tf.saved_model.load(version).signatures["serving_default"]
        x = tf.constant(np.random.default_rng(0).integers(0, 256, size=(100, 32, 32, 3), dtype=np.uint8))
        keras_fn = tf.function(lambda images: tf.nn.softmax(model(images, training=False)))
        keras_seconds, _ = _time(lambda: keras_fn(x).numpy(), steps)
        served_seconds, _ = _time(lambda: served(images=x)["probabilities"].numpy(), steps)
    return {"case": "export_vs_keras", "batch": 100, "keras_images_per_second": 100 / keras_seconds,
            "saved_model_images_per_second": 100 / served_seconds,
            "saved_model_over_keras": keras_seconds / served_seconds}


def main():
    parser = harness.arguments(__doc__, "throughput.json", merge=False)
    parser.add_argument("--cases", default="small,paper,fast_vs_dense_16,fast_vs_dense_32,baseline,xla,export",
                        help=f"Comma-separated cases or groups: {', '.join(list(GROUPS) + ['export'] + list(CASES))}.")
    parser.add_argument("--train_steps", type=int, default=3)
    parser.add_argument("--infer_steps", type=int, default=5)
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="profile this many training steps of each case after timing (0: none): op_breakdown")
    args = harness.parse(parser)
    from trainers import process

    if args.side:  # one case
        return harness.print_result(measure_export(args.infer_steps) if args.side == "export" else measure(
            args.side, args.train_steps, args.infer_steps, args.profile_steps))
    names = []
    for item in args.cases.split(","):
        for name in GROUPS.get(item, [item]):
            if name not in CASES and name != "export":
                parser.error(f"unknown case {name!r}")
            if name not in names:
                names.append(name)
    peaks = harness.matmul_peaks()
    peak = peaks["float32"]
    print(f"fp32 matmul: {peak:.1f} GFLOP/s", flush=True)
    results = []
    for name in names:
        start = time.perf_counter()
        try:
            result = harness.run_side(__name__, name, [f"--train_steps={args.train_steps}",
                                                       f"--infer_steps={args.infer_steps}",
                                                       f"--profile_steps={args.profile_steps}"],
                                      env={**process.child_environment(), "TF_CPP_MIN_LOG_LEVEL": "2"})
        except harness.SideError as failure:
            print(f"{name}: failed\n{failure.stderr[-2000:]}", flush=True)
            results.append({"case": name, "error": failure.stderr[-2000:]})
            continue
        if "train_achieved_gflops_per_second" in result:
            result["train_fraction_of_matmul_peak"] = result["train_achieved_gflops_per_second"] / peak
        result["wall_seconds"] = time.perf_counter() - start
        results.append(result)
        print(json.dumps(result), flush=True)
    by_case = {r["case"]: r for r in results if "error" not in r}
    ratios = {}
    for label, numerator, denominator in RATIOS:
        if numerator in by_case and denominator in by_case:
            ratios[label] = (by_case[numerator]["train_images_per_second"]
                             / by_case[denominator]["train_images_per_second"])
    if "export_vs_keras" in by_case:
        ratios["saved_model_over_keras_inference"] = by_case["export_vs_keras"]["saved_model_over_keras"]
    report = {
        "machine": harness.machine(peaks),
        "flops_convention": "multiply-add = 2 FLOPs; attention logits and aggregation included; training = 3 x forward",
        "process": process.describe(),
        "results": results,
        "ratios": ratios,
    }
    harness.write_report(args.output, report)
    print(json.dumps(ratios, indent=2))
    print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
