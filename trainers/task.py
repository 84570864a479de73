"""`Task`: what a training run computes, as a public API (after TF Model Garden's Task).

A `Task` is made from a `TrainConfig` and its data. It resolves the model configuration once
(the preset, the flags' overrides, what the data decides, the remat decision) and builds what
a training loop needs:

* the model (`build_model`), the learning-rate schedule and optimizer (`build_schedule`,
  `build_optimizer`);
* one replica's steps: loss with coupled L2 weight decay and its gradients (`gradients`), the
  training step that applies them (`train_step`) and the evaluation step (`eval_step`), with the
  XLA decision (`use_xla`);
* the datasets: the training split in a deterministic order per epoch (`train_dataset`) and any
  split for evaluation (`eval_dataset`), in global batches.

A Task is a single-replica view, as in Model Garden: it never sees a `tf.distribute` strategy.
The `trainers.train.Trainer` owns the strategy: it builds the model and optimizer under its scope,
runs the Task's steps on every replica and reduces them (`trainers.distribute.replicated_train_steps`,
`replicated_eval_step`, `evaluate`), and runs the loop (epochs, checkpoints, logs, callbacks). The
tuner builds its trials' models and the benchmarks their steps through the same API.
"""

from __future__ import annotations

from typing import Callable

import keras
import numpy as np
import tensorflow as tf

import sa_conv
from trainers import data as data_lib
from trainers import footprint
from sa_conv.errors import ConfigError
from sa_conv.reference import REFERENCE_MEAN, REFERENCE_STD
from trainers import precision, run_files
from trainers.config import TrainConfig, default_jit_compile, default_keep_freed_memory
from trainers.augmentation import Pipeline
from trainers.optimizers import OPTIMIZERS
from trainers.schedule import make_schedule



def resumed_precision(model_dir: str | None) -> dict | None:
    """The ``precision`` (``{"policy", "why"}``) the run in ``model_dir`` recorded in its
    ``config.json``, if it has finished an epoch (so a rerun resumes it); else None."""
    if not model_dir or not run_files.epochs_done(model_dir):
        return None
    return (run_files.read_config(model_dir) or {}).get("precision")


def data_model_fields(config: TrainConfig, dataset: data_lib.ImageData) -> dict:
    """The `sa_conv.ModelConfig` fields that ``dataset`` decides (image size, channels, classes,
    normalization), with ``config.pixel_statistics`` applied."""
    try:
        fields = dataset.model_fields(config.image_size)
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
    attention = model_config.is_attention
    if config.remat == "blocks" and not attention:
        raise ConfigError(f"--remat=blocks: {config.model} has no transformer blocks; use --remat=none or auto.")
    if config.remat != "auto":
        return config.remat == "blocks"
    estimate = footprint.over_budget(model_config, replica_batch, config.memory_budget_gb)
    if estimate is not None and log:
        log(f"Rematerializing the transformer blocks (--remat=auto): a step's activations are estimated at "
            f"{estimate:.1f} GB per replica, above --memory_budget_gb={config.memory_budget_gb:g}.")
    return estimate is not None


def resolve_model_config(config: TrainConfig, dataset: data_lib.ImageData, replica_batch: int,
                         log=print, model_fields: dict | None = None) -> sa_conv.ModelConfig:
    """The model configuration of a run: ``config.model``'s preset with the flags' overrides and
    ``model_fields`` (any further `sa_conv.ModelConfig` fields), the fields ``dataset`` decides
    (`data_model_fields`) and the remat decision (`remat_blocks`)."""
    try:
        preset = sa_conv.get_config(config.model, **config.model_overrides(), **(model_fields or {}))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    fields = data_model_fields(config, dataset)
    if config.image_size is not None and preset.is_attention:
        # The learned encodings' tables are sized from the grid (the offset-function encodings
        # need nothing); a preset's larger tables stay.
        fields["max_grid_size"] = max(preset.max_grid_size, fields["image_size"] // preset.pooling_width)
    try:
        model_config = preset.replace(**fields)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if log:
        note = attention_dropout_note(model_config)
        if note:
            log(note)
    return model_config.replace(remat=remat_blocks(config, model_config, replica_batch, log))


def attention_dropout_note(model_config) -> str | None:
    """What attention dropout costs a run whose encoding could otherwise train through the exact
    separable path, and the choice (None where it does not apply): the dense path's per-example
    ``(heads, N, N)`` tensors grow as ``N^2``, the separable path's activations as ``N``."""
    if (not model_config.is_attention or footprint.trains_separable(model_config)
            or not footprint.trains_separable(model_config, attention_dropout=0.0)):
        return None
    g = model_config.grid_size
    return (f"--attention_dropout={model_config.attention_dropout:g} makes training take the dense attention path on "
            f"this {g}x{g} grid: {footprint.attention_dropout_bytes(model_config) / 2**20:,.1f} MiB of (heads, N, N) "
            f"tensors per example and layer, growing as N^2. --attention_dropout=0 trains through the exact separable "
            f"path (O(N (H + W)); docs/training.md, resolution and memory).")


def decays(variable, excluded=(), spared=()) -> bool:
    """Whether weight decay applies to ``variable``: it is not among the ``spared`` variables (what
    the model declares, `sa_conv.no_weight_decay`) and its short name is not in ``excluded``
    (``--no_weight_decay``)."""
    return not any(variable is v for v in spared) and variable.name.split("/")[-1].split(":")[0] not in excluded


def count_parameters(model: keras.Model) -> int:
    """Trainable parameters of ``model``."""
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


class Task:
    """The model, data, loss, optimizer and steps of a `TrainConfig` (see the module docstring).

    Args:
      config: the run's settings (validated here).
      replicas: how many replicas share a global batch (the strategy's, which the Trainer owns):
        the batch sizes must divide by it, and the remat decision reads a replica's batch.
      dataset: the data, if already loaded (the tuner loads it once for every trial); None loads
        ``config.dataset``.
      log: where decisions are reported (remat, XLA).
      model_fields: further `sa_conv.ModelConfig` fields that have no flag (the benchmarks set the
        grid and the attention path with them).

    Attributes set once, here: ``model_config`` (the resolved `sa_conv.ModelConfig`),
    ``train_split``, ``val_split`` (the data's own, else held out from the training split, seeded), ``test_split``,
    ``label_names``, ``steps_per_epoch``, ``replicas``, ``precision`` (the dtype policy, with
    ``--mixed_precision=auto`` resolved) and ``precision_reason``. The Task changes no
    process-wide state.
    """

    def __init__(self, config: TrainConfig, replicas: int = 1, dataset: data_lib.ImageData | None = None,
                 log: Callable[[str], None] = print, model_fields: dict | None = None):
        config.validate()
        self.config, self.log = config, log
        # --mixed_precision=auto decided once, from the hardware (trainers.precision), when the run
        # starts: a resumed run keeps what it started with.
        self.precision, self.precision_reason = precision.training_policy(
            config.mixed_precision, resumed=resumed_precision(config.model_dir))
        if model_fields:  # validate() checked the preset and overrides; a caller's fields can still conflict
            try:
                sa_conv.get_config(config.model, **config.model_overrides(), **model_fields)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        self.replicas = replicas
        for name in ("global_batch_size", "eval_batch_size"):
            if getattr(config, name) % replicas:
                raise ConfigError(
                    f"--{name}={getattr(config, name)} is not divisible by the {replicas} replicas; "
                    f"use a multiple of {replicas}.")
        dataset = dataset or data_lib.load_dataset(config.dataset, config.data_dir, seed=config.seed,
                                                   image_size=config.image_size, log=log)
        for note in dataset.notes:
            log(note)
        if config.data_dir and not data_lib.get_source(config.dataset).reads_data_dir:
            log(f"--data_dir={config.data_dir} is unused: --dataset={config.dataset} does not read it.")
        self.label_names = dataset.label_names
        if dataset.validation is not None:  # the data's own validation split
            self.train_split, self.val_split = dataset.train, dataset.validation
            if config.validation_size is not None:
                log(f"--validation_size={config.validation_size} is unused: the data has its own validation split "
                    f"({len(dataset.validation)} images).")
        else:
            self.train_split, self.val_split = data_lib.split_train_validation(
                dataset.train, config.validation_size, seed=config.seed)
        self.test_split = dataset.test
        # Image size, classes and normalization statistics (of the official training split) come
        # from the data, so the model and its exports take this dataset's raw pixels.
        self.model_config = resolve_model_config(
            config, dataset, config.global_batch_size // replicas, log, model_fields)
        self.augmentation = Pipeline(config, self.model_config.num_classes)
        self.steps_per_epoch = len(self.train_split) // config.global_batch_size
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"{len(self.train_split)} training images make no full batch of "
                f"--global_batch_size={config.global_batch_size}; lower the batch size.")

    # ------------------------------------------------------------------------- model, optimizer

    def build_model(self) -> keras.Model:
        """A new model of the resolved configuration in ``--mixed_precision`` (as its layers' dtype
        policy: the global policy is left alone); its variables go where the caller's strategy
        scope puts them."""
        return sa_conv.build_model(self.model_config, name=self.config.model, dtype=self.precision)

    def total_steps(self, epochs: int | None = None) -> int:
        """Optimizer steps of ``epochs`` (default ``--epochs``), capped by ``--max_steps``."""
        total = (self.config.epochs if epochs is None else epochs) * self.steps_per_epoch
        return min(total, self.config.max_steps) if self.config.max_steps else total

    def build_schedule(self, total_steps: int):
        """The learning-rate schedule (`trainers.schedule`) of a run of ``total_steps``."""
        c = self.config
        return make_schedule(
            c.lr_schedule, c.learning_rate, total_steps, c.warmup_ratio,
            [e * self.steps_per_epoch for e in c.milestone_epochs()], c.lr_decay_factor,
            steps_per_update=self.steps_per_epoch if c.lr_update == "epoch" else 1)

    def build_optimizer(self, model: keras.Model, schedule) -> keras.optimizers.Optimizer:
        """``--optimizer`` (`trainers.optimizers.OPTIMIZERS`) following ``schedule``, keeping the
        moving average of `averaged_variables` with ``--ema_momentum``, loss-scaled under
        mixed_float16, built for ``model``'s variables (in the caller's strategy scope, the model's)."""
        c = self.config
        decayed = {id(v) for v in self.decayed_variables(model)}
        spared = [v for v in model.trainable_variables if id(v) not in decayed]
        ema = dict(use_ema=True, ema_momentum=c.ema_momentum) if c.ema_momentum else {}
        optimizer = OPTIMIZERS[c.optimizer].make(c, schedule, spared, **ema)
        if self.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        # Keras averages the variables an optimizer is built for, and steps only those given a
        # gradient: built for the moving statistics too, it averages them without stepping them.
        optimizer.build(self.averaged_variables(model) if ema else model.trainable_variables)
        return optimizer

    def averaged_variables(self, model: keras.Model) -> list:
        """What ``--ema_momentum`` averages: the trainable variables, then the other weights
        (BatchNormalization's moving statistics), as timm's model EMA averages a model's whole
        state: the averaged weights are evaluated with statistics averaged alike, not with those
        of the last steps' weights."""
        return [*model.trainable_variables, *model.non_trainable_weights]

    def decayed_variables(self, model: keras.Model) -> list:
        """``model``'s variables under weight decay: all but those the model declares
        (`sa_conv.no_weight_decay`: the attention centers and spreads, as the reference implementation,
        which decays everything else, biases and LayerNorm included) and ``--no_weight_decay``'s names."""
        excluded, spared = self.config.weight_decay_exclusions(), sa_conv.no_weight_decay(model)
        return [v for v in model.trainable_variables if decays(v, excluded, spared)]

    def keeps_freed_memory(self) -> bool:
        """``--keep_freed_memory``, or its default for this model (`default_keep_freed_memory`)."""
        if self.config.keep_freed_memory is not None:
            return self.config.keep_freed_memory
        return default_keep_freed_memory(self.model_config)

    def use_xla(self) -> bool:
        """Whether the forward and backward pass compile with XLA: ``--jit_compile``, or its default
        for this model and replica batch (`default_jit_compile`; the Trainer turns it off where its
        strategy's devices cannot run it: `trainers.distribute.xla_runs_on`)."""
        jit = self.config.jit_compile
        if jit is not None:
            return jit
        return default_jit_compile(self.model_config, self.config.global_batch_size // self.replicas,
                                   self.config.memory_budget_gb)

    # ------------------------------------------------------------------------- steps

    def per_example_loss(self, labels, logits):
        """Cross-entropy (with ``--label_smoothing``) per example, float32: ``(batch,)``. ``labels``:
        class indices ``(batch,)``, or one-hot ``(batch, classes)`` (mixed by MixUp or CutMix)."""
        one_hot = labels if len(labels.shape) == 2 else tf.one_hot(labels, self.model_config.num_classes)
        loss = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=self.config.label_smoothing, reduction=None)
        return loss(one_hot, tf.cast(logits, tf.float32))

    @staticmethod
    def sums(per_example, labels, logits):
        """``[sum of losses, correct predictions, examples]`` of a batch: summed across replicas
        and batches, they give the mean loss and accuracy. With mixed labels, a prediction is
        correct when it is the label's largest class."""
        if len(labels.shape) == 2:
            labels = tf.argmax(labels, -1)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(labels, tf.int64)), tf.float32)
        count = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(correct), count])

    def gradients(self, model: keras.Model, optimizer, images, labels, decayed=None):
        """One replica's gradients of its share of the global batch's mean loss plus, where the
        optimizer couples weight decay (SGD), the L2 term ``weight_decay / 2 * sum w^2`` over
        ``decayed`` (default `decayed_variables`), as PyTorch's ``SGD(weight_decay=)`` adds
        ``weight_decay * w`` to the gradient; loss-scaled
        when ``optimizer`` scales. Returns ``(gradients, sums)`` (`sums`)."""
        c = self.config
        decayed = self.decayed_variables(model) if decayed is None else decayed
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = self.per_example_loss(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=c.global_batch_size)
            if c.weight_decay and decayed and OPTIMIZERS[c.optimizer].couples_weight_decay:
                l2 = tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in decayed])
                loss += tf.nn.scale_regularization_loss(0.5 * c.weight_decay * l2)
            scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
        return tape.gradient(scaled, model.trainable_variables), self.sums(per_example, labels, logits)

    def train_step(self, model: keras.Model, optimizer, jit_compile: bool | None = None):
        """``step(images, labels) -> sums``: one replica's optimizer step on its share of a global
        batch (`gradients`, then the update) and its `sums`. ``jit_compile`` (default `use_xla`)
        compiles the forward and backward pass; the update, which aggregates gradients across
        replicas, runs outside XLA."""
        decayed = self.decayed_variables(model)
        gradients = tf.function(lambda x, y: self.gradients(model, optimizer, x, y, decayed),
                                jit_compile=self.use_xla() if jit_compile is None else jit_compile)

        def step(images, labels):
            grads, sums = gradients(images, labels)
            optimizer.apply(grads, model.trainable_variables)
            return sums

        return step

    def eval_step(self, model: keras.Model):
        """``step(images, labels) -> sums``: one replica's evaluation of its share of a batch."""

        def step(images, labels):
            logits = model(images, training=False)
            return self.sums(self.per_example_loss(labels, logits), labels, logits)

        return step

    # ------------------------------------------------------------------------- data

    def train_dataset(self, epoch: int) -> tf.data.Dataset:
        """Epoch ``epoch``'s shuffled, augmented global batches of the training split. One
        deterministic order per epoch, so a resumed epoch sees the data the lost one did."""
        seed = self.config.seed * 100_003 + epoch
        return data_lib.make_dataset(self.train_split, self.config.global_batch_size, training=True, seed=seed,
                                     image_size=self.model_config.image_size, augmentation=self.augmentation)

    def images(self, split, count: int) -> np.ndarray:
        """The first ``count`` images of ``split`` as the model sees them in evaluation, uint8."""
        return data_lib.head(split, count, self.model_config.image_size)

    def eval_dataset(self, split: data_lib.Split) -> tf.data.Dataset:
        """``split`` in global batches of ``--eval_batch_size``, in order, as evaluation sees it."""
        return data_lib.make_dataset(split, self.config.eval_batch_size, training=False, seed=None,
                                     image_size=self.model_config.image_size)
