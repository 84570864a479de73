"""`make demo`: train a small self-attention model on CIFAR-10 for a few minutes on CPU,
evaluate it on the test split, export it and ask the reloaded SavedModel for one prediction
(``python -m programs.demo``).

Reads CIFAR-10 through tfds by default; ``--data_dir=PATH`` pointing at the official
python-format files reads those instead (``CIFAR10_DIR=PATH make demo``).
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import dataclasses
import os
from typing import Optional

import numpy as np

from export.export import export
from trainers import cli, run_files
from trainers import data as data_lib
from trainers.config import make_config
from trainers.train import train

_field = cli.config_field


@dataclasses.dataclass
class DemoConfig:
    output_dir: str = _field("demo_output", "Where the run's model_dir and the export go.")
    dataset: str = _field("cifar10", "Data source (see sa-conv-train --helpfull).")
    data_dir: Optional[str] = _field(None, "The official python-format directory/archive, or a tfds data_dir.")
    model: str = _field("sa_quadratic_small", "Model preset.")
    epochs: int = _field(4, "Training epochs.")
    max_steps: int = _field(160, "At most this many optimizer steps (keeps full CIFAR-10 to minutes).")


def demo(config: DemoConfig, log=print) -> dict:
    """Trains, evaluates, exports and returns the results (flag-free)."""
    model_dir = os.path.join(config.output_dir, config.model)
    train_config = make_config(overrides=dict(
        model=config.model, dataset=config.dataset, data_dir=config.data_dir, epochs=config.epochs,
        max_steps=config.max_steps, model_dir=model_dir, strategy="one_device",
    ))
    results = train(train_config, log=log)
    version_dir = export(model_dir=model_dir, export_dir=os.path.join(config.output_dir, "exported"), log=log)

    import tensorflow as tf

    served = tf.saved_model.load(version_dir).signatures["serving_default"]
    loaded = data_lib.load_dataset(config.dataset, config.data_dir)
    prediction = served(images=tf.constant(data_lib.head(loaded.test, 1)))
    name = prediction["class_names"].numpy()[0].decode()
    confidence = float(np.max(prediction["probabilities"].numpy()[0]))
    log(f"Test accuracy {results['test_accuracy']:.3f} (chance {1 / loaded.num_classes:.3f}) after "
        f"{results['steps']} steps, {results['images_per_second']:.0f} images/s, "
        f"{results['wall_time_seconds']:.0f} s. Model: {os.path.join(model_dir, run_files.MODEL)}")
    log(f"The reloaded SavedModel predicts test image 0 as {name!r} (p = {confidence:.2f}); its label is "
        f"{loaded.label_names[int(loaded.test.labels[0])]!r}.")
    results["export_dir"] = version_dir
    return results


def main():
    demo(cli.make(DemoConfig, cli.settings(DemoConfig)))


if __name__ == "__main__":
    cli.run("make demo", main, DemoConfig)
