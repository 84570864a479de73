"""Model files and checkpoints of a run: atomic ``.keras`` saves, ``--init_from``, the training
checkpoint (everything a resumed run needs to go on as the uninterrupted one) and restoring the
newest readable checkpoint (skipping damaged ones)."""

from __future__ import annotations


import keras
import numpy as np
import tensorflow as tf

import sa_conv
from sa_conv.errors import ConfigError, SaConvError
from trainers import files


class TrainingError(SaConvError):
    """Training cannot go on (e.g. the loss diverged); the message says what to change."""


def save_keras_atomically(model: keras.Model, path: str) -> None:
    """Saves ``model`` to ``path`` through a temporary file: a kill leaves the old file or the new."""
    tmp = f"{path}.tmp.keras"
    model.save(tmp)
    files.replace(tmp, path)


def init_from(model: keras.Model, path: str, log=print) -> None:
    """Sets every weight of ``model`` from the model saved at ``path`` (``--init_from``); an
    error names what differs when it is not the same architecture or normalization. A model of
    another input size is first moved to ``model``'s (`sa_conv.with_image_size`)."""
    if not files.exists(path):
        raise ConfigError(f"--init_from={path} does not exist.")
    try:
        source = keras.saving.load_model(path, compile=False)
    except Exception as exc:  # not a .keras archive, or one of unknown classes
        raise ConfigError(f"--init_from={path} cannot be read as a Keras model: {exc}") from None

    size, source_size = model.inputs[0].shape[1], source.inputs[0].shape[1]
    if source_size != size:  # another resolution: the offset tables follow the grid (sa_conv.with_image_size)
        blocks = sa_conv.attention_blocks(model)
        try:
            source = sa_conv.with_image_size(
                source, size, max_grid_size=blocks[0].attention.max_grid_size if blocks else None)
        except ValueError as exc:
            raise ConfigError(f"--init_from={path} takes {source_size}x{source_size} images: {exc}") from None
        log(f"--init_from={path} was trained on {source_size}x{source_size} images; this run's are {size}x{size}: "
            "offset-function encodings carry over as they are, learned offset tables are interpolated.")

    def weights(m):
        return [v for v in m.weights if "seed_generator" not in v.path]

    def normalization(m):
        layer = next((l for l in m.layers if isinstance(l, sa_conv.PixelNormalization)), None)
        return layer and (tuple(layer.mean), tuple(layer.std))

    mine, theirs = weights(model), weights(source)
    layout = [(v.path, tuple(v.shape)) for v in mine]
    other = [(v.path, tuple(v.shape)) for v in theirs]
    if layout != other:
        diff = [f"{a} vs {b}" for a, b in zip(layout, other) if a != b][:3]
        raise ConfigError(
            f"--init_from={path} holds a different architecture ({len(other)} weights against this run's "
            f"{len(layout)}; first differences: {'; '.join(diff) or 'missing weights'}). Use the flags "
            "(--model, --num_layers, ...) of the run or import that wrote it.")
    ours, its = normalization(model), normalization(source)
    if bool(ours) != bool(its) or (ours and not np.allclose(ours, its, rtol=1e-6, atol=0)):
        raise ConfigError(
            f"--init_from={path} normalizes with mean, std {its}; this run with {ours}. Set --pixel_statistics "
            "to match (reference for an imported reference model).")
    for variable, value in zip(mine, theirs):
        variable.assign(value)
    log(f"Initialized {len(mine)} weights from {path}.")


def seed_states(model: keras.Model) -> list:
    """The state variables of ``model``'s seed generators (each dropout layer's stream of masks):
    what ``model.variables`` holds beyond ``model.weights``. A ``tf.train.Checkpoint`` of the
    model alone leaves them out, as a `keras.random.SeedGenerator` is not a trackable object."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def training_checkpoint(model: keras.Model, optimizer, epoch) -> tf.train.Checkpoint:
    """The checkpoint of a run: ``model``, ``optimizer`` (its step and momentums), the ``epoch``
    counter and the model's `seed_states`: without those, a resumed run would draw the dropout
    masks of the run's first steps again instead of the uninterrupted run's next ones. The data
    order needs no state: each epoch's follows from the seed and the epoch alone."""
    return tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch, seed_states=seed_states(model))


def restore(checkpoint: tf.train.Checkpoint, path: str, log=print) -> None:
    """Restores a `training_checkpoint` from ``path``; raises when one of its objects has no value
    there (another architecture, a damaged file). A checkpoint of an earlier release has no seed
    states: the rest is restored, the seed generators keep their values and ``log`` says that the
    rest of the run draws other dropout masks than it would have without the interruption."""
    saved = {name.split("/", 1)[0] for name, _ in tf.train.list_variables(path)}
    if checkpoint.seed_states and "seed_states" not in saved:
        log(f"Note: {path} holds no dropout seed states (an earlier release wrote it): the resumed run "
            "draws other dropout masks than the uninterrupted run would have.")
        checkpoint = tf.train.Checkpoint(model=checkpoint.model, optimizer=checkpoint.optimizer,
                                         epoch=checkpoint.epoch)
    checkpoint.restore(path).assert_existing_objects_matched()


def checkpoint_epoch(path: str) -> int:
    """The epoch of checkpoint ``path`` (``.../ckpt-<epoch>``)."""
    return int(path.rsplit("-", 1)[1])


def recorded_head_counts(history: list, epoch: int):
    """The per-block head counts recorded in ``history`` (``--prune_degenerate_heads``) at or
    before ``epoch``, or None when no epoch recorded them."""
    return next((h["num_heads"] for h in reversed(history) if h["epoch"] <= epoch and "num_heads" in h), None)


def restore_newest(candidates: list, restore, directory: str, log=print) -> str:
    """Calls ``restore(path)`` on the checkpoints ``candidates`` (newest first) until one
    succeeds, and returns its path. An unreadable one (truncated, corrupted: ``restore`` raises)
    is reported and skipped; when none is readable, raises TrainingError naming ``directory``,
    deleting nothing."""
    for path in candidates:
        try:
            restore(path)
            return path
        except Exception as exc:  # a damaged file raises OpError, IndexError, ValueError, ...
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log(f"Warning: checkpoint {path} is unreadable ({first_line[:200]}); trying an older one.")
    raise TrainingError(
        f"None of the {len(candidates)} checkpoint(s) in {directory} can be read "
        "(truncated or corrupted files). Nothing was deleted: move that directory away to start "
        "over, or restore the files.")
