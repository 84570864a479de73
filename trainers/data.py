"""Image-classification data: sources, train/validation/test splits, augmentation, tf.data.

Sources are selected by name (`get_source`; `DATASETS` lists the fixed names):

* ``cifar10``, ``cifar100``: the official *python* format when ``data_dir`` points at it (a
  ``cifar-10-batches-py/`` or ``cifar-100-python/`` directory, a directory containing one, or
  the ``.tar.gz`` archive), else TensorFlow Datasets from ``data_dir`` (or tfds's default
  directory). When tfds has not prepared the data and its download host is unreachable, the
  load fails at once with an error naming the offline option instead of hanging.
* ``cifar10_files``, ``cifar100_files``: the official python format only.
* ``tfds:NAME``: any TensorFlow Datasets image-classification dataset with a fixed image size
  (e.g. ``tfds:svhn_cropped``), read with ``as_supervised=True``.
* ``synthetic``: generated class-dependent 32x32 images, for smoke tests and benchmarks.
* ``shapes``: generated 32x32 images of five shapes on noisy backgrounds (`make_shapes`): a small
  task a model solves by looking locally.

Reading files needs only numpy (TensorFlow is imported by the tf.data and tfds functions).
Every source yields uint8 images ``(n, H, W, C)`` and int64 labels in ``0..classes-1``, with
the class names: `ImageData`. Images stay uint8 through the pipeline; the model normalizes them
with statistics computed once from the training split (`ImageData.model_fields`), so exported
models take raw pixels.

**Untrusted files.** The official python format is a pickle. `safe_unpickle` admits only what
the official files contain (dicts, lists, strings, bytes, ints and numpy arrays) and refuses
any other global before it runs; files and archive members above `MAX_FILE_BYTES` are refused
before they are read.

The test split is only for the final evaluation: model selection uses the data's own validation
split (a folder's ``validation/``), else the one `split_train_validation` carves out of the
training data.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
import pickletools
import socket
import tarfile
import urllib.parse
from typing import Sequence

import numpy as np

from trainers import image_files
from sa_conv.errors import DatasetError
from trainers.image_files import FileSplit

# The paper's augmentation: zero-pad by 4 pixels, random crop to the image size, horizontal flip.
CROP_PADDING = 4
# Validation split when not given: 5,000 of CIFAR-10's 50,000 training images, i.e. 10%.
DEFAULT_VALIDATION_FRACTION = 0.1
# The largest official file is CIFAR-100's `train` (155 MB); anything far larger is refused.
MAX_FILE_BYTES = 200 * 2**20
# tf.data's autotuning model for the pipelines of `make_dataset`. Off: the trainer makes one
# iterator per epoch (a resumed epoch sees the data the lost one did), and deleting an iterator
# whose pipeline runs the model waits for the model's thread to wake from its optimization period,
# which doubles on every wake and so grows over an epoch (benchmarks/epoch_overhead.py,
# benchmarks/iterator_deletion.py). tf.distribute's per-device iterator runs the model whatever
# this says (`trainers.distribute.distribute_dataset`). Without the model, ``AUTOTUNE``
# parallelism stays tf.data's initial one (the cores, at most 16); what the pipeline yields does
# not change.
TF_DATA_AUTOTUNE = False
CIFAR10_LABEL_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
OFFLINE_HINT = (
    "To train without internet, read the official python-format files instead: "
    "--dataset=cifar10 --data_dir=PATH (a cifar-10-batches-py/ directory or "
    "cifar-10-python.tar.gz; likewise cifar100), e.g. CIFAR10_DIR=../shared/datasets/cifar10-mini make demo."
)


@dataclasses.dataclass(frozen=True)
class Split:
    """Images ``(n, H, W, C)`` uint8 and labels ``(n,)`` int64."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices) -> "Split":
        return Split(self.images[indices], self.labels[indices])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.images.shape[1:])

    @property
    def statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std in ``[0, 1]`` of the images (`channel_statistics`)."""
        return channel_statistics(self.images)


def channel_statistics(images: np.ndarray, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 ``images`` scaled to ``[0, 1]``, summed
    in chunks of images (a float64 copy of all of CIFAR-10 would take 1.2 GB)."""
    channels = images.shape[-1]
    count, total, squares = 0, np.zeros(channels), np.zeros(channels)
    for start in range(0, len(images), chunk):
        x = np.asarray(images[start: start + chunk], np.float64).reshape(-1, channels) / 255.0
        count, total, squares = count + len(x), total + x.sum(axis=0), squares + np.square(x).sum(axis=0)
    mean = total / count
    std = np.maximum(np.sqrt(np.maximum(squares / count - np.square(mean), 0.0)), 1e-3)  # no zero division
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


@dataclasses.dataclass(frozen=True)
class ImageData:
    """The train and test splits and the class names of one dataset."""

    train: Split | FileSplit
    test: Split | FileSplit
    label_names: tuple[str, ...] = CIFAR10_LABEL_NAMES
    validation: Split | FileSplit | None = None  # None: carved from train (`split_train_validation`)
    notes: tuple[str, ...] = ()  # what loading decided or skipped, for the run's log

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.train.image_shape

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @functools.cached_property
    def _statistics(self):
        return self.train.statistics  # (of the files' center crops for a `FileSplit`)

    def model_fields(self, image_size: int | None = None) -> dict:
        """The `sa_conv.ModelConfig` fields the data decides: image size (``image_size`` when the
        pipeline resizes, `make_dataset`) and channels, number of classes, and the normalization
        statistics of the training split (computed once)."""
        height, width, channels = self.image_shape
        if image_size is None and height != width:
            raise DatasetError(
                f"The images are {height}x{width}; the models take square images. Set --image_size "
                "to resize them (shorter side, then a square crop)."
            )
        mean, std = self._statistics
        return dict(image_size=int(image_size or height), image_channels=channels, num_classes=self.num_classes,
                    pixel_mean=mean, pixel_std=std)


CifarData = ImageData  # the name of earlier releases


# --------------------------------------------------------------------------------------------
# Safe reading of the official python format.

# The exact globals that official CIFAR pickles (and numpy arrays pickled with protocol 2)
# reference; everything else is refused before it is called.
_SAFE_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5 arrays
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol 2 stores bytes objects written by Python 3
})


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise _RefusedGlobal(f"{module}.{name}")


class _RefusedGlobal(pickle.UnpicklingError):
    pass


# The opcodes that index the unpickler's memo: a writer numbers its entries from 0, one per opcode
# at most, but a corrupt index makes the unpickler grow its memo to that size and fill it (a
# flipped bit asked for 21 GB).
_MEMO_OPCODES = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"})


def _check_memo_indices(blob: bytes) -> None:
    """UnpicklingError when a memo index of the pickle ``blob`` is beyond its count of opcodes
    (read without running anything)."""
    for count, (opcode, argument, _) in enumerate(pickletools.genops(blob), start=1):
        if opcode.name in _MEMO_OPCODES and int(argument) > count:
            raise pickle.UnpicklingError(f"memo index {argument} at opcode {count}")


def safe_unpickle(blob: bytes, name: str):
    """Unpickles an official CIFAR file, refusing every global that those files do not use.

    Raises:
      DatasetError: naming ``name`` and the refused global (nothing of it has run), or saying
        the file is truncated or corrupt.
    """
    try:
        _check_memo_indices(blob)
        return _RestrictedUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except _RefusedGlobal as exc:
        raise DatasetError(
            f"{name!r} is not an official CIFAR file: its pickle asks for {exc}, which CIFAR files "
            "never contain, so it was refused without running it. Do not use files from this source."
        ) from None
    except Exception as exc:  # pickle raises many types for corrupt input
        raise DatasetError(
            f"CIFAR batch file {name!r} is truncated or corrupt ({type(exc).__name__}: "
            f"{exc}). Re-download or re-extract the dataset."
        ) from None


def _check_size(size: int, name: str) -> None:
    if size > MAX_FILE_BYTES:
        raise DatasetError(
            f"{name!r} is {size / 2**20:.0f} MiB, far larger than any official CIFAR file "
            f"(limit {MAX_FILE_BYTES // 2**20} MiB); refusing to read it."
        )


def _read_file(path: str) -> bytes:
    _check_size(os.path.getsize(path), path)
    with open(path, "rb") as f:
        return f.read()


def _key(obj: dict, key: str):
    for candidate in (key.encode(), key):
        if candidate in obj:
            return obj[candidate]
    return None


@dataclasses.dataclass(frozen=True)
class CifarFormat:
    """Where and under which keys one CIFAR variant's official python files keep their data."""

    title: str
    dirname: str
    archive: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    num_classes: int

    def parse_batch(self, blob: bytes, name: str) -> Split:
        """One batch file (a pickled dict) as a `Split`. Rows of 3,072 bytes hold 1,024 red,
        1,024 green, then 1,024 blue values, row-major 32x32."""
        obj = safe_unpickle(blob, name)
        if not isinstance(obj, dict):
            raise DatasetError(
                f"{self.title} batch file {name!r} holds a {type(obj).__name__}, expected a dict with "
                f"b'data' and b'{self.label_key}'."
            )
        data, labels = _key(obj, "data"), _key(obj, self.label_key)
        if data is None or labels is None:
            raise DatasetError(
                f"{self.title} batch file {name!r} lacks b'data' or b'{self.label_key}' (keys: "
                f"{sorted(map(str, obj))})."
            )
        data = np.asarray(data)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DatasetError(
                f"{self.title} batch file {name!r}: b'data' has shape {data.shape} and dtype "
                f"{data.dtype}; expected uint8 rows of 3072 bytes (3 x 32 x 32)."
            )
        try:
            labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            raise DatasetError(f"{self.title} batch file {name!r}: b'{self.label_key}' is not a list of integers.") from None
        if labels.shape[0] != data.shape[0]:
            raise DatasetError(
                f"{self.title} batch file {name!r}: {data.shape[0]} images but {labels.shape[0]} labels."
            )
        bad = labels[(labels < 0) | (labels >= self.num_classes)]
        if bad.size:
            raise DatasetError(
                f"{self.title} batch file {name!r}: labels must be in 0..{self.num_classes - 1}, found "
                f"{sorted(set(bad.tolist()))[:5]}."
            )
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return Split(np.ascontiguousarray(images), labels)

    def label_names(self, blob: bytes | None, name: str) -> tuple[str, ...]:
        meta = safe_unpickle(blob, name) if blob is not None else None
        names = _key(meta, self.names_key) if isinstance(meta, dict) else None
        if not names or len(names) != self.num_classes:
            if self.num_classes == len(CIFAR10_LABEL_NAMES):
                return CIFAR10_LABEL_NAMES
            return tuple(f"class_{i}" for i in range(self.num_classes))
        return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)

    def _candidates(self, path: str) -> tuple[str, ...]:
        """Where a directory ``path`` may hold the files, in the order they are looked for."""
        return os.path.join(path, self.dirname), path, os.path.join(path, self.archive)

    def find(self, path: str) -> str | None:
        """The archive or batches directory that ``path`` names or contains, or None."""
        if os.path.isfile(path):
            return path if path.endswith((".tar.gz", ".tgz")) else None
        for candidate in self._candidates(path):
            if os.path.isfile(os.path.join(candidate, self.test_file)) or (
                    os.path.isfile(candidate) and candidate.endswith(".tar.gz")):
                return candidate
        return None

    def locate(self, path: str) -> str:
        """The ``.tar.gz`` archive ``path`` names, or the first of its `_candidates` that is a
        complete batches directory (every batch file present) or the archive, without reading
        them: what `find` offers, checked, or a complete alternative to a partial one.

        Raises:
          DatasetError: naming the path and the fix, for a missing path, a file that is no
            archive, or missing batch files.
        """
        if not os.path.exists(path):
            raise DatasetError(
                f"{self.title} path {path!r} does not exist. Point --data_dir at a "
                f"{self.dirname}/ directory, a directory containing one, or {self.archive}."
            )
        if os.path.isfile(path):
            if not path.endswith((".tar.gz", ".tgz")):
                raise DatasetError(
                    f"{self.title} path {path!r} is a file but not a .tar.gz archive; expected a "
                    f"{self.dirname}/ directory or {self.archive}."
                )
            return path
        wanted = self.train_files + (self.test_file,)
        for candidate in self._candidates(path):
            if os.path.isfile(candidate) or (
                    os.path.isdir(candidate) and all(os.path.isfile(os.path.join(candidate, n)) for n in wanted)):
                return candidate
        # None is complete: name what the folder the files were looked for first lacks.
        directory = next(c for c in self._candidates(path) if os.path.isdir(c))
        missing = [n for n in wanted if not os.path.isfile(os.path.join(directory, n))]
        raise DatasetError(
            f"{self.title} directory {directory!r} is missing batch file(s) {missing}; expected "
            f"{list(wanted)} in the official python format, or {self.archive} beside them."
        )

    def load(self, path: str) -> ImageData:
        """Reads the official python format from a directory or a ``.tar.gz`` archive.

        Raises:
          DatasetError: naming the file, for a missing path or batch file (`locate`), a
            truncated, corrupt or unsafe pickle, a file above `MAX_FILE_BYTES`, a wrong array
            size or labels out of range.
        """
        directory = self.locate(path)
        if os.path.isfile(directory):
            return self._load_archive(directory)
        meta_path = os.path.join(directory, self.meta_file)
        meta = _read_file(meta_path) if os.path.isfile(meta_path) else None
        return self._assemble(lambda n: _read_file(os.path.join(directory, n)),
                              lambda n: os.path.join(directory, n), meta)

    def _assemble(self, read, where, meta) -> ImageData:
        names = self.label_names(meta, where(self.meta_file))
        train = _concat([self.parse_batch(read(n), where(n)) for n in self.train_files])
        test = self.parse_batch(read(self.test_file), where(self.test_file))
        return ImageData(train, test, names)

    def _load_archive(self, path: str) -> ImageData:
        try:
            with tarfile.open(path, "r:gz") as tar:
                members = {}
                for m in tar.getmembers():
                    if m.isfile():
                        base = os.path.basename(m.name)
                        if base in members:
                            raise DatasetError(f"{self.title} archive {path!r} holds {base!r} twice.")
                        members[base] = m
                missing = [n for n in self.train_files + (self.test_file,) if n not in members]
                if missing:
                    raise DatasetError(f"{self.title} archive {path!r} is missing batch file(s) {missing}.")

                def where(n):
                    return f"{path}:{members[n].name}" if n in members else f"{path}:{n}"

                def read(n):
                    _check_size(members[n].size, where(n))
                    return tar.extractfile(members[n]).read()

                return self._assemble(read, where, read(self.meta_file) if self.meta_file in members else None)
        except DatasetError:
            raise
        except Exception as exc:  # tarfile, gzip and zlib raise several types for a bad archive
            raise DatasetError(
                f"{self.title} archive {path!r} cannot be read ({type(exc).__name__}: {exc}); it is "
                "truncated or not a gzip tar file."
            ) from None

    def write(self, directory: str, data: ImageData, archive: bool = False) -> str:
        """Writes ``data`` (32x32x3 images) in the official python format, the inverse of `load`.

        The training split is divided over the training files. Returns the path to read back:
        the batches directory, or the ``.tar.gz`` when ``archive`` is true.
        """
        batches_dir = os.path.join(directory, self.dirname)
        os.makedirs(batches_dir, exist_ok=True)

        def dump(name, split):
            rows = split.images.transpose(0, 3, 1, 2).reshape(len(split), -1)
            blob = {b"batch_label": name.encode(), self.label_key.encode(): split.labels.tolist(), b"data": rows}
            with open(os.path.join(batches_dir, name), "wb") as f:
                pickle.dump(blob, f, protocol=2)

        parts = np.array_split(np.arange(len(data.train)), len(self.train_files))
        for name, idx in zip(self.train_files, parts):
            dump(name, Split(data.train.images[idx], data.train.labels[idx]))
        dump(self.test_file, data.test)
        with open(os.path.join(batches_dir, self.meta_file), "wb") as f:
            pickle.dump({self.names_key.encode(): [n.encode() for n in data.label_names]}, f, protocol=2)
        if not archive:
            return batches_dir
        archive_path = os.path.join(directory, self.archive)
        with tarfile.open(archive_path, "w:gz") as tar:
            tar.add(batches_dir, arcname=self.dirname)
        return archive_path


CIFAR10 = CifarFormat("CIFAR-10", "cifar-10-batches-py", "cifar-10-python.tar.gz",
                      tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta",
                      "labels", "label_names", 10)
CIFAR100 = CifarFormat("CIFAR-100", "cifar-100-python", "cifar-100-python.tar.gz", ("train",), "test", "meta",
                       "fine_labels", "fine_label_names", 100)


def _concat(splits: Sequence[Split]) -> Split:
    return Split(np.concatenate([s.images for s in splits]), np.concatenate([s.labels for s in splits]))


def parse_batch(blob: bytes, name: str) -> Split:
    """Parses one official CIFAR-10 batch file (protocol-2 pickle) into a `Split`."""
    return CIFAR10.parse_batch(blob, name)


def load_cifar10_files(path: str) -> ImageData:
    """The official CIFAR-10 python format from a directory or ``cifar-10-python.tar.gz``."""
    return CIFAR10.load(path)


def write_cifar10_files(directory: str, data: ImageData, archive: bool = False) -> str:
    """Writes ``data`` in the official CIFAR-10 python format (see `CifarFormat.write`)."""
    return CIFAR10.write(directory, data, archive)


# --------------------------------------------------------------------------------------------
# Synthetic data.


def make_synthetic(num_train: int = 1000, num_test: int = 200, seed: int = 0, image_shape=(32, 32, 3),
                   num_classes: int = 10) -> ImageData:
    """Class-dependent random images: each class has its own colour and stripe orientation.

    A model can learn these (useful for smoke tests), but they are not CIFAR-10.
    """
    rng = np.random.default_rng(seed)
    height, width, channels = image_shape
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    class_colours = rng.uniform(40, 215, size=(num_classes, channels)).astype(np.float32)
    angles = np.linspace(0, np.pi, num_classes, endpoint=False)

    def split(n):
        labels = rng.integers(0, num_classes, size=n).astype(np.int64)
        stripes = np.stack([np.sin((np.cos(a) * xx + np.sin(a) * yy) * 0.8) for a in angles])
        images = class_colours[labels][:, None, None, :] + 30.0 * stripes[labels][..., None]
        images += rng.normal(0, 25, size=images.shape)
        return Split(np.clip(images, 0, 255).astype(np.uint8), labels)

    names = CIFAR10_LABEL_NAMES if num_classes == 10 else tuple(f"class_{i}" for i in range(num_classes))
    return ImageData(split(num_train), split(num_test), names)


SHAPE_CLASSES = ("circle", "square", "triangle", "cross", "ring")


def draw_shape(canvas: np.ndarray, kind: str, rng: np.random.Generator) -> None:
    """Paints a shape of class ``kind`` (`SHAPE_CLASSES`) in one colour into the ``(size, size, 3)`` float
    ``canvas``, at a random place, radius (5-10 pixels) and stroke width."""
    size = canvas.shape[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    radius = rng.uniform(5, 10)
    cy, cx = rng.uniform(radius + 1, size - radius - 1, size=2)
    dy, dx = yy - cy, xx - cx
    width = rng.uniform(1.5, 3.0)
    if kind == "circle":
        mask = dy ** 2 + dx ** 2 <= radius ** 2
    elif kind == "ring":
        mask = np.abs(np.sqrt(dy ** 2 + dx ** 2) - radius) <= width / 2 + 0.3
    elif kind == "square":
        mask = np.maximum(np.abs(dy), np.abs(dx)) <= radius * 0.85
    elif kind == "triangle":  # apex up, base at the bottom
        mask = (dy <= radius * 0.8) & (np.abs(dx) <= (dy + radius) * 0.6)
    else:  # cross
        mask = ((np.abs(dy) <= width) | (np.abs(dx) <= width)) & (np.maximum(np.abs(dy), np.abs(dx)) <= radius)
    canvas[mask] = rng.uniform(0, 255, size=3)


def shapes_image(kind: str, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """A ``(size, size, 3)`` uint8 image of shape ``kind`` on a noisy two-colour gradient, with two distractor blobs."""
    rows, cols = np.mgrid[0:size, 0:size]
    a, b = rng.uniform(0, 255, size=(2, 3))
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * (cols.astype(np.float32) / size) + np.sin(angle) * (rows.astype(np.float32) / size))[..., None]
    canvas = a + (b - a) * (t - t.min()) / (np.ptp(t) + 1e-6)
    for _ in range(2):  # distractors: small blobs that belong to no class
        cy, cx = rng.uniform(0, size, size=2)
        blob = (rows - cy) ** 2 + (cols - cx) ** 2 <= rng.uniform(1, 4)  # drawn before the blob's colour
        canvas[blob] = rng.uniform(0, 255, size=3)
    draw_shape(canvas, kind, rng)
    canvas += rng.normal(0, 12, size=canvas.shape)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def make_shapes(train_per_class: int = 60, test_per_class: int = 40, seed: int = 0) -> ImageData:
    """The ``shapes`` dataset: `shapes_image` of each of `SHAPE_CLASSES`, ``train_per_class`` training and
    ``test_per_class`` test images a class, class by class. The same for every training seed."""
    rng = np.random.default_rng(seed)

    def split(count):
        labels = np.repeat(np.arange(len(SHAPE_CLASSES), dtype=np.int64), count)
        return Split(np.stack([shapes_image(SHAPE_CLASSES[label], rng) for label in labels]), labels)

    return ImageData(split(train_per_class), split(test_per_class), SHAPE_CLASSES)


# --------------------------------------------------------------------------------------------
# TensorFlow Datasets.


def host_reachable(host_port: tuple[str, int], timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(host_port, timeout=timeout):
            return True
    except OSError:
        return False


def _tfds_prepared(builder) -> bool:
    import tensorflow as tf

    try:
        return bool(tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json")))
    except Exception:  # an unreadable data_dir counts as not prepared
        return False


def load_tfds(name: str = "cifar10", data_dir: str | None = None, download: bool = True,
              image_size: int | None = None) -> ImageData:
    """Loads a TensorFlow Datasets image-classification dataset into memory. Images of varying
    size need ``image_size``: each is resized and center-cropped to it (`resize_and_crop`) as it
    is read.

    Uses the ``train`` split and ``test`` (or ``validation`` when there is no test split).
    If the dataset is not prepared in ``data_dir`` and its download host (the dataset's
    homepage host) cannot be reached, raises `DatasetError` at once (tfds itself would hang
    for minutes before failing offline).
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as exc:  # tfds raises DatasetNotFoundError and others
        raise DatasetError(f"tfds has no dataset {name!r} ({type(exc).__name__}: {exc}).") from None
    info = builder.info
    if not info.supervised_keys:
        raise DatasetError(f"tfds:{name} has no (image, label) supervised keys; it is not an image-classification dataset.")
    image_key, label_key = info.supervised_keys[:2]
    shape = tuple(info.features[image_key].shape)
    if len(shape) != 3 or shape[-1] is None or (None in shape and not image_size):
        raise DatasetError(
            f"tfds:{name} images have shape {shape}: their size varies. Pass --image_size=N to resize "
            "them (shorter side to N, then the center N x N crop)."
        )
    resize = None in shape
    if not _tfds_prepared(builder):
        if not download:
            raise DatasetError(f"tfds {name} is not prepared in {builder.data_dir!r} and download is off. " + OFFLINE_HINT)
        host = urllib.parse.urlparse(info.homepage or "").hostname or "www.tensorflow.org"
        if not host_reachable((host, 443)):
            raise DatasetError(
                f"tfds {name} is not prepared in {builder.data_dir!r} and its download host "
                f"{host} cannot be reached (no internet?). " + OFFLINE_HINT
            )
    splits = list(info.splits) or ["train", "test"]  # the split list is known once prepared
    test_split = "test" if "test" in splits else "validation" if "validation" in splits else None
    if "train" not in splits or test_split is None:
        raise DatasetError(f"tfds:{name} needs a train split and a test or validation split; it has {splits}.")
    train, test = tfds.load(name, split=["train", test_split], data_dir=data_dir, as_supervised=True,
                            download=download)

    def to_split(ds):
        images, labels = [], []
        if resize:
            ds = ds.map(lambda x, y: (resize_and_crop(x, int(image_size)), y), num_parallel_calls=-1)
        for x, y in tfds.as_numpy(ds.batch(4096)):
            images.append(x)
            labels.append(y)
        return Split(np.concatenate(images).astype(np.uint8), np.concatenate(labels).astype(np.int64))

    label_feature = info.features[label_key]
    names = tuple(getattr(label_feature, "names", ()) or ())
    if not names:
        names = tuple(f"class_{i}" for i in range(int(label_feature.num_classes)))
    return ImageData(to_split(train), to_split(test), names)


# --------------------------------------------------------------------------------------------
# Sources by name.


class DatasetSource:
    """A named source of `ImageData`."""

    name: str = ""
    reads_data_dir = False  # whether --data_dir says where the data is

    def absolute_name(self) -> str:
        """The name, any path in it absolute (from this process's directory)."""
        return self.name

    def load(self, data_dir: str | None, seed: int = 0, image_size: int | None = None, log=None) -> ImageData:
        """The data; ``image_size``: the side the pipeline will resize to (sources whose images
        vary in size need it to load; fixed-size sources are resized by `make_dataset`)."""
        raise NotImplementedError


class CifarSource(DatasetSource):
    """CIFAR-10 or -100: the official python files when ``data_dir`` holds them, else tfds
    (``files_only``: the files, never tfds)."""

    reads_data_dir = True

    def __init__(self, name: str, fmt: CifarFormat, tfds_name: str, files_only: bool = False):
        self.name, self.fmt, self.tfds_name, self.files_only = name, fmt, tfds_name, files_only

    def load(self, data_dir, seed=0, image_size=None, log=None):
        if self.files_only and not data_dir:
            raise DatasetError(
                f"--dataset={self.name} needs --data_dir: the {self.fmt.dirname}/ directory or {self.fmt.archive}."
            )
        if data_dir and not os.path.exists(data_dir):
            raise DatasetError(
                f"--data_dir {data_dir!r} does not exist. Point it at the {self.fmt.dirname}/ directory, a "
                f"directory containing one, {self.fmt.archive}, or a tfds data_dir."
            )
        if self.files_only or (data_dir and self.fmt.find(data_dir)):
            return self.fmt.load(data_dir)
        return load_tfds(self.tfds_name, data_dir)


class TfdsSource(DatasetSource):
    reads_data_dir = True

    def __init__(self, tfds_name: str):
        self.name, self.tfds_name = f"tfds:{tfds_name}", tfds_name

    def load(self, data_dir, seed=0, image_size=None, log=None):
        return load_tfds(self.tfds_name, data_dir, image_size=image_size)


class FolderSource(DatasetSource):
    """``folder:PATH``: your own images, one subfolder per class (`trainers.image_files.scan_folder`:
    PNG, JPEG, BMP, GIF; optional ``train/``, ``validation/``, ``test/``), streamed from disk at
    ``image_size`` (default `DEFAULT_FOLDER_IMAGE_SIZE`). Without a ``test/`` folder, a seeded
    `DEFAULT_VALIDATION_FRACTION` of the images is held out as the test split."""

    def __init__(self, root: str):
        self.name, self.root = f"folder:{root}", root

    def absolute_name(self):
        return f"folder:{os.path.abspath(self.root)}"

    def load(self, data_dir, seed=0, image_size=None, log=None):
        size = int(image_size or DEFAULT_FOLDER_IMAGE_SIZE)
        scan = image_files.scan_folder(self.root, size, resize_and_crop, log=log)
        notes = [f"{self.name}: {len(scan.class_names)} classes, "
                 + ", ".join(f"{len(s)} {name} images" for name, s in scan.splits.items())
                 + f" at {size}x{size}" + ("" if image_size else " (the default; set --image_size)")
                 + f"; {scan.skipped_summary()}."]
        train, test = scan.splits["train"], scan.splits.get("test")
        if test is None:
            train, test = split_train_validation(train, default_validation_size(len(train)) or 1, seed=seed + 1)
        return ImageData(train, test, scan.class_names, scan.splits.get("validation"), tuple(notes))


class SyntheticSource(DatasetSource):
    name = "synthetic"

    def load(self, data_dir, seed=0, image_size=None, log=None):
        return make_synthetic(seed=seed)


class ShapesSource(DatasetSource):
    name = "shapes"

    def load(self, data_dir, seed=0, image_size=None, log=None):
        return make_shapes()


_SOURCES = {s.name: s for s in (
    CifarSource("cifar10", CIFAR10, "cifar10"),
    CifarSource("cifar10_files", CIFAR10, "cifar10", files_only=True),
    CifarSource("cifar100", CIFAR100, "cifar100"),
    CifarSource("cifar100_files", CIFAR100, "cifar100", files_only=True),
    SyntheticSource(),
    ShapesSource(),
)}
DATASETS = tuple(_SOURCES) + ("tfds:NAME", "folder:PATH")
# Side of the images of a folder dataset when --image_size is not given: CIFAR's.
DEFAULT_FOLDER_IMAGE_SIZE = 32


def get_source(name: str) -> DatasetSource:
    """The source named ``name`` (see `DATASETS`); ``tfds:NAME`` for any tfds dataset,
    ``folder:PATH`` for a folder of class folders."""
    if isinstance(name, str) and name.startswith("tfds:") and len(name) > 5:
        return TfdsSource(name[5:])
    if isinstance(name, str) and name.startswith("folder:") and len(name) > 7:
        return FolderSource(os.path.expanduser(name[7:]))
    if name in _SOURCES:
        return _SOURCES[name]
    raise DatasetError(f"Unknown dataset {name!r}; choose one of {', '.join(DATASETS)}.")


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0, image_size: int | None = None,
                 log=None) -> ImageData:
    """Loads a dataset by name (see `get_source`); ``image_size`` as in `DatasetSource.load`,
    ``log`` for progress on long scans."""
    return get_source(name).load(data_dir, seed, image_size=image_size, log=log)


# --------------------------------------------------------------------------------------------
# Splitting, augmentation, tf.data.


def default_validation_size(num_train: int) -> int:
    """5,000 for CIFAR-10's 50,000 training images, proportionally less for small data."""
    return int(round(num_train * DEFAULT_VALIDATION_FRACTION))


def split_train_validation(train: Split, validation_size: int | None = None, seed: int = 0) -> tuple[Split, Split]:
    """Carves a held-out validation split from the training data (never from the test split).

    A seeded permutation; the same seed gives the same split. ``validation_size=None`` uses
    `default_validation_size`.
    """
    n = len(train)
    size = default_validation_size(n) if validation_size is None else int(validation_size)
    if not 0 <= size < n:
        raise DatasetError(f"validation_size={size} must be in [0, {n}) for {n} training images.")
    order = np.random.default_rng(seed).permutation(n)
    val_idx, train_idx = np.sort(order[:size]), np.sort(order[size:])
    return train.subset(train_idx), train.subset(val_idx)


def stratified_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of ``round(fraction * count)`` images of each class (at least one), in one seeded order per
    class: a smaller fraction's images are among a larger one's."""
    rng = np.random.default_rng(seed)
    keep = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        keep.append(members[rng.permutation(len(members))][:max(1, int(round(fraction * len(members))))])
    return np.sort(np.concatenate(keep))


def resize_and_crop(image, size: int, training: bool = False, seed=None):
    """``image`` ``(H, W, C)`` uint8 at ``size x size``: its shorter side resized to ``size``
    (bilinear, antialiased; a square image of that size is returned as it is), then the center
    crop, or for ``training`` a random crop along the longer side and a horizontal flip with
    probability 1/2 (``seed``: a shape-(2,) int tensor, stateless). What the folder source trains
    and evaluates on, and what the exported ``predict_encoded`` signature applies to a request."""
    import tensorflow as tf

    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    scale = tf.cast(size, tf.float32) / tf.cast(tf.minimum(height, width), tf.float32)
    new_size = tf.maximum(size, tf.cast(tf.round(tf.cast(tf.stack([height, width]), tf.float32) * scale), tf.int32))
    unchanged = tf.logical_and(tf.equal(height, size), tf.equal(width, size))
    resized = tf.cond(
        unchanged, lambda: image,
        lambda: tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, new_size, antialias=True)), 0, 255), tf.uint8))
    if not training:
        top, left = (tf.shape(resized)[0] - size) // 2, (tf.shape(resized)[1] - size) // 2
        return tf.ensure_shape(resized[top: top + size, left: left + size], (size, size, image.shape[-1]))
    seeds = tf.random.experimental.stateless_split(seed, num=2)
    cropped = tf.image.stateless_random_crop(resized, (size, size, tf.shape(image)[-1]), seed=seeds[0])
    return tf.ensure_shape(tf.image.stateless_random_flip_left_right(cropped, seed=seeds[1]),
                           (size, size, image.shape[-1]))


def augment(image, seed, padding: int = CROP_PADDING):
    """The paper's augmentation of one uint8 image ``(H, W, C)``, stateless and seeded.

    Zero-pads by ``padding`` pixels (`CROP_PADDING`), takes a random crop of the image's own size and flips
    horizontally with probability 1/2. ``seed`` is a shape-(2,) int tensor; the same seed gives
    the same output.
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, num=2)
    p = padding
    padded = tf.pad(image, [[p, p], [p, p], [0, 0]])
    cropped = tf.image.stateless_random_crop(padded, tf.shape(image), seed=seeds[0])
    return tf.image.stateless_random_flip_left_right(cropped, seed=seeds[1])


# The offset of the batch augmentations' seed stream from the examples' (`make_dataset`).
BATCH_STREAM = 1 << 40


def make_dataset(split: Split | FileSplit, batch_size: int, training: bool, seed: int | None = 0,
                 drop_remainder: bool | None = None, image_size: int | None = None, augmentation=None):
    """A `tf.data.Dataset` of ``(images uint8 (batch, S, S, C), labels int64 (batch,))`` (with a
    mixing ``augmentation`` in training: ``(images float32, labels float32 (batch, classes))``).

    Args:
      split: the images and labels: in memory (`Split`), or files (`FileSplit`, decoded here on
        the fly, so they need not fit in memory).
      batch_size: the *global* batch size; under `tf.distribute` the strategy splits each batch
        into per-replica batches of ``batch_size / num_replicas``.
      training: shuffle (reshuffled every epoch) and augment, repeat is left to the caller. In
        memory: the paper's pad, crop and flip (`augment`); files: `resize_and_crop`'s random crop
        and flip; then ``augmentation``'s.
      seed: makes shuffling and augmentation deterministic; None for nondeterministic.
      drop_remainder: defaults to ``training`` (equal batches for every replica and for XLA).
      image_size: the side ``S`` of the images yielded; None: the split's own. In-memory images of
        another size go through `resize_and_crop` first (training pads by `CROP_PADDING` scaled
        by the resize). A `FileSplit` has its size already.
      augmentation: in training, a `trainers.augmentation.Pipeline` (its ``crops``: whether the
        crop and flip above happen; ``example`` and ``batch``: its stages); None: the crop and
        flip alone.
    """
    import tensorflow as tf

    if batch_size <= 0:
        raise DatasetError(f"batch_size must be positive, got {batch_size}.")
    if len(split) == 0:
        raise DatasetError("Cannot build a dataset from an empty split.")
    drop_remainder = training if drop_remainder is None else drop_remainder
    if drop_remainder and len(split) < batch_size:
        raise DatasetError(
            f"The split has {len(split)} images, fewer than one batch of {batch_size}; lower the batch size."
        )
    files = isinstance(split, FileSplit)
    if files and image_size not in (None, split.image_size):
        raise DatasetError(f"The files were scanned for {split.image_size}x{split.image_size} images, not {image_size}.")
    own = split.image_shape[0]
    size = own if image_size is None or files else int(image_size)
    resize = not files and (size, size) != tuple(split.image_shape[:2])
    padding = max(1, round(CROP_PADDING * size / own)) if resize else CROP_PADDING

    crops = training and (augmentation is None or augmentation.crops)

    def image_of(item, seed_pair=None):
        if files:
            image = resize_and_crop(image_files.decode(item, split.channels), size, crops, seed_pair)
        else:
            image = resize_and_crop(item, size) if resize else item
            image = augment(image, seed_pair, padding) if crops else image
        return augmentation.example(image, seed_pair) if training and augmentation is not None else image

    ds = tf.data.Dataset.from_tensor_slices((list(split.paths) if files else split.images, split.labels))
    options = tf.data.Options()
    options.deterministic = seed is not None
    options.autotune.enabled = TF_DATA_AUTOTUNE
    ds = ds.with_options(options)
    if training:
        ds = ds.shuffle(len(split), seed=seed, reshuffle_each_iteration=True)
        # One independent stateless seed per example, itself reshuffled every epoch.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            lambda pair, s: (image_of(pair[0], s), pair[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=seed is not None,
        )
    elif files or resize:
        ds = ds.map(lambda item, label: (image_of(item), label), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if training and augmentation is not None and augmentation.mixes:
        # A stream of its own, far from every epoch's seed (``seed + 1`` is the next epoch's): the
        # examples' seeds stay those of a run without the batch stage.
        seeds = tf.data.Dataset.random(seed=None if seed is None else seed + BATCH_STREAM,
                                       rerandomize_each_iteration=True)
        ds = tf.data.Dataset.zip((ds, seeds.batch(2))).map(
            lambda batch, s: augmentation.batch(batch[0], batch[1], s),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)
    return ds.prefetch(tf.data.AUTOTUNE)


def head(split: Split | FileSplit, count: int, image_size: int | None = None) -> np.ndarray:
    """The first ``count`` images of ``split`` as the evaluation pipeline gives them, uint8
    ``(count, S, S, C)`` (for attention summaries and export checks: a few images, in memory)."""
    count = min(count, len(split))
    subset = split.subset(np.arange(count))
    return next(make_dataset(subset, count, training=False, image_size=image_size).as_numpy_iterator())[0]


__all__ = [
    "CIFAR10", "CIFAR100", "CifarData", "CifarFormat", "DATASETS", "DatasetError", "DatasetSource",
    "FileSplit", "FolderSource", "ImageData", "Split", "augment", "head", "resize_and_crop", "channel_statistics", "default_validation_size", "get_source",
    "load_cifar10_files", "load_dataset", "load_tfds", "make_dataset", "make_shapes", "make_synthetic", "parse_batch",
    "safe_unpickle", "split_train_validation", "stratified_subset", "write_cifar10_files",
]
