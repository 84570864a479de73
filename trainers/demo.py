"""`make demo`: train a small self-attention model on CIFAR-10 for a few minutes on CPU,
evaluate it on the test split and write the results (``python -m trainers.demo``).

Reads CIFAR-10 through tfds by default; ``--dataset=cifar10_files --data_dir=PATH`` reads the
official python-format files instead (``CIFAR10_DIR=PATH make demo``).
"""

import json
import os
import sys

import numpy as np
from absl import app, flags

from trainers import data as data_lib
from trainers.config import ConfigError, make_config
from trainers.train import TrainingError, train

flags.DEFINE_string("output_dir", "demo_output", "Where the run's model_dir goes.")
flags.DEFINE_enum("dataset", "cifar10", list(data_lib.DATASETS), "Data source.")
flags.DEFINE_string("data_dir", None, "tfds data_dir, or the CIFAR-10 python-format directory/archive.")
flags.DEFINE_string("model", "sa_quadratic_small", "Model preset.")
flags.DEFINE_integer("epochs", 5, "Training epochs.")
flags.DEFINE_integer("max_steps", 250, "At most this many optimizer steps (keeps full CIFAR-10 to minutes).")
FLAGS = flags.FLAGS


def demo(output_dir, dataset, data_dir, model, epochs, max_steps) -> dict:
    """Trains, evaluates and returns the results (flag-free)."""
    model_dir = os.path.join(output_dir, model)
    config = make_config(overrides=dict(
        model=model, dataset=dataset, data_dir=data_dir, epochs=epochs, max_steps=max_steps,
        model_dir=model_dir, strategy="one_device",
    ))
    results = train(config)
    summary = {k: results[k] for k in ("preset", "parameters", "steps", "val_accuracy", "test_accuracy",
                                       "images_per_second", "wall_time_seconds")}
    print(json.dumps(summary, indent=2))
    print(f"Test accuracy {results['test_accuracy']:.3f} (chance 0.100). "
          f"Model: {os.path.join(model_dir, 'model.keras')}")

    import tensorflow as tf

    from export.export import export

    version_dir = export(model_dir=model_dir, export_dir=os.path.join(output_dir, "exported"))
    served = tf.saved_model.load(version_dir).signatures["serving_default"]
    loaded = data_lib.load_dataset(dataset, data_dir)
    test = loaded.test
    prediction = served(images=tf.constant(test.images[:1]))
    name = prediction["class_names"].numpy()[0].decode()
    confidence = float(np.max(prediction["probabilities"].numpy()[0]))
    print(f"SavedModel: {version_dir}")
    print(f"Reloaded SavedModel predicts test image 0 as {name!r} (p = {confidence:.2f}); "
          f"its label is {loaded.label_names[int(test.labels[0])]!r}.")
    results["export_dir"] = version_dir
    return results


def main(argv):
    del argv
    try:
        demo(FLAGS.output_dir, FLAGS.dataset, FLAGS.data_dir, FLAGS.model, FLAGS.epochs, FLAGS.max_steps)
    except (ConfigError, data_lib.DatasetError, TrainingError) as exc:
        print(f"make demo: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    app.run(main)
