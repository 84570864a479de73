"""CIFAR-10 input pipeline: sources, train/validation/test splits, augmentation, tf.data.

Three sources, selected by name (`DATASETS`):

* ``cifar10``: TensorFlow Datasets (``tfds.load``), from ``data_dir`` or tfds's default
  directory. When the data is not prepared there and the download host is unreachable, it fails
  at once with an error naming the offline option instead of hanging.
* ``cifar10_files``: the official CIFAR-10 *python* format read from disk: a
  ``cifar-10-batches-py/`` directory (or a directory containing one) or the
  ``cifar-10-python.tar.gz`` archive.
* ``synthetic``: generated class-dependent images, for smoke tests and benchmarks.

Every source yields uint8 images of shape ``(n, 32, 32, 3)`` and int64 labels in 0..9; images
stay uint8 through the pipeline and are normalized by the model's own preprocessing layer
(`sa_conv.preprocessing`), so that exported models take raw pixels.

The test split is only for the final evaluation: model selection uses the validation split that
`split_train_validation` carves out of the training data.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import tarfile
from typing import Sequence

import numpy as np
import tensorflow as tf

DATASETS = ("cifar10", "cifar10_files", "synthetic")
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
CIFAR10_LABEL_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
BATCHES_DIRNAME = "cifar-10-batches-py"
ARCHIVE_NAME = "cifar-10-python.tar.gz"
# The paper's augmentation: zero-pad by 4 pixels, random 32x32 crop, horizontal flip.
CROP_PADDING = 4
# Validation split when not given: 5,000 of CIFAR-10's 50,000 training images, i.e. 10%.
DEFAULT_VALIDATION_FRACTION = 0.1
OFFLINE_HINT = (
    "To train without internet, read the official python-format files instead: "
    "--dataset=cifar10_files --data_dir=PATH (a cifar-10-batches-py/ directory or "
    "cifar-10-python.tar.gz), e.g. CIFAR10_DIR=../shared/datasets/cifar10-mini make demo."
)


class DatasetError(ValueError):
    """Bad dataset input: names the file or setting and what to do about it."""


@dataclasses.dataclass(frozen=True)
class Split:
    """Images ``(n, 32, 32, 3)`` uint8 and labels ``(n,)`` int64."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclasses.dataclass(frozen=True)
class CifarData:
    """The official train and test splits and the class names."""

    train: Split
    test: Split
    label_names: tuple[str, ...] = CIFAR10_LABEL_NAMES


# --------------------------------------------------------------------------------------------
# Official python-format files.


def _resolve_batches_dir(path: str) -> str:
    if not os.path.exists(path):
        raise DatasetError(
            f"CIFAR-10 path {path!r} does not exist. Point --data_dir at a "
            f"{BATCHES_DIRNAME}/ directory, a directory containing one, or {ARCHIVE_NAME}."
        )
    if os.path.isdir(path):
        nested = os.path.join(path, BATCHES_DIRNAME)
        if os.path.isdir(nested):
            return nested
        return path
    raise DatasetError(
        f"CIFAR-10 path {path!r} is a file but not a .tar.gz archive; expected a "
        f"{BATCHES_DIRNAME}/ directory or {ARCHIVE_NAME}."
    )


def _unpickle(blob: bytes, name: str) -> dict:
    try:
        obj = pickle.loads(blob, encoding="bytes")
    except Exception as exc:  # pickle raises many types for corrupt input
        raise DatasetError(
            f"CIFAR-10 batch file {name!r} is truncated or corrupt ({type(exc).__name__}: "
            f"{exc}). Re-download or re-extract the dataset."
        ) from None
    if not isinstance(obj, dict):
        raise DatasetError(
            f"CIFAR-10 batch file {name!r} holds a {type(obj).__name__}, expected a dict with "
            "b'data' and b'labels'."
        )
    return obj


def _key(obj: dict, key: str):
    for candidate in (key.encode(), key):
        if candidate in obj:
            return obj[candidate]
    return None


def parse_batch(blob: bytes, name: str) -> Split:
    """Parses one official batch file (protocol-2 pickle) into a `Split`.

    Rows of 3,072 bytes hold 1,024 red, 1,024 green, then 1,024 blue values, row-major 32x32.
    """
    obj = _unpickle(blob, name)
    data, labels = _key(obj, "data"), _key(obj, "labels")
    if data is None or labels is None:
        raise DatasetError(
            f"CIFAR-10 batch file {name!r} lacks b'data' or b'labels' (keys: "
            f"{sorted(map(str, obj))})."
        )
    data = np.asarray(data)
    row = int(np.prod(IMAGE_SHAPE))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != row:
        raise DatasetError(
            f"CIFAR-10 batch file {name!r}: b'data' has shape {data.shape} and dtype "
            f"{data.dtype}; expected uint8 rows of {row} bytes (3 x 32 x 32)."
        )
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if labels.shape[0] != data.shape[0]:
        raise DatasetError(
            f"CIFAR-10 batch file {name!r}: {data.shape[0]} images but {labels.shape[0]} labels."
        )
    bad = labels[(labels < 0) | (labels >= NUM_CLASSES)]
    if bad.size:
        raise DatasetError(
            f"CIFAR-10 batch file {name!r}: labels must be in 0..{NUM_CLASSES - 1}, found "
            f"{sorted(set(bad.tolist()))[:5]}."
        )
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return Split(np.ascontiguousarray(images), labels)


def _concat(splits: Sequence[Split]) -> Split:
    return Split(
        np.concatenate([s.images for s in splits]), np.concatenate([s.labels for s in splits])
    )


def _label_names(meta: dict | None) -> tuple[str, ...]:
    if meta is None:
        return CIFAR10_LABEL_NAMES
    names = _key(meta, "label_names")
    if not names or len(names) != NUM_CLASSES:
        return CIFAR10_LABEL_NAMES
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def load_cifar10_files(path: str) -> CifarData:
    """Reads the official CIFAR-10 python format from a directory or a ``.tar.gz`` archive.

    Args:
      path: a ``cifar-10-batches-py/`` directory, a directory containing one, or the
        ``cifar-10-python.tar.gz`` archive.

    Returns:
      `CifarData` with the five training batches concatenated and the test batch.

    Raises:
      DatasetError: naming the file, for a missing path or batch file, a truncated or corrupt
        pickle, a wrong array size or labels outside 0..9.
    """
    if os.path.isfile(path) and path.endswith((".tar.gz", ".tgz")):
        return _load_archive(path)
    directory = _resolve_batches_dir(path)
    wanted = TRAIN_BATCHES + (TEST_BATCH,)
    missing = [n for n in wanted if not os.path.isfile(os.path.join(directory, n))]
    if missing:
        raise DatasetError(
            f"CIFAR-10 directory {directory!r} is missing batch file(s) {missing}; expected "
            f"{list(wanted)} in the official python format."
        )

    def read(name):
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()

    meta_path = os.path.join(directory, META_FILE)
    meta = _unpickle(read(META_FILE), meta_path) if os.path.isfile(meta_path) else None
    train = _concat([parse_batch(read(n), os.path.join(directory, n)) for n in TRAIN_BATCHES])
    test = parse_batch(read(TEST_BATCH), os.path.join(directory, TEST_BATCH))
    return CifarData(train, test, _label_names(meta))


def _load_archive(path: str) -> CifarData:
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = {os.path.basename(m.name): m for m in tar.getmembers() if m.isfile()}
            wanted = TRAIN_BATCHES + (TEST_BATCH,)
            missing = [n for n in wanted if n not in members]
            if missing:
                raise DatasetError(
                    f"CIFAR-10 archive {path!r} is missing batch file(s) {missing}."
                )

            def read(name):
                return tar.extractfile(members[name]).read()

            name = lambda n: f"{path}:{members[n].name}"  # noqa: E731
            meta = _unpickle(read(META_FILE), name(META_FILE)) if META_FILE in members else None
            train = _concat([parse_batch(read(n), name(n)) for n in TRAIN_BATCHES])
            test = parse_batch(read(TEST_BATCH), name(TEST_BATCH))
    except DatasetError:
        raise
    except Exception as exc:  # tarfile, gzip and zlib raise several types for a bad archive
        raise DatasetError(
            f"CIFAR-10 archive {path!r} cannot be read ({type(exc).__name__}: {exc}); it is "
            "truncated or not a gzip tar file."
        ) from None
    return CifarData(train, test, _label_names(meta))


def write_cifar10_files(directory: str, data: CifarData, archive: bool = False) -> str:
    """Writes `data` in the official python format (the inverse of `load_cifar10_files`).

    The training split is divided into five batches. Returns the path to read back: the
    ``cifar-10-batches-py`` directory, or the ``.tar.gz`` when ``archive`` is true.
    """
    batches_dir = os.path.join(directory, BATCHES_DIRNAME)
    os.makedirs(batches_dir, exist_ok=True)

    def dump(name, split):
        rows = split.images.transpose(0, 3, 1, 2).reshape(len(split), -1)
        blob = {b"batch_label": name.encode(), b"labels": split.labels.tolist(), b"data": rows}
        with open(os.path.join(batches_dir, name), "wb") as f:
            pickle.dump(blob, f, protocol=2)

    parts = np.array_split(np.arange(len(data.train)), len(TRAIN_BATCHES))
    for name, idx in zip(TRAIN_BATCHES, parts):
        dump(name, Split(data.train.images[idx], data.train.labels[idx]))
    dump(TEST_BATCH, data.test)
    with open(os.path.join(batches_dir, META_FILE), "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in data.label_names]}, f, protocol=2)
    if not archive:
        return batches_dir
    archive_path = os.path.join(directory, ARCHIVE_NAME)
    with tarfile.open(archive_path, "w:gz") as tar:
        tar.add(batches_dir, arcname=BATCHES_DIRNAME)
    return archive_path


# --------------------------------------------------------------------------------------------
# Synthetic data.


def make_synthetic(num_train: int = 1000, num_test: int = 200, seed: int = 0) -> CifarData:
    """Class-dependent random images: each class has its own colour and stripe orientation.

    A model can learn these (useful for smoke tests), but they are not CIFAR-10.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    class_colours = rng.uniform(40, 215, size=(NUM_CLASSES, 3)).astype(np.float32)
    angles = np.linspace(0, np.pi, NUM_CLASSES, endpoint=False)

    def split(n):
        labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
        stripes = np.stack([np.sin((np.cos(a) * xx + np.sin(a) * yy) * 0.8) for a in angles])
        images = class_colours[labels][:, None, None, :] + 30.0 * stripes[labels][..., None]
        images += rng.normal(0, 25, size=images.shape)
        return Split(np.clip(images, 0, 255).astype(np.uint8), labels)

    return CifarData(split(num_train), split(num_test))


# --------------------------------------------------------------------------------------------
# TensorFlow Datasets.

_TFDS_DOWNLOAD_HOST = ("www.cs.toronto.edu", 443)


def _host_reachable(host_port: tuple[str, int], timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(host_port, timeout=timeout):
            return True
    except OSError:
        return False


def load_tfds(data_dir: str | None = None, download: bool = True) -> CifarData:
    """Loads ``cifar10`` with TensorFlow Datasets.

    If the dataset is not prepared in ``data_dir`` and its download host cannot be reached,
    raises `DatasetError` at once (tfds itself would hang for minutes before failing offline).
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder("cifar10", data_dir=data_dir)
    if not _tfds_prepared(builder):
        if not download:
            raise DatasetError(
                f"tfds cifar10 is not prepared in {builder.data_dir!r} and download is off. "
                + OFFLINE_HINT
            )
        if not _host_reachable(_TFDS_DOWNLOAD_HOST):
            raise DatasetError(
                f"tfds cifar10 is not prepared in {builder.data_dir!r} and its download host "
                f"{_TFDS_DOWNLOAD_HOST[0]} cannot be reached (no internet?). " + OFFLINE_HINT
            )
    train, test = tfds.load(
        "cifar10",
        split=["train", "test"],
        data_dir=data_dir,
        as_supervised=True,
        download=download,
    )

    def to_split(ds):
        images, labels = [], []
        for x, y in tfds.as_numpy(ds.batch(4096)):
            images.append(x)
            labels.append(y)
        return Split(np.concatenate(images).astype(np.uint8), np.concatenate(labels).astype(np.int64))

    names = tuple(builder.info.features["label"].names) or CIFAR10_LABEL_NAMES
    return CifarData(to_split(train), to_split(test), names)


def _tfds_prepared(builder) -> bool:
    try:
        return bool(tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json")))
    except Exception:  # an unreadable data_dir counts as not prepared
        return False


# --------------------------------------------------------------------------------------------
# Selection, splitting, tf.data.


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0) -> CifarData:
    """Loads a dataset by name (see `DATASETS`)."""
    if name == "cifar10":
        return load_tfds(data_dir)
    if name == "cifar10_files":
        if not data_dir:
            raise DatasetError(
                "--dataset=cifar10_files needs --data_dir: the cifar-10-batches-py/ directory "
                "or cifar-10-python.tar.gz."
            )
        return load_cifar10_files(data_dir)
    if name == "synthetic":
        return make_synthetic(seed=seed)
    raise DatasetError(f"Unknown dataset {name!r}; choose one of {', '.join(DATASETS)}.")


def default_validation_size(num_train: int) -> int:
    """5,000 for CIFAR-10's 50,000 training images, proportionally less for small data."""
    return int(round(num_train * DEFAULT_VALIDATION_FRACTION))


def split_train_validation(
    train: Split, validation_size: int | None = None, seed: int = 0
) -> tuple[Split, Split]:
    """Carves a held-out validation split from the training data (never from the test split).

    A seeded permutation; the same seed gives the same split. ``validation_size=None`` uses
    `default_validation_size`.
    """
    n = len(train)
    size = default_validation_size(n) if validation_size is None else int(validation_size)
    if not 0 <= size < n:
        raise DatasetError(
            f"validation_size={size} must be in [0, {n}) for {n} training images."
        )
    order = np.random.default_rng(seed).permutation(n)
    val_idx, train_idx = np.sort(order[:size]), np.sort(order[size:])
    return (
        Split(train.images[train_idx], train.labels[train_idx]),
        Split(train.images[val_idx], train.labels[val_idx]),
    )


def augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """The paper's augmentation of one uint8 image ``(32, 32, 3)``, stateless and seeded.

    Zero-pads by `CROP_PADDING` pixels, takes a random 32x32 crop and flips horizontally with
    probability 1/2. ``seed`` is a shape-(2,) int tensor; the same seed gives the same output.
    """
    seeds = tf.random.experimental.stateless_split(seed, num=2)
    p = CROP_PADDING
    padded = tf.pad(image, [[p, p], [p, p], [0, 0]])
    cropped = tf.image.stateless_random_crop(padded, IMAGE_SHAPE, seed=seeds[0])
    return tf.image.stateless_random_flip_left_right(cropped, seed=seeds[1])


def make_dataset(
    split: Split,
    batch_size: int,
    training: bool,
    seed: int | None = 0,
    drop_remainder: bool | None = None,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of ``(images uint8 (batch, 32, 32, 3), labels int64 (batch,))``.

    Args:
      split: the images and labels.
      batch_size: the *global* batch size; under `tf.distribute` the strategy splits each batch
        into per-replica batches of ``batch_size / num_replicas``.
      training: shuffle (reshuffled every epoch) and augment, repeat is left to the caller.
      seed: makes shuffling and augmentation deterministic; None for nondeterministic.
      drop_remainder: defaults to ``training`` (equal batches for every replica and for XLA).
    """
    if batch_size <= 0:
        raise DatasetError(f"batch_size must be positive, got {batch_size}.")
    if len(split) == 0:
        raise DatasetError("Cannot build a dataset from an empty split.")
    drop_remainder = training if drop_remainder is None else drop_remainder
    if drop_remainder and len(split) < batch_size:
        raise DatasetError(
            f"The split has {len(split)} images, fewer than one batch of {batch_size}; lower "
            "the batch size."
        )
    ds = tf.data.Dataset.from_tensor_slices((split.images, split.labels))
    options = tf.data.Options()
    options.deterministic = seed is not None
    ds = ds.with_options(options)
    if training:
        ds = ds.shuffle(len(split), seed=seed, reshuffle_each_iteration=True)
        # One independent stateless seed per example, itself reshuffled every epoch.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            lambda pair, s: (augment(pair[0], s), pair[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=seed is not None,
        )
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


__all__ = [
    "CifarData",
    "DATASETS",
    "DatasetError",
    "Split",
    "augment",
    "default_validation_size",
    "load_cifar10_files",
    "load_dataset",
    "load_tfds",
    "make_dataset",
    "make_synthetic",
    "parse_batch",
    "split_train_validation",
    "write_cifar10_files",
]
