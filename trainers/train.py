"""Distributed CIFAR-10 training of any sa_conv preset (``python -m trainers.train``,
``sa-conv-train``).

One training path for every strategy: a custom loop with ``strategy.run`` (Keras 3.15's
``model.fit`` fails under MultiWorkerMirroredStrategy, keras-team/keras#20585). The loop:

* splits each global batch across replicas and averages the loss over the global batch
  (``tf.nn.compute_average_loss``); metrics are summed across replicas;
* steps the learning rate per optimizer step (`trainers.schedule`);
* validates on the held-out split after every epoch (never on the test split);
* writes TensorBoard scalars (loss, accuracy, learning rate) to ``model_dir/logs``;
* checkpoints model, optimizer and progress after every epoch: the same command, rerun after a
  kill at any moment, resumes from the last finished epoch;
* keeps the best model by validation accuracy (``best_model.keras``);
* stops with a clear error when the loss becomes NaN or infinite;
* evaluates the test split once at the end, writes ``results.json`` and ``model.keras``.

Model directory layout: ``config.json``, ``history.json`` (one record per epoch),
``checkpoints/``, ``logs/{train,validation}``, ``best_model.keras``, ``model.keras``,
``results.json``. Workers other than the chief write to ``workers/worker_<id>/``.
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import hashlib
import json
import math
import os
import sys
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf
from keras import ops

import sa_conv
from sa_conv import cli, files
from sa_conv import data as data_lib
from sa_conv import footprint
from sa_conv import heads as heads_lib
from sa_conv.errors import ConfigError, SaConvError
from sa_conv.reference import REFERENCE_MEAN, REFERENCE_STD
from trainers import distribute
from trainers.config import TrainConfig, default_jit_compile, default_keep_freed_memory, make_config
from trainers.optimizers import PyTorchSGD
from trainers.schedule import make_schedule

# Variables (by their short name) that get no weight decay by default: the attention centers and
# spreads, as in the reference implementation (which decays everything else, biases and
# LayerNorm included; --no_weight_decay).
NO_WEIGHT_DECAY = ("centers", "spreads")


def data_model_fields(config: TrainConfig, dataset: data_lib.ImageData) -> dict:
    """The `sa_conv.ModelConfig` fields that ``dataset`` decides (image size, channels, classes,
    normalization), with ``config.pixel_statistics`` applied."""
    try:
        fields = dataset.model_fields()
    except ValueError as exc:
        raise ConfigError(f"--dataset={config.dataset}: {exc}") from None
    if config.pixel_statistics == "reference":
        if fields["image_channels"] != len(REFERENCE_MEAN):
            raise ConfigError(
                f"--pixel_statistics=reference has statistics for {len(REFERENCE_MEAN)} channels; "
                f"--dataset={config.dataset} has {fields['image_channels']}. Use --pixel_statistics=data.")
        fields.update(pixel_mean=REFERENCE_MEAN, pixel_std=REFERENCE_STD)
    return fields


def remat_blocks(config: TrainConfig, model_config, replica_batch: int, log=print) -> bool:
    """Whether the transformer blocks rematerialize (``--remat``; for ``auto``, whether the
    estimated activations of a ``replica_batch`` step exceed ``--memory_budget_gb``, which
    ``log``, unless None, reports)."""
    attention = model_config.architecture == "attention"
    if config.remat == "blocks" and not attention:
        raise ConfigError(f"--remat=blocks: {config.model} has no transformer blocks; use --remat=none or auto.")
    if config.remat != "auto":
        return config.remat == "blocks"
    estimate = footprint.training_activation_bytes(model_config, replica_batch, remat=False)
    remat = estimate > config.memory_budget_gb * 2**30
    if remat and log:
        log(f"Rematerializing the transformer blocks (--remat=auto): a step's activations are estimated at "
            f"{estimate / 2**30:.1f} GB per replica, above --memory_budget_gb={config.memory_budget_gb:g}.")
    return remat


class TrainingError(SaConvError):
    """Training cannot go on (e.g. the loss diverged); the message says what to change."""


def decays(variable, excluded=NO_WEIGHT_DECAY) -> bool:
    """Whether weight decay applies to ``variable``: its short name is not in ``excluded``."""
    return variable.name.split("/")[-1].split(":")[0] not in excluded


def weights_checksum(model: keras.Model) -> str:
    """SHA-256 of all weights' bytes: equal on two workers iff their weights are identical."""
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()


def _count_parameters(model: keras.Model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def _write_json(path: str, value) -> None:
    files.write_json(path, value, sort_keys=True)


def _save_keras_atomically(model: keras.Model, path: str) -> None:
    tmp = f"{path}.tmp.keras"
    model.save(tmp)
    os.replace(tmp, path)


class Trainer:
    """Trains ``config`` under ``strategy`` (created once by the caller, or here).

    It changes no process-wide state: its models carry their dtype policy, and the process
    settings of a run (seed, allocator) are its entry point's (`train`, `trainers.process`)."""

    def __init__(
        self,
        config: TrainConfig,
        strategy: tf.distribute.Strategy | None = None,
        log: Callable[[str], None] = print,
        interactive: bool | None = None,
        dataset: data_lib.ImageData | None = None,
    ):
        config.validate()
        self.dataset = dataset
        self.config = config
        self.log = log
        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        try:
            self.model_config = sa_conv.get_config(config.model, **config.model_overrides())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        # The strategy next: MultiWorkerMirroredStrategy must configure collective ops before
        # anything else initializes TensorFlow's context.
        self.strategy = strategy or distribute.create_strategy(config.strategy)
        self.replicas = self.strategy.num_replicas_in_sync
        if config.global_batch_size % self.replicas:
            raise ConfigError(
                f"--global_batch_size={config.global_batch_size} is not divisible by the "
                f"{self.replicas} replicas; use a multiple of {self.replicas}."
            )
        if config.eval_batch_size % self.replicas:
            raise ConfigError(
                f"--eval_batch_size={config.eval_batch_size} is not divisible by the "
                f"{self.replicas} replicas; use a multiple of {self.replicas}."
            )
        self.prepared = False
        self.chief = distribute.is_chief(self.strategy)
        self.output_dir = (
            config.model_dir if self.chief
            else os.path.join(config.model_dir, "workers", f"worker_{distribute.worker_id(self.strategy)}")
        )
        os.makedirs(self.output_dir, exist_ok=True)

    # ----------------------------------------------------------------------------- set-up

    def _load_data(self):
        c = self.config
        dataset = self.dataset or data_lib.load_dataset(c.dataset, c.data_dir, seed=c.seed)
        self.label_names = dataset.label_names
        self.train_split, self.val_split = data_lib.split_train_validation(
            dataset.train, c.validation_size, seed=c.seed
        )
        self.test_split = dataset.test
        # Image size, classes and normalization statistics (of the official training split) come
        # from the data, so the model and its exports take this dataset's raw pixels.
        self.model_config = self.model_config.replace(**data_model_fields(c, dataset))
        self.steps_per_epoch = len(self.train_split) // c.global_batch_size
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"{len(self.train_split)} training images make no full batch of "
                f"--global_batch_size={c.global_batch_size}; lower the batch size."
            )
        self.model_config = self.model_config.replace(
            remat=remat_blocks(c, self.model_config, c.global_batch_size // self.replicas, self.log))
        total = c.epochs * self.steps_per_epoch
        self.total_steps = min(total, c.max_steps) if c.max_steps else total
        self.total_epochs = math.ceil(self.total_steps / self.steps_per_epoch)

    def _build(self, model: keras.Model | None = None):
        c = self.config
        with self.strategy.scope():
            self.model = model or self.build_model()
            self.schedule = make_schedule(
                c.lr_schedule,
                c.learning_rate,
                self.total_steps,
                c.warmup_ratio,
                [e * self.steps_per_epoch for e in c.milestone_epochs()],
                c.lr_decay_factor,
                steps_per_update=self.steps_per_epoch if c.lr_update == "epoch" else 1,
            )
            sgd = PyTorchSGD if c.momentum_form == "pytorch" else keras.optimizers.SGD
            optimizer = sgd(self.schedule, momentum=c.momentum)
            if c.mixed_precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            self.optimizer.build(self.model.trainable_variables)
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, epoch=self.epoch)
        excluded = self.config.weight_decay_exclusions()
        self.decayed = [v for v in self.model.trainable_variables if decays(v, excluded)]
        self.loss_fn = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=c.label_smoothing, reduction=None
        )
        ckpt_dir = os.path.join(self.output_dir, "checkpoints")
        self.manager = tf.train.CheckpointManager(self.checkpoint, ckpt_dir, max_to_keep=c.keep_checkpoints)

    def build_model(self) -> keras.Model:
        """A new model of this run's configuration and precision (``--mixed_precision``, as its
        layers' dtype policy: the global policy is left alone)."""
        return sa_conv.build_model(self.model_config, name=self.config.model, dtype=self.config.mixed_precision)

    def _per_example_loss(self, labels, logits):
        one_hot = tf.one_hot(labels, self.model_config.num_classes)
        return self.loss_fn(one_hot, tf.cast(logits, tf.float32))

    def _replica_gradients(self, images, labels):
        c = self.config
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_example = self._per_example_loss(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=c.global_batch_size)
            if c.weight_decay and self.decayed:
                # Coupled L2, as PyTorch's SGD(weight_decay=): adds weight_decay * w to the gradient.
                l2 = tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in self.decayed])
                loss += tf.nn.scale_regularization_loss(0.5 * c.weight_decay * l2)
            scaled = self.optimizer.scale_loss(loss) if hasattr(self.optimizer, "scale_loss") else loss
        grads = tape.gradient(scaled, self.model.trainable_variables)
        return grads, self._sums(per_example, labels, logits)

    def _replica_eval_step(self, images, labels):
        logits = self.model(images, training=False)
        return self._sums(self._per_example_loss(labels, logits), labels, logits)

    @staticmethod
    def _sums(per_example, labels, logits):
        correct = tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(labels, tf.int64)), tf.float32)
        count = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(correct), count])

    def keeps_freed_memory(self, remat: bool | None = None) -> bool:
        """``--keep_freed_memory``, or its default for this model (`default_keep_freed_memory`), or
        for it with ``remat`` if given."""
        c = self.config
        if c.keep_freed_memory is not None:
            return c.keep_freed_memory
        return default_keep_freed_memory(self.model_config if remat is None else self.model_config.replace(remat=remat))

    def _use_xla(self) -> bool:
        jit = self.config.jit_compile
        if jit is None:
            jit = default_jit_compile(self.model_config)
        if not jit:
            return False
        if self.strategy.extended.worker_devices and self.replicas > len(
            {d.split("/device:")[0] for d in self.strategy.extended.worker_devices}
        ) and not tf.config.list_logical_devices("GPU"):
            # Logical CPU devices share one XLA CPU device; XLA cannot address their variables.
            self.log("Note: XLA is off with several logical CPU replicas (--jit_compile ignored).")
            return False
        return True

    def _compile_functions(self):
        strategy = self.strategy
        # XLA compiles the forward and backward pass; the optimizer update (which aggregates
        # gradients across replicas) runs outside it.
        gradients = tf.function(self._replica_gradients, jit_compile=self._use_xla())

        def replica_step(images, labels):
            grads, sums = gradients(images, labels)
            self.optimizer.apply(grads, self.model.trainable_variables)
            return sums

        @tf.function
        def train_steps(iterator, steps):
            totals = tf.zeros([3])
            for _ in tf.range(steps):
                images, labels = next(iterator)
                sums = strategy.run(replica_step, args=(images, labels))
                totals += strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)
            return totals

        @tf.function
        def eval_step(batch):
            sums = strategy.run(self._replica_eval_step, args=batch)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)

        self.train_steps, self.eval_step = train_steps, eval_step

    # ----------------------------------------------------------------------------- loops

    def _train_dataset(self, epoch: int):
        # One deterministic order per epoch, so a resumed epoch sees the data the lost one did.
        seed = self.config.seed * 100_003 + epoch
        ds = data_lib.make_dataset(self.train_split, self.config.global_batch_size, training=True, seed=seed)
        return self.strategy.experimental_distribute_dataset(ds)

    def evaluate(self, split: data_lib.Split) -> dict:
        """Loss and accuracy of the current model on ``split``."""
        ds = data_lib.make_dataset(split, self.config.eval_batch_size, training=False, seed=None)
        totals = np.zeros(3)
        for batch in self.strategy.experimental_distribute_dataset(ds):
            totals += self.eval_step(batch).numpy()
        return {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}

    def _run_epoch(self, epoch: int, step: int) -> tuple[dict, int, float]:
        c = self.config
        steps = min(self.steps_per_epoch, self.total_steps - step)
        iterator = iter(self._train_dataset(epoch))
        bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy", "lr"]) if self.interactive else None
        totals, done, start = np.zeros(3), 0, time.perf_counter()
        while done < steps:
            chunk = min(c.steps_per_execution, steps - done)
            totals += self.train_steps(iterator, tf.constant(chunk)).numpy()
            done += chunk
            if not np.isfinite(totals[0]):
                raise TrainingError(
                    f"The training loss became {totals[0]} at step {step + done} (epoch {epoch + 1}). "
                    "Lower --learning_rate, raise --warmup_ratio, or train in --mixed_precision=float32."
                )
            if bar is not None:
                lr = float(self.schedule(step + done - 1))
                bar.update(done, [("loss", totals[0] / totals[2]), ("accuracy", totals[1] / totals[2]), ("lr", lr)])
        seconds = time.perf_counter() - start
        metrics = {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}
        return metrics, step + done, seconds

    def _init_from(self, path: str) -> None:
        """Sets every weight from the model saved at ``path`` (``--init_from``); an error names
        what differs when it is not this run's architecture or normalization."""
        if not os.path.isfile(path):
            raise ConfigError(f"--init_from={path} does not exist.")
        try:
            source = keras.saving.load_model(path, compile=False)
        except Exception as exc:  # not a .keras archive, or one of unknown classes
            raise ConfigError(f"--init_from={path} cannot be read as a Keras model: {exc}") from None

        def weights(model):
            return [v for v in model.weights if "seed_generator" not in v.path]

        def normalization(model):
            layer = next((l for l in model.layers if isinstance(l, sa_conv.PixelNormalization)), None)
            return layer and (tuple(layer.mean), tuple(layer.std))

        mine, theirs = weights(self.model), weights(source)
        layout = [(v.path, tuple(v.shape)) for v in mine]
        other = [(v.path, tuple(v.shape)) for v in theirs]
        if layout != other:
            diff = [f"{a} vs {b}" for a, b in zip(layout, other) if a != b][:3]
            raise ConfigError(
                f"--init_from={path} holds a different architecture ({len(other)} weights against this run's "
                f"{len(layout)}; first differences: {'; '.join(diff) or 'missing weights'}). Use the flags "
                "(--model, --num_layers, ...) of the run or import that wrote it.")
        ours, its = normalization(self.model), normalization(source)
        if bool(ours) != bool(its) or (ours and not np.allclose(ours, its, rtol=1e-6, atol=0)):
            raise ConfigError(
                f"--init_from={path} normalizes with mean, std {its}; this run with {ours}. Set --pixel_statistics to match (reference for an imported "
                "reference model).")
        for variable, value in zip(mine, theirs):
            variable.assign(value)
        self.log(f"Initialized {len(mine)} weights from {path}.")

    def _restore(self) -> tuple[int, list]:
        """Restores the newest readable checkpoint. An unreadable one (truncated, corrupted) is
        reported and skipped for the one before it; when checkpoints exist but none is readable,
        stops with an error naming the directory, deleting nothing."""
        history_path = os.path.join(self.output_dir, "history.json")
        candidates = list(reversed(self.manager.checkpoints))
        if not candidates:
            return 0, []
        recorded = []
        if os.path.isfile(history_path):
            with open(history_path) as f:
                recorded = json.load(f)
        for path in candidates:
            try:
                self._match_architecture(path, recorded)
                self.checkpoint.restore(path).assert_existing_objects_matched()
                break
            except Exception as exc:  # a damaged file raises OpError, IndexError, ValueError, ...
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.log(f"Warning: checkpoint {path} is unreadable ({first_line[:200]}); trying an older one.")
        else:
            raise TrainingError(
                f"None of the {len(candidates)} checkpoint(s) in {self.manager.directory} can be read "
                "(truncated or corrupted files). Nothing was deleted: move that directory away to start "
                "over, or restore the files."
            )
        latest = path
        epoch = int(self.epoch.numpy())
        history = [h for h in recorded if h["epoch"] <= epoch]
        self.log(f"Resuming from {latest}: {epoch} epoch(s), step {int(self.optimizer.iterations.numpy())} done.")
        return epoch, history

    def _match_architecture(self, path: str, recorded: list) -> None:
        """Rebuilds the model with the head counts it had when checkpoint ``path`` (``ckpt-<epoch>``)
        was written, as recorded in the history by --prune_degenerate_heads."""
        epoch = int(path.rsplit("-", 1)[1])
        current = heads_lib.heads_per_block(self.model)
        counts = next((h["num_heads"] for h in reversed(recorded) if h["epoch"] <= epoch and "num_heads" in h),
                      [self.model_config.num_heads] * len(current))
        if counts == current:
            return
        with self.strategy.scope():
            model = heads_lib.prune_to(self.build_model(), counts)
        self._build(model)
        self._compile_functions()
        self.log(f"Checkpoint {path} holds a pruned model: heads per block {counts}.")

    def _write_config(self):
        resolved = {**self.config.to_dict(), "resolved_model": self.model_config.to_dict(),
                    "replicas": self.replicas, "steps_per_epoch": self.steps_per_epoch,
                    "total_steps": self.total_steps,
                    "process": process.describe(self.config.mixed_precision)}
        _write_json(os.path.join(self.output_dir, "config.json"), resolved)

    def prepare(self, model: keras.Model | None = None) -> None:
        """Loads the data, builds the model (or takes ``model``, built under this strategy),
        the optimizer with its schedule, and the step functions."""
        self._load_data()
        self._build(model)
        self._check_gaussian_heads()
        self._compile_functions()
        self.prepared = True

    def train_epochs(self, start_epoch: int, history: list, callbacks=(), save=True) -> tuple[list, float]:
        """Trains epochs ``start_epoch .. total_epochs``, validating after each; calls the Keras
        ``callbacks``' epoch hooks with the epoch's metrics (``loss``, ``accuracy``,
        ``val_loss``, ``val_accuracy``). With ``save``, writes the per-epoch artefacts
        (TensorBoard, best model, history, checkpoint). Returns the history and training seconds."""
        writers = self._summary_writers() if save else None
        callbacks = list(callbacks) + (self._callbacks() if save else [])
        for callback in callbacks:
            callback.set_model(self.model)
            callback.on_train_begin()
        step = max(int(self.optimizer.iterations.numpy()), start_epoch * self.steps_per_epoch)
        self.optimizer.iterations.assign(step)
        train_seconds = 0.0
        for epoch in range(start_epoch, self.total_epochs):
            if step >= self.total_steps:
                break
            for callback in callbacks:
                callback.on_epoch_begin(epoch)
            train_metrics, step, seconds = self._run_epoch(epoch, step)
            train_seconds += seconds
            val_metrics = self.evaluate(self.val_split)
            record = {
                "epoch": epoch + 1, "step": step, "learning_rate": float(self.schedule(step - 1)),
                "train_seconds": seconds,
                "train_loss": train_metrics["loss"], "train_accuracy": train_metrics["accuracy"],
                "val_loss": val_metrics["loss"], "val_accuracy": val_metrics["accuracy"],
            }
            best = max((h["val_accuracy"] for h in history), default=-1.0)
            history.append(record)
            if self.config.reset_degenerate_heads:
                self._reset_degenerate_heads(record)
            if self.config.prune_degenerate_heads:
                self._prune_degenerate_heads(record)
                for callback in callbacks:
                    callback.set_model(self.model)
            logs = {"loss": record["train_loss"], "accuracy": record["train_accuracy"],
                    "val_loss": record["val_loss"], "val_accuracy": record["val_accuracy"]}
            for callback in callbacks:
                callback.on_epoch_end(epoch, logs)
            if save:
                self._write_summaries(writers, record)
                if self.chief and record["val_accuracy"] > best:
                    _save_keras_atomically(self.model, os.path.join(self.output_dir, "best_model.keras"))
                _write_json(os.path.join(self.output_dir, "history.json"), history)
                self.epoch.assign(epoch + 1)
                self.manager.save(checkpoint_number=epoch + 1)
            # Last: once its line is printed, the epoch is saved and a rerun resumes after it.
            self._log_epoch(record, seconds)
        for callback in callbacks:
            callback.on_train_end()
        return history, train_seconds

    def run(self) -> dict:
        """Trains (or resumes) to the end, evaluates the test split once, writes the artefacts.

        Returns the results written to ``results.json``.
        """
        wall_start = time.perf_counter()
        if not self.prepared:
            self.prepare()
        self._write_config()
        start_epoch, history = self._restore()
        resumed_from = start_epoch if start_epoch else None
        if self.config.init_from and not self.manager.checkpoints:
            self._init_from(self.config.init_from)
        params = _count_parameters(self.model)
        self.log(
            f"Training {self.config.model} ({params:,} parameters) on {len(self.train_split)} images "
            f"({len(self.val_split)} held out for validation), {self.replicas} replica(s), "
            f"{self.steps_per_epoch} steps/epoch, {self.total_steps} steps in all."
        )
        earlier_seconds = sum(h.get("train_seconds", 0.0) for h in history)
        history, seconds = self.train_epochs(start_epoch, history)
        return self._finish(history, resumed_from, earlier_seconds + seconds, wall_start)

    def _finish(self, history, resumed_from, train_seconds, wall_start) -> dict:
        params = _count_parameters(self.model)  # after any --prune_degenerate_heads
        test = self.evaluate(self.test_split)
        last = history[-1] if history else {}
        best = max(history, key=lambda h: h["val_accuracy"]) if history else {}
        images = sum(h["step"] - (history[i - 1]["step"] if i else 0) for i, h in enumerate(history))
        results = {
            "preset": self.config.model,
            "model_config": self.model_config.to_dict(),
            "parameters": params,
            "epochs": len(history),
            "steps": int(self.optimizer.iterations.numpy()),
            "replicas": self.replicas,
            "global_batch_size": self.config.global_batch_size,
            "train_loss": last.get("train_loss"),
            "train_accuracy": last.get("train_accuracy"),
            "val_loss": last.get("val_loss"),
            "val_accuracy": last.get("val_accuracy"),
            "best_val_accuracy": best.get("val_accuracy"),
            "best_epoch": best.get("epoch"),
            "test_loss": test["loss"],
            "test_accuracy": test["accuracy"],
            "images_per_second": images * self.config.global_batch_size / train_seconds if train_seconds else None,
            "wall_time_seconds": time.perf_counter() - wall_start,
            "resumed_from_epoch": resumed_from,
            "label_names": list(self.label_names),
            "weights_sha256": weights_checksum(self.model),
        }
        _write_json(os.path.join(self.output_dir, "results.json"), results)
        if self.chief:
            _save_keras_atomically(self.model, os.path.join(self.output_dir, "model.keras"))
        self.log(
            f"Test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f}) after {results['steps']} "
            f"steps; results in {os.path.join(self.output_dir, 'results.json')}."
        )
        return results

    def _reset_degenerate_heads(self, record):
        found = sa_conv.degenerate_heads(self.model)
        record["reset_heads"] = {str(k): v for k, v in found.items()}
        if found:
            sa_conv.reset_heads(self.model, found)
            self.log("Re-initialized degenerate heads (block: heads): "
                     + ", ".join(f"{k}: {v}" for k, v in found.items()))

    def _check_gaussian_heads(self):
        flag = ("--reset_degenerate_heads" if self.config.reset_degenerate_heads
                else "--prune_degenerate_heads" if self.config.prune_degenerate_heads else None)
        if flag is None:
            return
        blocks = sa_conv.attention_blocks(self.model)
        if not blocks or any(b.attention.position_encoding.gaussian() is None for b in blocks):
            raise ConfigError(
                f"{flag} needs a model whose heads are Gaussian (a quadratic encoding); "
                f"{self.config.model} with encoding {self.model_config.encoding!r} has none."
            )

    def _prune_degenerate_heads(self, record):
        found = sa_conv.degenerate_heads(self.model)
        counts = heads_lib.heads_per_block(self.model)
        for block, heads in found.items():
            if len(heads) == counts[block]:
                # A block needs one head: keep its first and say so.
                self.log(f"Block {block}: all {counts[block]} heads are degenerate; head {heads[0]} is kept.")
                heads.pop(0)
        found = {block: heads for block, heads in found.items() if heads}
        record["pruned_heads"] = {str(k): v for k, v in found.items()}
        if found:
            old_model, old_optimizer = self.model, self.optimizer
            take = heads_lib.head_slicer(old_model, found)
            with self.strategy.scope():
                model = sa_conv.prune_heads(old_model, found)
            before = _count_parameters(old_model)
            self._build(model)
            self._transfer_optimizer_state(old_optimizer, old_model, take)
            self._compile_functions()
            self.log("Pruned degenerate heads (block: heads): "
                     + ", ".join(f"{k}: {v}" for k, v in found.items())
                     + f"; {before:,} -> {_count_parameters(self.model):,} parameters.")
        record["num_heads"] = heads_lib.heads_per_block(self.model)
        record["parameters"] = _count_parameters(self.model)

    def _transfer_optimizer_state(self, old_optimizer, old_model, take):
        """Copies the optimizer's step and momentums into the pruned model's new optimizer,
        keeping the momentum slices of the kept heads: training goes on as if the pruned heads'
        weights had never existed."""
        shadowed = {}  # id(optimizer variable) -> the model variable it shadows
        inner = getattr(old_optimizer, "inner_optimizer", old_optimizer)
        for variable, momentum in zip(old_model.trainable_variables, getattr(inner, "momentums", [])):
            shadowed[id(momentum)] = variable
        for old, new in zip(old_optimizer.variables, self.optimizer.variables):
            value = ops.convert_to_numpy(old)
            if tuple(new.shape) != value.shape:
                value = take(shadowed[id(old)], value, new.shape)
            new.assign(value)

    # ----------------------------------------------------------------------------- logging

    def _log_epoch(self, r, seconds):
        self.log(
            f"epoch {r['epoch']}/{self.total_epochs} step {r['step']}/{self.total_steps} "
            f"loss {r['train_loss']:.4f} acc {r['train_accuracy']:.4f} "
            f"val_loss {r['val_loss']:.4f} val_acc {r['val_accuracy']:.4f} lr {r['learning_rate']:.5f} "
            f"({seconds:.1f}s, {(r['step'] - (r['epoch'] - 1) * self.steps_per_epoch) * self.config.global_batch_size / max(seconds, 1e-9):.1f} img/s)"
        )

    def _callbacks(self):
        every = self.config.attention_summaries_every
        if not every or not self.chief:
            return []
        if not sa_conv.attention_blocks(self.model):
            raise ConfigError(f"--attention_summaries_every needs an attention model, not {self.config.model}.")
        from trainers.attention_summaries import AttentionSummaries

        callback = AttentionSummaries(self.val_split.images[:4], os.path.join(self.output_dir, "logs", "attention"), every)
        callback.set_model(self.model)
        return [callback]

    def _summary_writers(self):
        if not self.chief:
            return None
        logs = os.path.join(self.output_dir, "logs")
        return {name: tf.summary.create_file_writer(os.path.join(logs, name)) for name in ("train", "validation")}

    def _write_summaries(self, writers, r):
        if writers is None:
            return
        with writers["train"].as_default(step=r["epoch"]):
            tf.summary.scalar("epoch_loss", r["train_loss"])
            tf.summary.scalar("epoch_accuracy", r["train_accuracy"])
            tf.summary.scalar("learning_rate", r["learning_rate"])
        with writers["validation"].as_default(step=r["epoch"]):
            tf.summary.scalar("epoch_loss", r["val_loss"])
            tf.summary.scalar("epoch_accuracy", r["val_accuracy"])
        for w in writers.values():
            w.flush()


def train(config: TrainConfig, strategy=None, log=print) -> dict:
    """Flag-free entry point: trains ``config`` and returns its results.

    As a run's entry point it configures the process for it (`trainers.process`): it seeds
    Python, NumPy and the backend with ``config.seed`` and, where ``--keep_freed_memory`` (or its
    default for the model) says so, raises glibc's allocator thresholds. The `Trainer` itself
    changes no process-wide state."""
    process.seed(config.seed)
    trainer = Trainer(config, strategy=strategy, log=log)
    trainer.prepare()
    process.keep_freed_memory(trainer.keeps_freed_memory())
    return trainer.run()


# ------------------------------------------------------------------------------------ CLI


def main():
    config = make_config(cli.settings(TrainConfig), {})
    distribute.configure_cpu_devices(config.cpu_devices)
    train(config)


def run():
    """Console script ``sa-conv-train``."""
    cli.run("sa-conv-train", main, TrainConfig)


if __name__ == "__main__":
    run()
