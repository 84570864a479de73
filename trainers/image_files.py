"""Image files from disk: their format and size from the header alone, and a scan of a class-per-folder
tree into labelled, checked file lists (`scan_folder`), for `trainers.data`'s ``folder:PATH`` source.

**Untrusted files.** A file is admitted only when its header names a PNG, JPEG, BMP or GIF whose
width and height are positive and whose pixel count is at most ``max_pixels`` (read before anything
is decoded: a 20-byte PNG can announce a 4-gigapixel image), and when it then decodes. Everything
else (other extensions, unknown or malformed headers, oversized images, truncated or corrupt
bodies, files above `MAX_FILE_BYTES`) is skipped and counted by reason; the caller logs the counts,
in one line: the line TensorFlow's decoders print for each corrupt file is held back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import struct
import sys
import tempfile

import numpy as np

from sa_conv.errors import DatasetError

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
# The BMP depths TensorFlow's decoder reads (8 bits: color-table indices, looked up in `decode`).
BMP_BITS = (8, 24, 32)
# Largest image decoded: 40 megapixels (a 160 MB RGBA buffer at most).
MAX_IMAGE_PIXELS = 40_000_000
MAX_FILE_BYTES = 200 * 2**20
SPLIT_FOLDERS = ("train", "validation", "test")


def header_size(path: str) -> tuple[str, int, int]:
    """``(format, height, width)`` of the image file at ``path`` from its header alone. Raises
    ValueError for a file that is not a well-formed PNG, JPEG, BMP or GIF header."""
    with open(path, "rb") as f:
        head = f.read(32)
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
            width, height = struct.unpack(">II", head[16:24])
            return "png", height, width
        if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
            width, height = struct.unpack("<HH", head[6:10])
            return "gif", height, width
        if head.startswith(b"BM") and len(head) >= 30:
            width, height, _, bits = struct.unpack("<iiHH", head[18:30])
            if bits not in BMP_BITS:
                raise ValueError(f"BMP of {bits} bits per pixel")
            return "bmp", abs(height), width  # a negative height is a top-down bitmap
        if head.startswith(b"\xff\xd8"):
            return ("jpeg",) + _jpeg_frame_size(f)
    raise ValueError("not a PNG, JPEG, BMP or GIF header")


def _jpeg_frame_size(f) -> tuple[int, int]:
    """Walks the JPEG markers from offset 2 to the first start-of-frame and reads its size."""
    f.seek(2)
    while True:
        byte = f.read(1)
        while byte == b"\xff":  # fill bytes before a marker
            byte = f.read(1)
        if not byte:
            raise ValueError("JPEG without a frame header")
        marker = byte[0]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            continue
        length_bytes = f.read(2)
        if len(length_bytes) < 2:
            raise ValueError("truncated JPEG header")
        (length,) = struct.unpack(">H", length_bytes)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn
            frame = f.read(5)
            if len(frame) < 5:
                raise ValueError("truncated JPEG frame header")
            height, width = struct.unpack(">xHH", frame)
            return height, width
        if length < 2:
            raise ValueError("malformed JPEG segment")
        f.seek(length - 2, os.SEEK_CUR)


@dataclasses.dataclass(frozen=True)
class FileSplit:
    """Image files and their labels: ``paths`` (n,) and ``labels`` (n,) int64, decoded on the fly
    (`trainers.data.make_dataset`) at ``image_size`` (shorter side resized, then cropped square).
    ``channel_sums``: ``(n, 2 C + 1)`` float64 per file, the sums of its center crop's pixel values
    in ``[0, 1]`` and of their squares per channel, and its pixel count (from `scan_folder`), so
    that any subset has its exact `statistics` without decoding again."""

    paths: tuple[str, ...]
    labels: np.ndarray
    image_size: int
    channels: int = 3
    channel_sums: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, indices) -> "FileSplit":
        indices = np.asarray(indices, dtype=np.int64)
        return dataclasses.replace(self, paths=tuple(self.paths[i] for i in indices), labels=self.labels[indices],
                                   channel_sums=None if self.channel_sums is None else self.channel_sums[indices])

    @property
    def statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std in ``[0, 1]`` of the files' center crops."""
        if self.channel_sums is None or not len(self):
            raise DatasetError("These files were not scanned (trainers.image_files.scan_folder): no statistics.")
        total = self.channel_sums.sum(axis=0)
        c = self.channels
        mean = total[:c] / total[-1]
        std = np.maximum(np.sqrt(np.maximum(total[c:2 * c] / total[-1] - np.square(mean), 0.0)), 1e-3)
        return tuple(float(m) for m in mean), tuple(float(s) for s in std)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, self.channels)


@dataclasses.dataclass(frozen=True)
class FolderScan:
    """What `scan_folder` found: the class names, the checked files of each split folder present
    (``{"train": FileSplit, ...}``; without split folders, everything is ``"train"``) and the files
    it skipped, ``{reason: [paths]}``."""

    class_names: tuple[str, ...]
    splits: dict
    skipped: dict

    def skipped_summary(self) -> str:
        """One line: how many files were skipped, by reason, with an example of each."""
        if not self.skipped:
            return "no file skipped"
        parts = [f"{len(paths)} {reason} (e.g. {paths[0]})" for reason, paths in sorted(self.skipped.items())]
        return f"skipped {sum(len(p) for p in self.skipped.values())} files: " + "; ".join(parts)


def _class_folders(root: str) -> list[str]:
    return sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))


def _candidates(root: str, class_names, skipped: dict) -> list[tuple[str, int]]:
    files = []
    for label, name in enumerate(class_names):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        for directory, subdirs, names in os.walk(folder, followlinks=False):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for file_name in sorted(names):
                if file_name.startswith("."):
                    continue
                path = os.path.join(directory, file_name)
                if not file_name.lower().endswith(EXTENSIONS):
                    skipped.setdefault("not an image file (by extension)", []).append(path)
                else:
                    files.append((path, label))
    return files


def _check_header(path: str, max_pixels: int) -> str | None:
    """Why ``path`` cannot be decoded safely, or None."""
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return f"larger than {MAX_FILE_BYTES // 2**20} MB"
        _, height, width = header_size(path)
    except ValueError as exc:
        if str(exc).startswith("BMP of"):
            return f"BMP of a depth other than {', '.join(map(str, BMP_BITS))} bits per pixel"
        return "not a readable PNG/JPEG/BMP/GIF header"
    except (OSError, struct.error):
        return "not a readable PNG/JPEG/BMP/GIF header"
    if height < 1 or width < 1:
        return "empty image"
    if height * width > max_pixels:
        return f"more than {max_pixels:,} pixels"
    return None


def _little_endian(blob, offset: int, dtype):
    """The integer of ``dtype`` (tf.uint16 or tf.int32) at byte ``offset`` of ``blob``, as int64;
    zero past the end (the caller's checks refuse such files)."""
    import tensorflow as tf

    raw = tf.strings.substr(blob + b"\0" * 64, offset, dtype.size)
    return tf.cast(tf.io.decode_raw(raw, dtype, little_endian=True)[0], tf.int64)


def _is(blob, *signatures):
    import tensorflow as tf

    return tf.reduce_any([tf.equal(tf.strings.substr(blob, 0, len(s)), s) for s in signatures])


def encoded_size(blob):
    """``(height, width)`` int64 of one encoded PNG, JPEG, BMP or GIF (a scalar string tensor) from
    its header alone, as `header_size` reads a file, in a TensorFlow graph (serving's
    ``predict_encoded``). Anything else, and a BMP whose depth is not one of `BMP_BITS`, fails with
    InvalidArgumentError naming the formats."""
    import tensorflow as tf

    def png():
        check = tf.debugging.assert_greater_equal(tf.strings.length(blob), 24, message="truncated PNG header")
        with tf.control_dependencies([check]):
            header = tf.strings.substr(blob + b"\0" * 24, 16, 8)  # padded: substr's own error would quote the bytes
        raw = tf.cast(tf.io.decode_raw(header, tf.uint8), tf.int64)
        big_endian = lambda b: ((b[0] * 256 + b[1]) * 256 + b[2]) * 256 + b[3]  # noqa: E731
        return tf.stack([big_endian(raw[4:8]), big_endian(raw[0:4])])

    def jpeg():
        return tf.cast(tf.image.extract_jpeg_shape(blob)[:2], tf.int64)

    def gif():
        return tf.stack([_little_endian(blob, 8, tf.uint16), _little_endian(blob, 6, tf.uint16)])

    def bmp():
        bits = _little_endian(blob, 28, tf.uint16)
        check = tf.debugging.Assert(tf.reduce_any(tf.equal(bits, BMP_BITS)), [
            f"image_bytes holds a BMP of a depth other than {', '.join(map(str, BMP_BITS))} bits per pixel"])
        with tf.control_dependencies([check]):
            return tf.stack([tf.abs(_little_endian(blob, 22, tf.int32)), _little_endian(blob, 18, tf.int32)])

    def unknown():
        with tf.control_dependencies([tf.debugging.Assert(False, [
                "image_bytes holds an element that is not a PNG, JPEG, BMP or GIF file"])]):
            return tf.zeros((2,), tf.int64)

    return tf.case([(_is(blob, b"\x89PNG"), png), (_is(blob, b"\xff\xd8\xff"), jpeg),
                    (_is(blob, b"GIF87a", b"GIF89a"), gif), (_is(blob, b"BM"), bmp)], default=unknown, exclusive=True)


def _bmp_rgb(blob):
    """A BMP's RGB pixels. TensorFlow's BMP decoder returns an 8-bit file's color-table indices:
    looked up here in the table (4 bytes per entry, blue-green-red-unused, after the header)."""
    import tensorflow as tf

    def from_color_table():
        indices = tf.cast(tf.io.decode_bmp(blob, channels=0)[..., 0], tf.int32)
        used = _little_endian(blob, 46, tf.int32)
        entries = tf.where(used > 0, used, 256)
        table = tf.io.decode_raw(tf.strings.substr(blob, 14 + _little_endian(blob, 14, tf.int32), 4 * entries),
                                 tf.uint8)
        return tf.gather(tf.reshape(table, (-1, 4))[:, 2::-1], indices)

    return tf.cond(tf.equal(_little_endian(blob, 28, tf.uint16), 8), from_color_table,
                   lambda: tf.io.decode_bmp(blob, channels=3))


def _from_rgb(rgb, channels: int):
    import tensorflow as tf

    if channels == 1:
        return tf.image.rgb_to_grayscale(rgb)
    if channels == 4:
        return tf.concat([rgb, tf.fill(tf.concat([tf.shape(rgb)[:2], [1]], 0), tf.constant(255, tf.uint8))], -1)
    return rgb


def decode(path_or_bytes, channels: int = 3, from_bytes: bool = False):
    """A uint8 ``(H, W, channels)`` tensor of an image file or (``from_bytes``) its bytes: PNG
    (16-bit ones scaled to 8), JPEG, GIF (its first frame) or BMP (8-bit ones through their color
    table); GIF and BMP decode as RGB, then convert to 1 or 4 channels. The one decoder of training
    (`trainers.data`) and serving (the export's ``predict_encoded``): an image both read gives both
    the same pixels."""
    import tensorflow as tf

    blob = path_or_bytes if from_bytes else tf.io.read_file(path_or_bytes)
    bmp = _is(blob, b"BM")

    def through_rgb():  # TensorFlow's BMP and GIF decoders give RGB only
        return _from_rgb(tf.cond(bmp, lambda: _bmp_rgb(blob),
                                 lambda: tf.io.decode_image(blob, channels=3, expand_animations=False)), channels)

    image = tf.cond(tf.logical_or(bmp, _is(blob, b"GIF87a", b"GIF89a")), through_rgb,
                    lambda: tf.io.decode_image(blob, channels=channels, expand_animations=False))
    image.set_shape((None, None, channels))
    return image


# What TensorFlow's image decoders print (from C++, to the process's stderr) for each corrupt file:
# "E... jpeg_mem.cc:331] Premature end of JPEG data", and the like for PNG and GIF.
_DECODER_LINE = re.compile(rb"\b(jpeg|png|gif|bmp)\w*\.cc:\d+\]|decode_\w*image\w*_op\.cc:\d+\]")


@contextlib.contextmanager
def _decoder_lines_held():
    """Holds what is written to file descriptor 2 (TensorFlow's C++ log) inside the block: the
    decoders' lines about corrupt files are dropped (the scan counts those files in its summary),
    every other line is written back to stderr when the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not _DECODER_LINE.search(line)]
            if kept:
                os.write(2, b"".join(kept))


def _decode_pass(paths, image_size, channels, transform, log, what):
    """Decodes every file once (parallel, in tf.data): the indices that decode and the channel sums
    of their center crops (`FileSplit.channel_sums`). A file whose body is corrupt fails its
    element, which ``ignore_errors`` drops: its index is missing from the result."""
    import tensorflow as tf

    if not paths:
        return [], np.zeros((0, 2 * channels + 1))

    def load(index, path):
        image = transform(decode(path, channels), image_size)
        x = tf.reshape(tf.cast(image, tf.float64) / 255.0, (-1, channels))
        return index, tf.reduce_sum(x, 0), tf.reduce_sum(tf.square(x), 0), tf.cast(tf.shape(x)[0], tf.float64)

    ds = tf.data.Dataset.from_tensor_slices((np.arange(len(paths), dtype=np.int64), list(paths)))
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors().prefetch(tf.data.AUTOTUNE)
    sums = {}
    report = max(1000, len(paths) // 10)
    with _decoder_lines_held():
        for i, (index, s, s2, n) in enumerate(ds.as_numpy_iterator()):
            sums[int(index)] = np.concatenate([s, s2, [n]])
            if log and (i + 1) % report == 0:
                log(f"Checked {i + 1:,} of {len(paths):,} {what} images.")
    good = sorted(sums)
    return good, np.array([sums[i] for i in good]).reshape(len(good), 2 * channels + 1)


def scan_folder(root: str, image_size: int, transform, channels: int = 3, max_pixels: int = MAX_IMAGE_PIXELS,
                log=None) -> FolderScan:
    """Scans ``root``: one subfolder per class (files in nested folders count for their class), or
    ``train/`` (required then), ``validation/`` and ``test/`` each with the same class subfolders.
    Class names are the training folder's subfolder names, sorted; labels are their indices.

    Every file is checked (`_check_header`) and decoded once, through ``transform(image, size)``
    (the evaluation crop), which also gives the training split's channel statistics. The files
    are not kept in memory. Raises `DatasetError` for a missing folder, no class folders, a
    validation or test class that training lacks, or a split left without images."""
    if not os.path.isdir(root):
        raise DatasetError(f"--dataset=folder:{root}: no such directory. Give a folder with one subfolder per class.")
    top = _class_folders(root)
    split_roots = {s: os.path.join(root, s) for s in SPLIT_FOLDERS if s in top}
    if split_roots and "train" not in split_roots:
        raise DatasetError(f"{root} has {sorted(split_roots)} folders but no train/ folder: add one, or put the "
                           "class folders at the top.")
    if split_roots and set(top) - set(split_roots):
        raise DatasetError(f"{root} mixes split folders {sorted(split_roots)} with other folders "
                           f"{sorted(set(top) - set(split_roots))}: use either train/ (validation/, test/) or class folders.")
    split_roots = split_roots or {"train": root}
    class_names = tuple(_class_folders(split_roots["train"]))
    if not class_names:
        raise DatasetError(f"{split_roots['train']} has no class subfolders: put each class's images in a folder "
                           "named after the class.")
    for split, folder in split_roots.items():
        extra = set(_class_folders(folder)) - set(class_names)
        if extra:
            raise DatasetError(f"{folder} has classes {sorted(extra)} that {split_roots['train']} lacks.")
    skipped, splits = {}, {}
    for split, folder in split_roots.items():
        candidates = _candidates(folder, class_names, skipped)
        checked = []
        for path, label in candidates:
            reason = _check_header(path, max_pixels)
            if reason:
                skipped.setdefault(reason, []).append(path)
            else:
                checked.append((path, label))
        paths = [p for p, _ in checked]
        labels = np.array([label for _, label in checked], dtype=np.int64)
        good, sums = _decode_pass(paths, image_size, channels, transform, log, split)
        for i in sorted(set(range(len(paths))) - set(good)):
            skipped.setdefault("corrupt (does not decode)", []).append(paths[i])
        if not good:
            raise DatasetError(f"{folder} has no readable images (of {len(candidates)} candidate files).")
        splits[split] = FileSplit(tuple(paths[i] for i in good), labels[good], image_size, channels, sums)
    return FolderScan(class_names, splits, skipped)


__all__ = ["BMP_BITS", "EXTENSIONS", "FileSplit", "FolderScan", "MAX_IMAGE_PIXELS", "decode", "encoded_size", "header_size",
           "scan_folder"]
