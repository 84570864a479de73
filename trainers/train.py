"""Distributed CIFAR-10 training of any sa_conv preset (``python -m trainers.train``,
``sa-conv-train``).

One training path for every strategy: a custom loop with ``strategy.run`` (Keras 3.15's
``model.fit`` fails under MultiWorkerMirroredStrategy, keras-team/keras#20585). The loop:

* splits each global batch across replicas and averages the loss over the global batch
  (``tf.nn.compute_average_loss``); metrics are summed across replicas;
* steps the learning rate per optimizer step (`trainers.schedule`);
* validates on the held-out split after every epoch (never on the test split);
* writes TensorBoard scalars (loss, accuracy, learning rate) to ``model_dir/logs``;
* checkpoints model, optimizer, the dropout layers' seed generators and progress after every
  epoch (`checkpoints.training_checkpoint`): the same command, rerun after a kill at any moment,
  resumes from the last finished epoch and ends with the weights of the run left alone;
* keeps the best model by validation accuracy (``best_model.keras``) and, with
  ``--snapshot_every=N``, the model at the start and every N epochs (``snapshots/``);
* stops with a clear error when the loss becomes NaN or infinite;
* evaluates the test split once at the end, writes ``results.json`` and ``model.keras``.

Model directory layout: ``config.json``, ``history.json`` (one record per epoch),
``checkpoints/``, ``logs/{train,validation}``, ``best_model.keras``, ``model.keras``,
``results.json``, and with ``--snapshot_every`` ``snapshots/epoch_<EEE>.keras``
(`trainers.run_files` names those other programs read). Workers other than the chief write to
``workers/worker_<id>/``.
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import contextlib
import hashlib
import os
import sys
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

import sa_conv
from trainers import cli, files
from trainers import data as data_lib
from sa_conv import heads as heads_lib
from sa_conv.errors import ConfigError
from trainers import checkpoints, distribute, pruning, run_files
from trainers.checkpoints import TrainingError
from trainers.config import MODEL_OVERRIDES, TrainConfig, make_config
from trainers.task import Task, count_parameters

__all__ = ["Trainer", "TrainingError", "train", "weights_checksum"]


def weights_checksum(model: keras.Model) -> str:
    """SHA-256 of all weights' bytes: equal on two workers iff their weights are identical."""
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()


# The flags a run's checkpoint layout follows (the model's, and the optimizer's slots and averages): named
# when a restart's differ and its checkpoints do not restore.
MODEL_FLAGS = ("model", *MODEL_OVERRIDES, "dataset", "image_size", "optimizer", "ema_momentum")


def changed_model_flags(recorded: dict, config: TrainConfig) -> list[str]:
    """``"--flag=recorded (this run: --flag=value)"`` for each of `MODEL_FLAGS` whose value in
    ``recorded`` (a run's ``config.json``) differs from ``config``'s."""
    def flag(name, value):
        return f"no --{name}" if value is None else f"--{name}={value}"

    return [f"{flag(name, recorded.get(name))} (this run: {flag(name, getattr(config, name))})"
            for name in MODEL_FLAGS if name in recorded and recorded[name] != getattr(config, name)]


class Trainer:
    """The training loop over a `trainers.task.Task`: epochs, validation, checkpoints, logs,
    TensorBoard and callbacks. What is computed (model, optimizer, steps, data) is the Task's.

    Args:
      config: the run's settings; ``epochs``, ``max_steps``, ``model_dir`` and the per-epoch
        options are the loop's, the rest the Task's.
      strategy: the `tf.distribute` strategy the Trainer runs the Task's steps on; None creates
        the one ``config.strategy`` names.
      dataset: for the Task (see `Task`), when ``task`` is None.
      log: where progress lines go.
      interactive: show a progress bar (default: when stdout is a terminal).
      task: a Task built for a config with the same model and data settings (the tuner builds
        a trial's model from it), or None to make one.

    It changes no process-wide state: its models carry their dtype policy, and the process
    settings of a run (seed, allocator) are its entry point's (`train`, `trainers.process`).
    """

    def __init__(
        self,
        config: TrainConfig,
        strategy: tf.distribute.Strategy | None = None,
        log: Callable[[str], None] = print,
        interactive: bool | None = None,
        dataset: data_lib.ImageData | None = None,
        task: Task | None = None,
    ):
        config.validate()
        self.config, self.log = config, log
        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        # The strategy before the data: MultiWorkerMirroredStrategy must configure collective ops
        # before anything else initializes TensorFlow's context.
        self.strategy = strategy or distribute.create_strategy(config.strategy)
        self.replicas = self.strategy.num_replicas_in_sync
        self.task = task or Task(config, replicas=self.replicas, dataset=dataset, log=log)
        if self.task.replicas != self.replicas:
            raise ConfigError(f"The Task was made for {self.task.replicas} replica(s), the strategy has "
                              f"{self.replicas}: make it with Task(config, replicas={self.replicas}).")
        self.steps_per_epoch = self.task.steps_per_epoch
        self.total_steps = self.task.total_steps(config.epochs)
        self.total_epochs = -(-self.total_steps // self.steps_per_epoch)
        self.schedule = self.task.build_schedule(self.total_steps)
        self.prepared = False
        # Named in every epoch's record: a run resumed on another machine has epochs of two speeds.
        self.cpu = process.cpu_class()
        self.chief = distribute.is_chief(self.strategy)
        self.output_dir = (
            config.model_dir if self.chief
            else os.path.join(config.model_dir, "workers", f"worker_{distribute.worker_id(self.strategy)}")
        )
        files.makedirs(self.output_dir)

    @property
    def model_config(self) -> sa_conv.ModelConfig:
        """The Task's resolved model configuration."""
        return self.task.model_config

    # ----------------------------------------------------------------------------- set-up

    def prepare(self, model: keras.Model | None = None) -> None:
        """Builds the model (or takes ``model``, built under the Trainer's strategy scope), the
        optimizer and the step functions."""
        self.install(model or self.build_model())
        pruning.check_gaussian_heads(self.model, self.config)
        self.prepared = True

    def build_model(self) -> keras.Model:
        """The Task's model, its variables placed by the strategy."""
        with self.strategy.scope():
            return self.task.build_model()

    def xla(self) -> bool:
        """The Task's XLA decision, off where the strategy's devices cannot run XLA."""
        if not self.task.use_xla():
            return False
        if not distribute.xla_runs_on(self.strategy):
            self.log("Note: XLA is off with several logical CPU replicas (--jit_compile ignored).")
            return False
        return True

    def install(self, model: keras.Model) -> None:
        """Makes ``model`` the one trained: a new optimizer for it, its checkpoint and the Task's
        steps on every replica (after a pruning changes the architecture, too)."""
        self.model = model
        with self.strategy.scope():
            self.optimizer = self.task.build_optimizer(model, self.schedule)
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.checkpoint = checkpoints.training_checkpoint(model, self.optimizer, self.epoch)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(self.output_dir, run_files.CHECKPOINTS), max_to_keep=self.config.keep_checkpoints)
        self.train_steps = distribute.replicated_train_steps(
            self.strategy, self.task.train_step(model, self.optimizer, jit_compile=self.xla()))
        self.eval_step = distribute.replicated_eval_step(self.strategy, self.task.eval_step(model))

    def evaluate(self, split: data_lib.Split) -> dict:
        """Loss and accuracy of the current model on ``split``."""
        return distribute.evaluate(self.strategy, self.eval_step, self.task.eval_dataset(split))

    @contextlib.contextmanager
    def averaged_weights(self):
        """Within it, the model holds the moving average of its weights (``--ema_momentum``,
        `Task.averaged_variables`), as validation and the saved models see it; after, the trained
        weights again. Without an average, or before the first step (Keras starts the average
        there), the model as it is."""
        optimizer = self._averaging_optimizer()
        if optimizer is None:
            yield
            return
        variables = self.task.averaged_variables(self.model)
        trained = [v.numpy() for v in variables]
        optimizer.finalize_variable_values(variables)
        try:
            yield
        finally:
            for variable, value in zip(variables, trained):
                variable.assign(value)

    def _averaging_optimizer(self):
        """The optimizer (inside any loss scaling) when it holds an average of the weights: with
        ``--ema_momentum``, after the first step; else None."""
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        return optimizer if optimizer.use_ema and int(optimizer.iterations.numpy()) else None

    # ----------------------------------------------------------------------------- loops

    def _run_epoch(self, epoch: int, step: int, callbacks) -> tuple[dict, int, float]:
        c = self.config
        steps = min(self.steps_per_epoch, self.total_steps - step)
        iterator = iter(distribute.distribute_dataset(self.strategy, self.task.train_dataset(epoch)))
        bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy", "lr"]) if self.interactive else None
        totals, done, start = np.zeros(3), 0, time.perf_counter()
        while done < steps:
            chunk = min(c.steps_per_execution, steps - done)
            # As Keras's fit: one call of the batch hooks per execution of --steps_per_execution steps.
            callbacks.on_train_batch_begin(done)
            totals += self.train_steps(iterator, tf.constant(chunk)).numpy()
            done += chunk
            if not np.isfinite(totals[0]):
                precision = self.task.precision
                also = "" if precision == "float32" else f", or train in float32 (this run: {precision})"
                raise TrainingError(
                    f"The training loss became {totals[0]} at step {step + done} (epoch {epoch + 1}). "
                    f"Lower --learning_rate or raise --warmup_ratio{also}."
                )
            callbacks.on_train_batch_end(done - 1, {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]})
            if bar is not None:
                lr = float(self.schedule(step + done - 1))
                bar.update(done, [("loss", totals[0] / totals[2]), ("accuracy", totals[1] / totals[2]), ("lr", lr)])
        seconds = time.perf_counter() - start
        metrics = {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}
        return metrics, step + done, seconds

    def restore(self) -> tuple[int, list]:
        """Restores the newest readable checkpoint (`checkpoints.restore_newest`), with the
        architecture it was written with. Returns the epochs done and their history. When none
        can be restored and the run that wrote them (its ``config.json``) had other model flags,
        ConfigError names those flags."""
        candidates = list(reversed(self.manager.checkpoints))
        if not candidates:
            return 0, []
        recorded = run_files.read_history(self.output_dir)
        config = run_files.read_config(self.output_dir)
        changed = [] if config is None else changed_model_flags(config, self.config)

        def restore(path):
            self._match_architecture(path, recorded)
            checkpoints.restore(self.checkpoint, path, self.log)

        # With other model flags, a checkpoint that does not restore is not damaged: its
        # "unreadable" warnings are shown only if an older one does restore.
        warnings = []
        try:
            latest = checkpoints.restore_newest(candidates, restore, self.manager.directory,
                                                warnings.append if changed else self.log)
        except TrainingError:
            if not changed:
                raise
            recorded_in = os.path.join(self.output_dir, run_files.CONFIG)
            raise ConfigError(
                f"The checkpoints in {self.manager.directory} were written by a run with other model flags: "
                f"{'; '.join(changed)}. To resume it, pass its flags (recorded in {recorded_in}); to train "
                "this model, start a new run with another --model_dir.") from None
        for line in warnings:
            self.log(line)
        epoch = int(self.epoch.numpy())
        history = [h for h in recorded if h["epoch"] <= epoch]
        self.log(f"Resuming from {latest}: {epoch} epoch(s), step {int(self.optimizer.iterations.numpy())} done.")
        others = sorted({h["cpu"] for h in history if h.get("cpu", self.cpu) != self.cpu})
        if others:
            self.log(f"Earlier epochs ran on {'; '.join(others)}, these on {self.cpu}: each epoch's record "
                     f"names its CPU class, so that timings of different classes are not mixed.")
        return epoch, history

    def _match_architecture(self, path: str, recorded: list) -> None:
        """Rebuilds the model with the head counts it had when checkpoint ``path`` was written, as
        recorded in the history by --prune_degenerate_heads."""
        current = heads_lib.heads_per_block(self.model)
        counts = checkpoints.recorded_head_counts(recorded, checkpoints.checkpoint_epoch(path)) \
            or [self.model_config.num_heads] * len(current)
        if counts == current:
            return
        with self.strategy.scope():  # the pruned copy's variables too
            model = heads_lib.prune_to(self.task.build_model(), counts)
        self.install(model)
        self.log(f"Checkpoint {path} holds a pruned model: heads per block {counts}.")

    def _write_config(self):
        c = self.config
        data_dir = files.absolute(os.path.expanduser(c.data_dir)) if c.data_dir else None  # gs:// kept
        resolved = {**c.to_dict(), "resolved_model": self.model_config.to_dict(),
                    "data_location": {"dataset": data_lib.get_source(c.dataset).absolute_name(), "data_dir": data_dir},
                    "replicas": self.replicas, "steps_per_epoch": self.steps_per_epoch,
                    "total_steps": self.total_steps,
                    "precision": {"policy": self.task.precision, "why": self.task.precision_reason},
                    "process": process.describe(self.task.precision)}
        run_files.write(self.output_dir, run_files.CONFIG, resolved)

    def train_epochs(self, start_epoch: int, history: list, callbacks=(), save=True) -> tuple[list, float]:
        """Trains epochs ``start_epoch .. total_epochs``, validating after each. Keras
        ``callbacks`` get every training hook as under ``model.fit`` (`keras.callbacks.CallbackList`):
        train, epoch, batch (once per ``--steps_per_execution`` steps, with the running ``loss``
        and ``accuracy``) and test (around validation) begin and end, epoch ends with ``loss``,
        ``accuracy``, ``val_loss`` and ``val_accuracy``; a callback that sets
        ``model.stop_training`` ends training at the end of that epoch (``fit`` also stops
        within one), which a rerun of the same run does not remember. With ``save``, writes the
        per-epoch artefacts (TensorBoard, best model, history, checkpoint). Returns the history
        and training seconds."""
        writers = self._summary_writers() if save else None
        callbacks = keras.callbacks.CallbackList(list(callbacks) + (self._callbacks() if save else []), model=self.model,
                                                 epochs=self.total_epochs, steps=self.steps_per_epoch, verbose=0)
        self.model.stop_training = False
        callbacks.on_train_begin()
        step = max(int(self.optimizer.iterations.numpy()), start_epoch * self.steps_per_epoch)
        self.optimizer.iterations.assign(step)
        train_seconds, logs = 0.0, None
        for epoch in range(start_epoch, self.total_epochs):
            if step >= self.total_steps or self.model.stop_training:
                break
            callbacks.on_epoch_begin(epoch)
            started = time.perf_counter()
            train_metrics, step, seconds = self._run_epoch(epoch, step, callbacks)
            train_seconds += seconds
            callbacks.on_test_begin()
            with self.averaged_weights():
                val_metrics = self.evaluate(self.task.val_split)
            callbacks.on_test_end({"loss": val_metrics["loss"], "accuracy": val_metrics["accuracy"]})
            record = {
                "epoch": epoch + 1, "step": step, "learning_rate": float(self.schedule(step - 1)),
                "train_seconds": seconds, "cpu": self.cpu,
                "train_loss": train_metrics["loss"], "train_accuracy": train_metrics["accuracy"],
                "val_loss": val_metrics["loss"], "val_accuracy": val_metrics["accuracy"],
            }
            best = max((h["val_accuracy"] for h in history), default=-1.0)
            history.append(record)
            # The epoch's own draws: a rerun after a kill re-initializes and prunes as this run does.
            with pruning.seeded_draws(self.config.seed * 100_003 + epoch):
                if self.config.reset_degenerate_heads:
                    pruning.reset_degenerate_heads(self.model, record, self.log)
                if self.config.prune_degenerate_heads:
                    self._prune_degenerate_heads(record)
                    callbacks.set_model(self.model)
            logs = {"loss": record["train_loss"], "accuracy": record["train_accuracy"],
                    "val_loss": record["val_loss"], "val_accuracy": record["val_accuracy"]}
            callbacks.on_epoch_end(epoch, logs)
            if save:
                self._write_summaries(writers, record)
                if self.chief and record["val_accuracy"] > best:
                    with self.averaged_weights():
                        checkpoints.save_keras_atomically(self.model, os.path.join(self.output_dir, run_files.BEST_MODEL))
                if self._snapshot_due(epoch + 1):
                    self._snapshot(epoch + 1)
                # The epoch's wall time: its steps, validation and artefacts (one checkpoint aside).
                record["epoch_seconds"] = time.perf_counter() - started
                run_files.write(self.output_dir, run_files.HISTORY, history)
                self.epoch.assign(epoch + 1)
                self.manager.save(checkpoint_number=epoch + 1)
            # Last: once its line is printed, the epoch is saved and a rerun resumes after it.
            self._log_epoch(record, seconds)
        callbacks.on_train_end(logs)
        return history, train_seconds

    def run(self) -> dict:
        """Prepares the Trainer if `prepare` has not, trains (or resumes) to the end, evaluates the
        test split once and writes the artefacts, all holding the output folder's lock
        (`trainers.files.held`): a second trainer started on it stops (`TrainingError`) before it
        writes anything (and, unprepared, before it builds its model), rather than interleave its
        files with this one's.

        Returns the results written to ``results.json``.
        """
        try:
            with files.held(self.output_dir, wait=False, what="training into"):
                return self._run()
        except files.Busy as busy:
            raise TrainingError(str(busy)) from None

    def _run(self) -> dict:
        wall_start = time.perf_counter()
        if not self.prepared:
            self.prepare()
        start_epoch, history = self.restore()  # first: it reads the config.json of the run it resumes
        self._write_config()
        resumed_from = start_epoch if start_epoch else None
        if self.config.init_from and not self.manager.checkpoints:
            checkpoints.init_from(self.model, self.config.init_from, self.log)
        if start_epoch == 0 and self._snapshot_due(0):
            self._snapshot(0)
        params = count_parameters(self.model)
        self.log(
            f"Training {self.config.model} ({params:,} parameters) on {len(self.task.train_split)} images "
            f"({len(self.task.val_split)} held out for validation), {self.replicas} replica(s), "
            f"{self.steps_per_epoch} steps/epoch, {self.total_steps} steps in all, "
            f"precision {self.task.precision} ({self.task.precision_reason})."
        )
        earlier_seconds = sum(h.get("train_seconds", 0.0) for h in history)
        history, seconds = self.train_epochs(start_epoch, history)
        return self._finish(history, resumed_from, earlier_seconds + seconds, wall_start)

    def _finish(self, history, resumed_from, train_seconds, wall_start) -> dict:
        params = count_parameters(self.model)  # after any --prune_degenerate_heads
        # From here the model is what the run delivers: with --ema_momentum, the average (as fit does).
        optimizer = self._averaging_optimizer()
        if optimizer is not None:
            optimizer.finalize_variable_values(self.task.averaged_variables(self.model))
        test = self.evaluate(self.task.test_split)
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
            "label_names": list(self.task.label_names),
            "weights_sha256": weights_checksum(self.model),
        }
        if self.chief:
            checkpoints.save_keras_atomically(self.model, os.path.join(self.output_dir, run_files.MODEL))
        # Last: a directory with results holds a finished run (`run_files.finished`).
        run_files.write(self.output_dir, run_files.RESULTS, results)
        self.log(
            f"Test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f}) after {results['steps']} "
            f"steps; results in {os.path.join(self.output_dir, run_files.RESULTS)}."
        )
        return results

    def _snapshot_due(self, epoch: int) -> bool:
        every = self.config.snapshot_every
        return bool(every) and self.chief and (epoch % every == 0 or epoch == self.total_epochs)

    def snapshot_path(self, epoch: int) -> str:
        """Where ``--snapshot_every`` keeps the model after ``epoch`` epochs (0: the start)."""
        return run_files.snapshot_path(self.output_dir, epoch)

    def _snapshot(self, epoch: int) -> None:
        # Written before the epoch's checkpoint: a run killed in between redoes the epoch and
        # writes the same snapshot again.
        files.makedirs(os.path.dirname(self.snapshot_path(epoch)))
        with self.averaged_weights():
            checkpoints.save_keras_atomically(self.model, self.snapshot_path(epoch))

    def _prune_degenerate_heads(self, record):
        found = pruning.heads_to_prune(self.model, self.log)
        record["pruned_heads"] = {str(k): v for k, v in found.items()}
        if found:
            old_model, old_optimizer = self.model, self.optimizer
            take = heads_lib.head_slicer(old_model, found)
            with self.strategy.scope():
                model = sa_conv.prune_heads(old_model, found)
            before = count_parameters(old_model)
            self.install(model)
            pruning.transfer_optimizer_state(old_optimizer, old_model, self.optimizer, take)
            self.log("Pruned degenerate heads (block: heads): "
                     + ", ".join(f"{k}: {v}" for k, v in found.items())
                     + f"; {before:,} -> {count_parameters(self.model):,} parameters.")
        record["num_heads"] = heads_lib.heads_per_block(self.model)
        record["parameters"] = count_parameters(self.model)

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

        callback = AttentionSummaries(self.task.images(self.task.val_split, 4), os.path.join(self.output_dir, "logs", "attention"), every)
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
    process.keep_freed_memory(trainer.task.keeps_freed_memory())
    # `run` builds the model under the output folder's lock: a trainer refused the folder stops
    # before spending the build's time (a large model's) or memory.
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
