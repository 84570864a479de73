"""Datasets beyond CIFAR-10: the CIFAR-100 python format and any fixed-size tfds dataset train
end to end, with the image size, classes, names and normalization taken from the data."""

import json
import os

import epfml_reference
import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from trainers import data
from trainers.config import make_config
from trainers.train import train


def _tiny_run(tmp_path, **overrides):
    return make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16, epochs=1,
        global_batch_size=20, eval_batch_size=50, model_dir=str(tmp_path / "run"), strategy="one_device",
        validation_size=20, **overrides))


@pytest.fixture(scope="module")
def cifar100_dir(tmp_path_factory):
    generated = data.make_synthetic(num_train=200, num_test=40, seed=5, num_classes=100)
    return data.CIFAR100.write(str(tmp_path_factory.mktemp("c100")), generated), generated


def test_cifar100_format_round_trip_and_archive(cifar100_dir, tmp_path):
    path, written = cifar100_dir
    assert sorted(os.listdir(path)) == ["meta", "test", "train"]
    for source in (path, os.path.dirname(path), data.CIFAR100.write(str(tmp_path), written, archive=True)):
        loaded = data.load_dataset("cifar100", source)
        np.testing.assert_array_equal(loaded.train.images, written.train.images)
        np.testing.assert_array_equal(loaded.test.labels, written.test.labels)
        assert loaded.num_classes == 100 and loaded.label_names[99] == "class_99"
    with pytest.raises(data.DatasetError, match="labels must be in 0..99"):
        blob = __import__("pickle").dumps({b"data": np.zeros((1, 3072), np.uint8), b"fine_labels": [100]}, protocol=2)
        data.CIFAR100.parse_batch(blob, "x")


def test_cifar100_trains_end_to_end_with_statistics_from_the_data(cifar100_dir, tmp_path):
    path, written = cifar100_dir
    results = train(_tiny_run(tmp_path, dataset="cifar100", data_dir=path), log=lambda s: None)
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert model.output_shape == (None, 100)
    assert results["label_names"][:2] == ["class_0", "class_1"] and len(results["label_names"]) == 100
    mean, std = data.channel_statistics(written.train.images)
    normalize = model.get_layer("normalize")
    np.testing.assert_allclose(normalize.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(normalize.std, std, rtol=1e-6)
    assert abs(mean[0] - epfml_reference.PIXEL_MEAN[0]) > 1e-3  # not the reference's constants
    resolved = json.load(open(tmp_path / "run" / "config.json"))["resolved_model"]
    assert resolved["num_classes"] == 100 and resolved["pixel_std"] == pytest.approx(list(std))
    assert 0.0 <= results["test_accuracy"] <= 1.0 and results["steps"] == 9


def test_tfds_dataset_with_other_size_and_channels_trains_end_to_end(tmp_path, monkeypatch):
    """tfds:mnist (28x28x1, mocked offline): the model takes 28x28x1 pixels on a 14x14 grid,
    augmentation crops to 28x28, and the export serves that shape."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from export.export import export

    monkeypatch.setattr(data, "host_reachable", lambda *a, **k: True)
    with tfds.testing.mock_data(num_examples=60):
        loaded = data.load_dataset("tfds:mnist")
        assert loaded.image_shape == (28, 28, 1) and loaded.num_classes == 10
        # float32: the served copy is compared with the model at float32's tolerance.
        results = train(_tiny_run(tmp_path, dataset="tfds:mnist", mixed_precision="float32"), log=lambda s: None)
    assert results["model_config"]["image_size"] == 28 and results["model_config"]["image_channels"] == 1
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert model.input_shape == (None, 28, 28, 1)
    assert sa_conv.attention_grid(model) == ((14, 14), 2)
    augmented = data.augment(tf.constant(loaded.train.images[0]), tf.constant([1, 2]))
    assert augmented.shape == (28, 28, 1)
    version = export(model_dir=str(tmp_path / "run"), export_dir=str(tmp_path / "exported"), log=lambda s: None)
    served = tf.saved_model.load(version).signatures["serving_default"]
    probabilities = served(images=tf.constant(loaded.test.images[:3]))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, ops.convert_to_numpy(ops.softmax(model(loaded.test.images[:3]))),
                               atol=1e-5)


def test_tfds_images_of_varying_size_need_and_take_image_size(monkeypatch):
    """tfds:caltech101 (mocked offline: images of random sizes, e.g. 43x33 and 7x38) is refused
    without --image_size, with the fix named, and loads at that size with it, each image the
    center crop of its resize (`resize_and_crop`)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    monkeypatch.setattr(data, "host_reachable", lambda *a, **k: True)
    with tfds.testing.mock_data(num_examples=12):
        with pytest.raises(data.DatasetError, match=r"\(None, None, 3\): their size varies. Pass --image_size=N"):
            data.load_dataset("tfds:caltech101")
        loaded = data.load_dataset("tfds:caltech101", image_size=24)
        originals = [x for x, _ in tfds.as_numpy(tfds.load("caltech101", split="train", as_supervised=True))]
    assert len({x.shape for x in originals}) > 1  # the mock's sizes do vary
    assert loaded.train.images.shape == (12, 24, 24, 3) and loaded.test.images.shape[1:] == (24, 24, 3)
    assert loaded.model_fields()["image_size"] == 24
    expected = np.stack([data.resize_and_crop(tf.constant(x), 24).numpy() for x in originals])
    np.testing.assert_array_equal(loaded.train.images, expected.astype(np.uint8))


def test_tfds_errors_name_the_problem():
    with pytest.raises(data.DatasetError, match="tfds has no dataset 'no_such_set'"):
        data.load_dataset("tfds:no_such_set")
    with pytest.raises(data.DatasetError, match="Unknown dataset 'tfds:'"):
        data.load_dataset("tfds:")


def test_non_square_images_are_refused_with_the_fix():
    rect = data.ImageData(data.Split(np.zeros((4, 8, 6, 3), np.uint8), np.zeros(4, np.int64)),
                          data.Split(np.zeros((2, 8, 6, 3), np.uint8), np.zeros(2, np.int64)))
    with pytest.raises(data.DatasetError, match="8x6.*square"):
        rect.model_fields()


def test_cifar_source_with_missing_data_dir_says_so():
    with pytest.raises(data.DatasetError, match="--data_dir '/nonexistent' does not exist"):
        data.load_dataset("cifar100", "/nonexistent")
