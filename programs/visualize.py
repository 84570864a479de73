"""``sa-conv-visualize`` (``python -m programs.visualize``): attention figures and locality
metrics of a trained model (see `sa_conv.plotting.visualize` for what is written), or with
``--augmented=N`` a grid of a run's first N training images as its ``--augmentation`` makes them."""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import dataclasses
import os
from typing import Optional

import keras
import numpy as np

import sa_conv
from sa_conv import heads, inspection, plotting
from sa_conv.errors import ConfigError
from trainers import cli, files, run_files
from trainers import data as data_lib

_field = cli.config_field


@dataclasses.dataclass
class VisualizeConfig:
    model_dir: Optional[str] = _field(None, "A trainer output directory (its model.keras).")
    model_path: Optional[str] = _field(None, "A .keras file (instead of --model_dir).")
    output_dir: str = _field("attention_figures", "Where the figures and locality.json go.")
    images: str = _field("0", "Comma-separated test-split indices or image files.")
    query_pixel: Optional[str] = _field(None, "row,col on the attention grid (default: the center).")
    dataset: Optional[str] = _field(None, "Dataset of the test indices (default: the run's, else cifar10).")
    data_dir: Optional[str] = _field(None, "Its data_dir (default: the run's).")
    augmented: int = _field(
        0, "Instead of attention figures, write augmented.png: the first N training images of the run in "
        "--model_dir (from its config.json, written when it starts) as its first epoch's augmentation makes "
        "them, with their labels (mixed ones as weights).")

    def validate(self):
        if self.augmented < 0:
            raise ConfigError(f"--augmented must be >= 0, got {self.augmented}.")
        if self.augmented and not self.model_dir:
            raise ConfigError("--augmented shows a run's augmentation: give its --model_dir.")
        if bool(self.model_dir) == bool(self.model_path):
            raise ConfigError("Give exactly one of --model_dir or --model_path.")
        self.query()

    def query(self):
        if not self.query_pixel:
            return None
        try:
            query = tuple(int(v) for v in self.query_pixel.split(","))
        except ValueError:
            query = ()
        if len(query) != 2:
            raise ConfigError(f"--query_pixel must be 'row,col', got {self.query_pixel!r}.")
        return query


def load_images(spec, dataset, data_dir, model_dir, image_shape):
    """``spec``: comma-separated test-split indices or image file paths; images are resized to
    ``image_shape`` ``(H, W, C)`` (test images as the evaluation pipeline does, `trainers.data.head`).
    Returns uint8 images and their names."""
    items = [s.strip() for s in (spec or "0").split(",") if s.strip()]
    if all(s.isdigit() for s in items):
        config = run_files.read_config(model_dir) if dataset is None and model_dir else None
        seed = 0
        if config is not None:  # the run's seed: a folder without test/ holds out its test images by it
            (dataset, recorded), seed = run_files.data_location(config), config.get("seed", 0)
            data_dir = data_dir or recorded
        size, channels = image_shape[0], image_shape[-1]
        loaded = data_lib.load_dataset(dataset or "cifar10", data_dir, seed=seed, image_size=size)
        test = loaded.test
        indices = [int(s) for s in items]
        bad = [i for i in indices if i >= len(test)]
        if bad:
            raise ConfigError(f"--images indices {bad} are outside the test split of {len(test)} images.")
        if loaded.image_shape[-1] != channels:
            raise ConfigError(f"--dataset images have {loaded.image_shape[-1]} channels; the model takes {channels}.")
        images = data_lib.head(test.subset(indices), len(indices), image_size=size)
        return images, [f"test image {i} ({loaded.label_names[int(test.labels[i])]})" for i in indices]
    import tensorflow as tf

    height, width, channels = image_shape
    images = []
    for path in items:
        if not os.path.isfile(path):
            raise ConfigError(f"--images: {path!r} is neither a test index nor an image file.")
        try:
            image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
        except tf.errors.InvalidArgumentError:
            raise ConfigError(f"--images: {path!r} is not a PNG, JPEG, GIF or BMP image.") from None
        images.append(tf.cast(tf.round(tf.image.resize(image, (height, width), antialias=True)), tf.uint8).numpy())
    return np.stack(images), items


def _save(fig, path):
    files.write_bytes(path, plotting.figure_png(fig))
    return path


def write_figures(model, images, output_dir, query=None, image_names=None, log=print) -> dict:
    """Writes the figures of `sa_conv.plotting` and the locality metrics for ``images`` (uint8
    ``(n, height, width, channels)``, the model's input size) to ``output_dir``; returns the
    written paths and the metrics."""
    os.makedirs(output_dir, exist_ok=True)
    grid, pooling = sa_conv.attention_grid(model)
    query = tuple(query) if query is not None else (grid[0] // 2, grid[1] // 2)
    inspection.query_index(query, grid)  # validates
    probabilities = plotting.model_attention(model, images)
    maps = np.stack([inspection.query_maps(p, grid, query) for p in probabilities], axis=1)  # (n, L, heads, H, W)
    written = []
    for i, image in enumerate(images):
        name = (image_names or [f"image {i}"] * len(images))[i]
        figure = plotting.attention_grid_figure(maps[i], query, image, pooling, title=f"{name}: attention of query {query}")
        written.append(_save(figure, os.path.join(output_dir, f"attention_image{i}.png")))
    figure = plotting.attention_grid_figure(maps.mean(0), query, None, pooling,
                                            title=f"attention of query {query}, mean over {len(images)} image(s)")
    written.append(_save(figure, os.path.join(output_dir, "attention_mean.png")))
    if plotting.has_centers(model):
        written.append(_save(plotting.centers_figure(model, query), os.path.join(output_dir, "centers.png")))
    metrics = [inspection.locality_metrics(p, grid, gates=g) for p, g in zip(probabilities, heads.head_gates(model))]
    files.write_json(os.path.join(output_dir, "locality.json"),
                     {"query_pixel": list(query), "grid": list(grid), "images": len(images), "layers": metrics})
    written.append(os.path.join(output_dir, "locality.json"))
    log(inspection.format_metrics(metrics))
    log("Wrote " + ", ".join(written))
    return {"paths": written, "metrics": metrics, "query": query}


def augmented_titles(labels, names) -> list[str]:
    """Each label's caption: its class (``labels`` ``(n,)`` class indices), or for mixed labels
    (``(n, classes)``, one-hot weights) its classes and weights, largest first."""
    labels = np.asarray(labels)
    if labels.ndim == 1:
        return [names[int(label)] for label in labels]
    return [" + ".join(f"{row[c]:.2f} {names[c]}" for c in np.argsort(-row) if row[c] > 1e-3) for row in labels]


def write_augmented(model_dir: str, count: int, output_dir: str, log=print) -> str:
    """Writes ``output_dir/augmented.png``: the first ``count`` training images of the run in
    ``model_dir`` (its recorded settings) as its first epoch's augmentation makes them."""
    from trainers.config import TrainConfig, make_config
    from trainers.task import Task

    recorded = run_files.read_config(model_dir)
    if recorded is None:
        raise ConfigError(f"{model_dir} has no {run_files.CONFIG}: start the run (its settings are written first).")
    names = set(cli.field_names(TrainConfig))
    dataset, data_dir = run_files.data_location(recorded)  # as recorded, from any directory
    settings = {k: v for k, v in recorded.items() if k in names}
    task = Task(make_config(overrides={**settings, "dataset": dataset, "data_dir": data_dir}), log=lambda line: None)
    images, labels = [], []
    for batch_images, batch_labels in task.train_dataset(0):
        images.extend(batch_images.numpy())
        labels.extend(batch_labels.numpy())
        if len(images) >= count:
            break
    figure = plotting.image_grid_figure(images[:count], augmented_titles(labels[:count], task.label_names),
                                        title=f"augmentation: {task.config.augmentation or 'none'}")
    path = _save(figure, os.path.join(output_dir, "augmented.png"))
    log(f"Wrote {path}")
    return path


def visualize_run(config: VisualizeConfig, log=print) -> dict:
    """Flag-free entry point: loads the model and images, writes the figures (or, with
    ``--augmented``, the grid of augmented training images)."""
    config.validate()
    if config.augmented:
        os.makedirs(config.output_dir, exist_ok=True)
        return {"paths": [write_augmented(config.model_dir, config.augmented, config.output_dir, log)]}
    path = config.model_path or os.path.join(config.model_dir, run_files.MODEL)
    if not os.path.isfile(path):
        raise ConfigError(f"{path!r} does not exist.")
    model = keras.models.load_model(path)
    images, names = load_images(config.images, config.dataset, config.data_dir, config.model_dir,
                                model.inputs[0].shape[1:])
    try:
        return write_figures(model, images, config.output_dir, config.query(), names, log=log)
    except ValueError as exc:  # a query outside the grid, a model without attention
        raise ConfigError(str(exc)) from None


def main():
    visualize_run(cli.make(VisualizeConfig, cli.settings(VisualizeConfig)))


def run():
    """Console script ``sa-conv-visualize``."""
    cli.run("sa-conv-visualize", main, VisualizeConfig)


if __name__ == "__main__":
    run()
