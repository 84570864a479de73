"""Input pipeline: loaders, bad input, splits, augmentation and determinism."""

import os
import pickle
import shutil
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from trainers import data


def _batch_path(tiny_cifar, name):
    return os.path.join(tiny_cifar[0], name)


# ------------------------------------------------------------------------------ loaders


def test_round_trip_of_written_files(tiny_cifar):
    path, written = tiny_cifar
    loaded = data.load_cifar10_files(path)
    np.testing.assert_array_equal(loaded.train.images, written.train.images)
    np.testing.assert_array_equal(loaded.train.labels, written.train.labels)
    np.testing.assert_array_equal(loaded.test.images, written.test.images)
    assert loaded.train.images.dtype == np.uint8 and loaded.train.images.shape == (250, 32, 32, 3)
    assert loaded.label_names == data.CIFAR10_LABEL_NAMES


def test_parent_directory_and_archive_read_the_same(tiny_cifar, tmp_path):
    path, written = tiny_cifar
    from_parent = data.load_cifar10_files(os.path.dirname(path))
    archive = data.write_cifar10_files(str(tmp_path), written, archive=True)
    from_archive = data.load_cifar10_files(archive)
    for loaded in (from_parent, from_archive):
        np.testing.assert_array_equal(loaded.train.images, written.train.images)
        np.testing.assert_array_equal(loaded.test.labels, written.test.labels)


@pytest.mark.parametrize("layout, chosen", [
    ("archive", "archive"),  # the download folder before extraction
    ("partial_subfolder+archive", "archive"),  # an extraction interrupted beside the archive
    ("partial_subfolder_with_test_batch+archive", "archive"),
    ("partial_subfolder+flat", "flat"),  # the batch files beside an empty or partial subfolder
])
def test_a_directory_is_read_from_its_first_complete_candidate(tiny_cifar, tmp_path, layout, chosen):
    """`find` sends such a directory to the file reader (not tfds); `locate` reads it from the
    first complete place: the batches subfolder, the directory itself, then the archive."""
    source, written = tiny_cifar
    download = tmp_path / "download"
    download.mkdir()
    archive = str(download / data.CIFAR10.archive)
    os.replace(data.write_cifar10_files(str(tmp_path / "written"), written, archive=True), archive)
    if layout == "partial_subfolder+archive" or layout == "partial_subfolder+flat":
        (download / data.CIFAR10.dirname).mkdir()
        shutil.copy(os.path.join(source, "data_batch_1"), download / data.CIFAR10.dirname)
    if layout == "partial_subfolder_with_test_batch+archive":
        (download / data.CIFAR10.dirname).mkdir()
        shutil.copy(os.path.join(source, "test_batch"), download / data.CIFAR10.dirname)
    if layout == "partial_subfolder+flat":
        os.remove(archive)
        for name in os.listdir(source):
            shutil.copy(os.path.join(source, name), download)
    assert data.CIFAR10.find(str(download)) is not None  # the file reader's, not tfds'
    assert data.CIFAR10.locate(str(download)) == {"archive": archive, "flat": str(download)}[chosen]
    for loaded in (data.load_cifar10_files(str(download)), data.load_dataset("cifar10", str(download))):
        np.testing.assert_array_equal(loaded.test.images, written.test.images)
        np.testing.assert_array_equal(loaded.train.labels, written.train.labels)


def test_a_partial_directory_without_an_alternative_names_what_it_lacks(tiny_cifar, tmp_path):
    (tmp_path / data.CIFAR10.dirname).mkdir()
    shutil.copy(os.path.join(tiny_cifar[0], "test_batch"), tmp_path / data.CIFAR10.dirname)
    with pytest.raises(data.DatasetError, match=r"cifar-10-batches-py' is missing batch file\(s\) \['data_batch_1', "
                                                r"'data_batch_2', 'data_batch_3', 'data_batch_4', 'data_batch_5'\].*"
                                                r"or cifar-10-python.tar.gz beside them"):
        data.load_cifar10_files(str(tmp_path))


def test_channel_layout_is_planar_rgb(tmp_path):
    """Row layout: 1,024 red, then green, then blue, each row-major 32x32."""
    row = np.zeros((1, 3072), np.uint8)
    row[0, 0] = 10  # red at (0, 0)
    row[0, 1024 + 33] = 20  # green at (1, 1)
    row[0, 2048 + 32 * 31] = 30  # blue at (31, 0)
    blob = pickle.dumps({b"data": row, b"labels": [7]}, protocol=2)
    split = data.parse_batch(blob, "x")
    assert split.images[0, 0, 0, 0] == 10
    assert split.images[0, 1, 1, 1] == 20
    assert split.images[0, 31, 0, 2] == 30
    assert split.images.sum() == 60 and split.labels.tolist() == [7]


def test_real_cifar10_mini(cifar10_mini_dir):
    loaded = data.load_cifar10_files(cifar10_mini_dir)
    assert len(loaded.train) == 4170 and len(loaded.test) == 1000
    assert set(np.unique(loaded.train.labels)) == set(range(10))
    assert loaded.label_names[0] == "airplane" and loaded.label_names[9] == "truck"
    # Real photographs: varied pixels, not constant images.
    assert loaded.train.images[:100].std() > 40


# ------------------------------------------------------------------------------ bad input


def test_missing_directory():
    with pytest.raises(data.DatasetError, match="does not exist"):
        data.load_cifar10_files("/nonexistent/cifar")


def test_missing_batch_file(tiny_cifar, tmp_path):
    path, written = tiny_cifar
    out = data.write_cifar10_files(str(tmp_path), written)
    os.remove(os.path.join(out, "data_batch_3"))
    with pytest.raises(data.DatasetError, match="missing batch file.*data_batch_3"):
        data.load_cifar10_files(out)


def test_truncated_pickle(tiny_cifar, tmp_path):
    out = data.write_cifar10_files(str(tmp_path), tiny_cifar[1])
    target = os.path.join(out, "data_batch_2")
    blob = open(target, "rb").read()
    open(target, "wb").write(blob[: len(blob) // 2])
    with pytest.raises(data.DatasetError, match="data_batch_2.*truncated or corrupt"):
        data.load_cifar10_files(out)


def test_wrong_array_size():
    blob = pickle.dumps({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}, protocol=2)
    with pytest.raises(data.DatasetError, match="shape \\(2, 3000\\).*3072"):
        data.parse_batch(blob, "data_batch_1")


def test_labels_out_of_range():
    blob = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}, protocol=2)
    with pytest.raises(data.DatasetError, match="0..9.*10"):
        data.parse_batch(blob, "data_batch_1")


def test_label_count_mismatch():
    blob = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3]}, protocol=2)
    with pytest.raises(data.DatasetError, match="2 images but 1 labels"):
        data.parse_batch(blob, "b")


def test_corrupt_archive(tmp_path):
    bad = tmp_path / "cifar-10-python.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(data.DatasetError, match="cannot be read"):
        data.load_cifar10_files(str(bad))


def test_archive_missing_batch(tiny_cifar, tmp_path):
    path = tiny_cifar[0]
    archive = tmp_path / "partial.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(os.path.join(path, "data_batch_1"), arcname="cifar-10-batches-py/data_batch_1")
    with pytest.raises(data.DatasetError, match="missing batch file"):
        data.load_cifar10_files(str(archive))


def test_unknown_dataset_and_missing_data_dir():
    with pytest.raises(data.DatasetError, match="Unknown dataset 'mnist'.*cifar10_files"):
        data.load_dataset("mnist")
    with pytest.raises(data.DatasetError, match="needs --data_dir"):
        data.load_dataset("cifar10_files", None)


# ------------------------------------------------------------------------------ tfds


def test_tfds_offline_fails_fast_with_the_offline_option(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "host_reachable", lambda *a, **k: False)
    with pytest.raises(data.DatasetError, match="--dataset=cifar10 --data_dir=PATH"):
        data.load_tfds(data_dir=str(tmp_path))


def test_host_probe_is_false_for_a_closed_port():
    import socket

    with socket.socket() as s:  # bound by the OS and held, not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        assert data.host_reachable(s.getsockname(), timeout=1.0) is False


def test_tfds_code_path_with_mock_data(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    monkeypatch.setattr(data, "host_reachable", lambda *a, **k: True)
    with tfds.testing.mock_data(num_examples=12):
        loaded = data.load_tfds(data_dir=str(tmp_path))
    assert loaded.train.images.shape == (12, 32, 32, 3) and loaded.train.images.dtype == np.uint8
    assert loaded.train.labels.dtype == np.int64
    assert loaded.train.labels.min() >= 0 and loaded.train.labels.max() <= 9
    assert len(loaded.label_names) == 10


# ------------------------------------------------------------------------------ splits


def test_validation_split_is_disjoint_and_seeded(tiny_cifar):
    train = tiny_cifar[1].train
    tr, val = data.split_train_validation(train, seed=1)
    assert len(val) == data.default_validation_size(250) == 25 and len(tr) == 225
    # Disjoint and complete: every image lands in exactly one split.
    both = np.concatenate([tr.images, val.images]).reshape(250, -1)
    assert len({row.tobytes() for row in both}) == len({r.tobytes() for r in train.images.reshape(250, -1)})
    tr2, val2 = data.split_train_validation(train, seed=1)
    np.testing.assert_array_equal(val.labels, val2.labels)
    _, val3 = data.split_train_validation(train, seed=2)
    assert not np.array_equal(val.images, val3.images)
    assert data.default_validation_size(50_000) == 5000


def test_bad_validation_size(tiny_cifar):
    with pytest.raises(data.DatasetError, match="validation_size=250"):
        data.split_train_validation(tiny_cifar[1].train, validation_size=250)


def test_subsets_are_stratified_and_nested():
    labels = np.repeat(np.arange(5), [10, 20, 30, 40, 50])
    small, large = data.stratified_subset(labels, 0.1, 7), data.stratified_subset(labels, 0.3, 7)
    assert np.bincount(labels[small]).tolist() == [1, 2, 3, 4, 5] and set(small) <= set(large)  # nested
    assert np.bincount(labels[large]).tolist() == [3, 6, 9, 12, 15] and np.array_equal(small, data.stratified_subset(
        labels, 0.1, 7)) and not np.array_equal(small, data.stratified_subset(labels, 0.1, 8))
    assert np.bincount(labels[data.stratified_subset(labels, 0.01, 7)]).tolist() == [1] * 5  # at least one a class


# ------------------------------------------------------------------------------ augmentation


def _image():
    """No zero pixel; channel 0 increases along columns, channel 1 along rows."""
    rows, cols = np.mgrid[0:32, 0:32]
    return np.stack([1 + 7 * cols, 1 + 7 * rows, np.full_like(rows, 9)], -1).astype(np.uint8)


def test_augment_crop_stays_within_padding_and_keeps_dtype():
    image = _image()  # no zero pixel, so zeros can only come from padding
    for i in range(40):
        out = data.augment(tf.constant(image), tf.constant([i, 7], tf.int64)).numpy()
        assert out.shape == (32, 32, 3) and out.dtype == np.uint8
        nonzero_rows = np.where(out.any(axis=(1, 2)))[0]
        nonzero_cols = np.where(out.any(axis=(0, 2)))[0]
        # At most 4 zero rows/columns of padding on a side, the rest a contiguous window.
        assert len(nonzero_rows) >= 28 and len(nonzero_cols) >= 28
        # The content is a shifted (and maybe flipped) window of the original.
        rows, cols = nonzero_rows, nonzero_cols
        window = out[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1]
        found = False
        for candidate in (window, window[:, ::-1]):
            h, w = candidate.shape[:2]
            for dy in range(0, 33 - h):
                for dx in range(0, 33 - w):
                    if np.array_equal(image[dy: dy + h, dx: dx + w], candidate):
                        found = True
        assert found


def test_flip_really_flips():
    image = _image()
    flipped = 0
    for i in range(40):
        out = data.augment(tf.constant(image), tf.constant([i, 11], tf.int64)).numpy()
        inner = out[4:28, 4:28]
        # Columns of the original increase left to right; a flip reverses that order.
        col = out[16, :, 0].astype(int)
        col = col[col > 0]
        if np.all(np.diff(col) < 0):
            flipped += 1
        else:
            assert np.all(np.diff(col) > 0)
        assert inner.any()
    assert 8 <= flipped <= 32  # about half of 40


def test_augmentation_is_deterministic_with_a_seed():
    image = tf.constant(_image())
    seed = tf.constant([5, 6], tf.int64)
    np.testing.assert_array_equal(data.augment(image, seed), data.augment(image, seed))


def test_make_dataset_batches_and_determinism(tiny_cifar):
    train = tiny_cifar[1].train

    def first_two_epochs(seed):
        ds = data.make_dataset(train, batch_size=32, training=True, seed=seed)
        return [[(x.numpy(), y.numpy()) for x, y in ds] for _ in range(2)]

    a, b = first_two_epochs(4), first_two_epochs(4)
    assert len(a[0]) == 250 // 32  # drop_remainder for training
    x, y = a[0][0]
    assert x.shape == (32, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    for ea, eb in zip(a, b):
        for (xa, ya), (xb, yb) in zip(ea, eb):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    # Epochs differ (reshuffled, re-augmented), and another seed differs.
    assert not np.array_equal(a[0][0][0], a[1][0][0])
    assert not np.array_equal(a[0][0][0], first_two_epochs(5)[0][0][0])


def test_pipelines_run_without_the_autotuning_model_and_yield_what_they_yield_with_it(tiny_cifar, monkeypatch):
    train = tiny_cifar[1].train

    def epochs(seed):
        ds = data.make_dataset(train, batch_size=32, training=True, seed=seed)
        return ds, [np.concatenate([x.numpy() for x, _ in ds]) for _ in range(2)]

    without, batches = epochs(3)
    evaluation = data.make_dataset(tiny_cifar[1].test, batch_size=16, training=False)
    assert not without.options().autotune.enabled and not evaluation.options().autotune.enabled
    monkeypatch.setattr(data, "TF_DATA_AUTOTUNE", True)
    with_model, tuned = epochs(3)
    assert with_model.options().autotune.enabled
    for a, b in zip(batches, tuned):
        np.testing.assert_array_equal(a, b)


def test_evaluation_dataset_is_unaugmented_and_complete(tiny_cifar):
    test = tiny_cifar[1].test
    ds = data.make_dataset(test, batch_size=16, training=False)
    images = np.concatenate([x.numpy() for x, _ in ds])
    np.testing.assert_array_equal(images, test.images)


def test_bad_batch_sizes(tiny_cifar):
    with pytest.raises(data.DatasetError, match="positive"):
        data.make_dataset(tiny_cifar[1].test, batch_size=0, training=False)
    with pytest.raises(data.DatasetError, match="fewer than one batch"):
        data.make_dataset(tiny_cifar[1].test, batch_size=64, training=True)


def test_synthetic_is_class_dependent():
    synthetic = data.make_synthetic(num_train=500, num_test=10, seed=0)
    means = np.stack([synthetic.train.images[synthetic.train.labels == c].mean(axis=(0, 1, 2))
                      for c in range(10)])
    # Class colours differ by far more than the noise in the class means.
    assert np.ptp(means, axis=0).max() > 50


def test_shapes_draws_each_class_where_it_says_the_same_for_every_seed():
    shapes = data.load_dataset("shapes", seed=3)
    assert shapes.label_names == data.SHAPE_CLASSES and (len(shapes.train), len(shapes.test)) == (300, 200)
    assert np.bincount(shapes.test.labels).tolist() == [40] * 5 and shapes.train.images.dtype == np.uint8
    np.testing.assert_array_equal(shapes.train.images, data.load_dataset("shapes", seed=4).train.images)
    assert shapes.train.images.shape[1:] == (32, 32, 3) and shapes.train.images[0].std() > 10
    rng = np.random.default_rng(0)  # a filled square or circle covers its centre, a ring leaves it empty
    for kind, centre_covered in (("square", True), ("circle", True), ("ring", False)):
        canvas = np.zeros((32, 32, 3))
        data.draw_shape(canvas, kind, np.random.default_rng(rng.integers(1 << 30)))
        ys, xs = np.nonzero(canvas.any(axis=-1))
        assert 10 < len(ys) < 32 * 32 / 2 and canvas[round(ys.mean()), round(xs.mean())].any() == centre_covered, kind
