"""This tree's speed against an earlier commit's, both in one process, measured in turns.

    .venv/bin/python -m benchmarks.against_commit --commit=77b9071      # benchmarks/results/against_commit.json
    .venv/bin/python -m benchmarks.against_commit --commit=HEAD~3 --presets=sa_quadratic_small --rounds=3 --merge

What a change that should alter nothing (a restructuring) has to show: every figure of
`benchmarks.serving` and of the trainer's step in `benchmarks.throughput` as fast as before. Two
runs of unchanged code in two processes differ here by far more than 5% (other load on the
host, memory placement), so a before/after pair measured process against process cannot show a
5% bound. Here both versions run in the same process, with the same weights, side by side:

* the earlier commit's ``sa_conv``, ``trainers`` and ``export`` are taken with ``git archive``
  into a scratch folder and renamed ``sa_conv_<commit>`` (and so on: every reference to the three
  package names in that copy, registered Keras names included, so that the two versions' classes
  do not collide), then imported next to this tree's;
* for each preset, each version builds the trainer's own step (`trainers.task.Task`: loss, weight
  decay, SGD, XLA decision, no remat, batch 100), its model with the weights of this
  tree's (asserted: the same logits), the live model (``model(x, training=False)``), its frozen
  copy (``freeze_for_inference``) and its exported float32 SavedModel (each version's own
  ``export.export``), reloaded;
* ``--rounds`` rounds: in each, every figure is timed for one version, then at once for the
  other (which goes first alternates by round), as the fastest of ``--steps`` calls (batch 100
  and the train step: of a fifth as many, at least 1), after warm-up calls outside the rounds.

Each figure is reported as images/s of both versions (the fastest over the rounds) and as
``after_over_before``, with the median and range of the per-round ratios, which says how far the
pairing tamed the noise. One child process per preset (``--side=PRESET``): its memory is its own.
Results go to JSON; nothing here is a test.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tarfile
import tempfile

from benchmarks import harness

PAPER = ["sa_quadratic", "sa_quadratic_full", "sa_learned", "sa_content_plus_learned_bias", "sa_sinusoidal", "sa_mlp",
         "resnet18"]
PACKAGES = ("sa_conv", "trainers", "export")
BATCHES = (1, 100)
TRAIN_BATCH = 100


def short(commit: str, repository: str = harness.ROOT) -> str:
    """The abbreviated hash of ``commit`` (any name git knows), for package names."""
    return harness.git("rev-parse", "--short=7", commit, repository=repository).decode().strip()


def renamed(text: str, suffix: str) -> str:
    """``text`` (a module of the copy) with every reference to `PACKAGES` as a name (``sa_conv``,
    ``sa_conv.x``, ``"sa_conv>Layer"``) given ``_suffix``. ``export`` is a common word: only its
    imports are renamed."""
    text = re.sub(r"(?<![\w./-])(sa_conv|trainers)(?![\w-])", rf"\1_{suffix}", text)
    return re.sub(r"^(\s*(?:from|import)\s+)export(?=[.\s])", rf"\1export_{suffix}", text, flags=re.MULTILINE)


def materialize(commit: str, directory: str, repository: str = harness.ROOT) -> str:
    """Writes `PACKAGES` as they were at ``commit`` into ``directory``, renamed (`renamed`); returns
    the suffix (`short`). Importable with ``directory`` on ``sys.path``."""
    suffix = short(commit, repository)
    archive = harness.git("archive", "--format=tar", suffix, *PACKAGES, repository=repository)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            package, _, rest = member.name.partition("/")
            target = os.path.join(directory, f"{package}_{suffix}", rest)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            data = tar.extractfile(member).read()
            if member.name.endswith(".py"):
                data = renamed(data.decode(), suffix).encode()
            with open(target, "wb") as f:
                f.write(data)
    return suffix


class Version:
    """One version's packages (``sa_conv``, ``trainers``, ``export``, imported under their names
    in this process, ``suffix`` "" for this tree's) and what it builds for a preset."""

    def __init__(self, suffix: str = ""):
        import importlib

        name = (lambda package: f"{package}_{suffix}") if suffix else (lambda package: package)
        self.suffix = suffix
        self.sa_conv = importlib.import_module(name("sa_conv"))
        self.config = importlib.import_module(name("trainers") + ".config")
        self.task = importlib.import_module(name("trainers") + ".task")
        self.distribute = importlib.import_module(name("trainers") + ".distribute")
        self.export = importlib.import_module(name("export") + ".export")

    def build(self, preset: str, workdir: str, weights=None, precision: str = "float32"):
        """The trainer's step, the live and frozen model and the reloaded SavedModel of ``preset``
        (under a mixed ``precision``, the step and the live model only: the others serve float32),
        as ``{figure: (images per call, callable)}``, and the model's weights."""
        import numpy as np
        import tensorflow as tf

        config = self.config.make_config(overrides=dict(
            model=preset, dataset="synthetic", global_batch_size=TRAIN_BATCH, eval_batch_size=TRAIN_BATCH,
            validation_size=TRAIN_BATCH, epochs=1, strategy="one_device", remat="none", mixed_precision=precision,
            model_dir=tempfile.mkdtemp(prefix="model_", dir=workdir)))
        # Both trees on the default strategy (this process's one device), as the new tree's Task
        # steps run in the benchmarks.
        task = (self.task.Task(config, strategy=tf.distribute.get_strategy(), log=lambda s: None)
                if hasattr(self.task.Task, "train_function") else self.task.Task(config, log=lambda s: None))
        if not self.suffix:  # process-wide, the first call decides: this tree's setting for the model
            from trainers import process

            process.keep_freed_memory(task.keeps_freed_memory())
        model = task.build_model()
        if weights is not None:
            model.set_weights(weights)
        optimizer = task.build_optimizer(model, task.build_schedule(task.total_steps()))
        if hasattr(task, "train_function"):  # a tree from before the Trainer owned the strategy
            train_function = task.train_function(model, optimizer)
        else:
            train_function = self.distribute.local_train_steps(task, model, optimizer)
        iterator = iter(task.train_dataset(0))
        one = tf.constant(1)
        live = tf.function(lambda images: tf.nn.softmax(model(images, training=False)), jit_compile=task.use_xla())
        shape, rng = tuple(model.inputs[0].shape[1:]), np.random.default_rng(0)
        inputs = {batch: tf.constant(rng.integers(0, 256, (batch,) + shape).astype(np.uint8)) for batch in BATCHES}
        probe = tf.constant(rng.integers(0, 256, (4,) + shape).astype(np.uint8))
        figures = {"train_step": (TRAIN_BATCH, lambda: train_function(iterator, one).numpy()),
                   **{f"in_process_live/batch{batch}": (batch, lambda x=x: live(x).numpy())
                      for batch, x in inputs.items()}}
        if precision != "float32":
            return figures, model.get_weights(), live(probe).numpy()
        frozen_model = self.sa_conv.freeze_for_inference(model)
        frozen = tf.function(lambda images: tf.nn.softmax(frozen_model(images, training=False)))
        path = os.path.join(tempfile.mkdtemp(prefix="keras_", dir=workdir), "model.keras")
        model.save(path)
        version = self.export.export(model_path=path, export_dir=os.path.join(workdir, f"export{self.suffix}"),
                                     log=lambda s: None)
        served = tf.saved_model.load(version).signatures["serving_default"]
        for batch, x in inputs.items():
            figures[f"in_process/batch{batch}"] = (batch, lambda x=x: frozen(x).numpy())
            figures[f"saved_model/batch{batch}"] = (batch, lambda x=x: served(images=x)["probabilities"].numpy())
        return figures, model.get_weights(), live(probe).numpy()


def summary(images: int, before: list[float], after: list[float]) -> dict:
    """One figure from its per-round seconds of both versions."""
    ratios = sorted(b / a for b, a in zip(before, after))
    return {"images_per_call": images,
            "before_images_per_second": images / min(before), "after_images_per_second": images / min(after),
            "after_over_before": min(before) / min(after),
            "round_ratios_median": ratios[len(ratios) // 2], "round_ratios_range": [ratios[0], ratios[-1]],
            "rounds": len(ratios)}


def measure_preset(args) -> dict:
    """One preset in this process: both versions, ``args.rounds`` rounds of every figure."""
    import numpy as np

    from trainers import process

    sys.path.insert(0, args.copy)  # the earlier commit's renamed packages (`materialize`)
    versions = {"before": Version(args.suffix), "after": Version()}
    with tempfile.TemporaryDirectory() as workdir:
        after, weights, after_probs = versions["after"].build(args.side, workdir, precision=args.mixed_precision)
        before, _, before_probs = versions["before"].build(args.side, workdir, weights, args.mixed_precision)
        difference = float(np.max(np.abs(before_probs - after_probs)))
        # Under a mixed precision the two trees may round differently (a change of what is computed in
        # bfloat16): the same model is then the same probabilities within a few roundings of 2^-8.
        if difference > (1e-5 if args.mixed_precision == "float32" else 2 ** -6):
            raise AssertionError(f"the two versions of {args.side} disagree by {difference}: not the same model")
        for figures in (before, after):  # tracing and allocation, outside the rounds
            for _, fn in figures.values():
                fn()
        seconds = {side: {figure: [] for figure in before} for side in versions}
        built = {"before": before, "after": after}
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for figure, (images, _) in before.items():
                calls = args.steps if images == 1 else max(1, args.steps // 5)
                if figure == "train_step":
                    calls = 1
                for side in order:
                    seconds[side][figure].append(harness.timings(built[side][figure][1], calls, warm_up=False)[0])
            print(f"round {round_ + 1}/{args.rounds}", flush=True)
        return {"preset": args.side, "precision": args.mixed_precision, "max_probability_difference": difference,
                "keep_freed_memory": process.describe().get("keep_freed_memory"),
                "figures": {figure: summary(images, seconds["before"][figure], seconds["after"][figure])
                            for figure, (images, _) in before.items()}}


def merge_mismatch(path: str, before: str, after: str, cpu: str, precision: str = "float32") -> str | None:
    """What of the report at ``path`` differs from a run of ``before`` -> ``after`` on CPU class ``cpu`` in
    ``precision`` (its figures would be filed under the report's); None if nothing, or no report."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        written = json.load(f)
    theirs = (written.get("before"), written.get("after"), harness.cpu_class(written["machine"]["cpu"]),
              written.get("process", {}).get("precision", "float32"))
    if theirs == (before, after, cpu, precision):
        return None
    return (f"{path} holds {theirs[0]} -> {theirs[1]} on {theirs[2]} in {theirs[3]}, this run {before} -> {after} on "
            f"{cpu} in {precision}")


def main():
    parser = harness.arguments(__doc__, "against_commit.json")
    parser.add_argument("--commit", required=True, help="the earlier commit (any name git knows)")
    parser.add_argument("--presets", default=",".join(PAPER))
    parser.add_argument("--rounds", type=int, default=5, help="turns of both versions per figure")
    parser.add_argument("--steps", type=int, default=10, help="timed calls per turn at batch 1 (batch 100: a "
                        "fifth; the train step: 1)")
    parser.add_argument("--mixed_precision", default="float32", choices=("float32", "mixed_bfloat16"),
                        help="both versions' policy (mixed: the train step and the live model only)")
    parser.add_argument("--copy", help=argparse.SUPPRESS)
    parser.add_argument("--suffix", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.side:
        return harness.print_result(measure_preset(args))
    mismatch = merge_mismatch(args.output, short(args.commit), short("HEAD"), harness.cpu_class(),
                              args.mixed_precision) if args.merge else None
    if mismatch:
        parser.error(f"--merge: {mismatch}; a report holds one change on one CPU class: give --output another file.")
    from trainers import process

    report = {"what": f"speed of this tree against commit {args.commit}, both in one process, in turns "
                      "(benchmarks/against_commit.py)", "process": process.describe(args.mixed_precision),
              "after": short("HEAD"), "presets": {}}
    with tempfile.TemporaryDirectory() as copy:
        suffix = materialize(args.commit, copy)
        report["before"] = suffix
        for preset in [p for p in args.presets.split(",") if p]:
            result = harness.run_side(__name__, preset, ["--commit", args.commit, "--copy", copy, "--suffix", suffix,
                                                         "--rounds", args.rounds, "--steps", args.steps,
                                                         "--mixed_precision", args.mixed_precision])
            report["presets"][preset] = result
            print(preset, json.dumps({f: round(v["after_over_before"], 3) for f, v in result["figures"].items()}),
                  flush=True)
            harness.write_report(args.output, report, merge=args.merge)
    return report


if __name__ == "__main__":
    main()
