"""What an export checks its files with: images, the bounds of each precision, the top-1 guard.

Every exported file is compared with the Keras model it was written from (`export.formats`):
its probabilities within the bound of its precision (`FLOAT32_TOLERANCE`, `bfloat16_probability_tolerance`), and, for a
low-precision file, the float32 model's class on at least `Top1Agreement.minimum` of held-out
images."""

from __future__ import annotations

import os

import numpy as np

from sa_conv.errors import SaConvError
from trainers import data as data_lib
from trainers import run_files


class ExportError(SaConvError):
    """The export cannot be done as asked; the message names the problem and the fix."""


# How far an export's probabilities may be from the Keras model's it was written from, in the same
# precision. float32: two executions of one graph differ by the order of their sums (measured below
# 1e-6). bfloat16 keeps 8 significant bits: one rounding moves a value by up to 2**-9 of it, and the
# SavedModel and Keras's predict round the same activations through differently fused kernels, a
# few roundings of the logits' scale that grow with depth (measured up to 1.2e-3 on probabilities
# for the paper presets, so no fixed bound of that size holds); 2**-6 of the logits' scale leaves
# room for that and not for a changed computation, which moves them by tenths. The user's own
# criterion, top-1 agreement with float32 (`Top1Agreement`), is checked besides.
FLOAT32_TOLERANCE = 1e-5
BFLOAT16_LOGIT_TOLERANCE = 2 ** -6
# A file converted to another runtime's graph (TFLite, ONNX) computes float32 in other kernels and
# fused orders than TensorFlow's: its probabilities are held to this.
CONVERTED_FLOAT32_TOLERANCE = 1e-4
# A low-precision file must pick the float32 model's class on this share of held-out images.
MIN_TOP1_AGREEMENT = 0.99


def bfloat16_probability_tolerance(logits) -> float:
    """The largest |difference| of probabilities the export accepts for a bfloat16 file computed
    from a model with these ``logits`` ``(images, classes)``: half of `BFLOAT16_LOGIT_TOLERANCE`
    times the logits' largest magnitude (at least 1), since the softmax moves no probability by
    more than half the largest change of a logit (its Jacobian's rows sum to ``2 p (1 - p) <= 1/2``
    in absolute value). A float32 file's is `FLOAT32_TOLERANCE`."""
    return BFLOAT16_LOGIT_TOLERANCE * max(1.0, float(np.abs(np.asarray(logits)).max())) / 2


def max_error(what: str, expected, actual, atol: float) -> float:
    """``max |expected - actual|``; ExportError naming ``what`` above ``atol``."""
    error = float(np.abs(np.asarray(expected) - np.asarray(actual)).max())
    if not error <= atol:
        raise ExportError(f"{what} disagrees with the Keras model: max |difference| {error:.3g} > {atol:.3g}.")
    return error


def verification_images(results: dict, image_shape, count: int = 16, split: str = "test") -> tuple[np.ndarray, str]:
    """Real images of ``split`` (``test`` or ``train``) of the dataset the model was trained on
    when it is on local files here (the official python files, or a folder dataset), at the model's
    input size as its evaluation saw them, else generated ones of the model's input shape; and a
    word saying which."""
    config = results.get("train_config", {})
    dataset, data_dir = run_files.data_location(config)
    missing = ""
    unreadable = f" (the run's data, {dataset}{f' in {data_dir}' if data_dir else ''}, is not readable here)"
    if dataset:
        try:
            source = data_lib.get_source(dataset)
            fmt = getattr(source, "fmt", None)
            local = isinstance(source, data_lib.FolderSource) or (fmt is not None and data_dir and fmt.find(data_dir))
            if local:  # never a download
                loaded = source.load(data_dir, config.get("seed", 0), image_size=config.get("image_size"))
                images = data_lib.head(getattr(loaded, split), count, int(image_shape[0]))
                if images.shape[1:] == tuple(image_shape):
                    return images, f"{split} images"
            elif fmt is not None and data_dir and not os.path.isdir(data_dir):  # moved, or the run copied here
                missing = unreadable
        except data_lib.DatasetError:
            missing = unreadable
    generated = data_lib.make_synthetic(num_train=1, num_test=count, seed=0, image_shape=tuple(image_shape))
    return generated.test.images, f"generated images{missing}"


def read_images(path: str, image_shape, flag: str = "--agreement_images") -> np.ndarray:
    """uint8 images ``(N, H, W, C)`` of the model's input shape from a ``.npy`` file or an
    ``.npz`` file's ``images`` (or only) array; ExportError naming ``flag``, the setting that gave ``path``."""
    try:
        loaded = np.load(path, allow_pickle=False)  # an array (.npy) or an archive of arrays (.npz)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                array = loaded["images"] if "images" in loaded.files else loaded[loaded.files[0]]
        else:
            array = loaded
    except (OSError, ValueError, IndexError) as exc:
        raise ExportError(f"{flag}: cannot read {path} ({exc}).") from None
    if array.ndim != 4 or tuple(array.shape[1:]) != tuple(image_shape) or len(array) == 0:
        raise ExportError(f"{flag}: {path} holds {array.shape}; the model takes (N, "
                          f"{', '.join(map(str, image_shape))}) images.")
    if array.dtype.kind not in "biuf":
        raise ExportError(f"{flag}: {path} holds {array.dtype} values; the model takes pixel values 0-255 (uint8).")
    low, high = float(array.min()), float(array.max())
    if not (0 <= low and high <= 255) or (array.dtype.kind == "f" and high <= 1):  # NaN fails the first
        raise ExportError(f"{flag}: {path} holds {array.dtype} values in [{low:g}, {high:g}]; the model takes pixel "
                          "values 0-255 (uint8), as its images come to it (floats in [0, 1]: multiply by 255).")
    return np.rint(array).astype(np.uint8)


class Top1Agreement:
    """The check that an exported low-precision file picks the float32 ``model``'s class on at
    least ``minimum`` (`MIN_TOP1_AGREEMENT`) of held-out images: those of ``agreement_images``, else up to 1,000 test
    images of the run's own dataset (local files), else generated ones. The float32 classes are
    computed on the first check and kept for the export's other low-precision files (a pass of a
    paper-size model over 1,000 images is the slowest step of a low-precision export)."""

    def __init__(self, model, results: dict, agreement_images: str | None, image_shape,
                 minimum: float = MIN_TOP1_AGREEMENT):
        self.model, self.results, self.agreement_images, self.image_shape = model, results, agreement_images, image_shape
        self.minimum = minimum
        self._reference = None
        # A user's file is read now: a bad one stops the export before it writes anything.
        self._images = read_images(agreement_images, image_shape) if agreement_images else None

    def reference(self) -> tuple[np.ndarray, np.ndarray, str]:
        """``(images (N, H, W, C) uint8, float32 classes (N,), a description of the images)``."""
        if self._reference is None:
            if self.agreement_images:
                images, source = self._images, f"images of {self.agreement_images}"
            else:
                images, source = verification_images(self.results, self.image_shape, count=1000)
            classes = np.argmax(self.model.predict(images, verbose=0), axis=-1)
            self._reference = images, classes, f"{len(images)} {source}"
        return self._reference

    def __call__(self, served, what: str) -> dict:
        """``{"top1_agreement", "agreement_images"}`` of ``served`` (images -> probabilities),
        the low-precision file ``what``; ExportError below ``minimum``."""
        images, want, described = self.reference()
        agreement = float(np.mean(want == np.argmax(served(images), axis=-1)))
        if agreement < self.minimum:
            raise ExportError(
                f"The {what} picks the float32 model's class on {agreement:.2%} of {described}, below "
                f"{self.minimum:.0%}: export in float32 (--precision=float32).")
        return {"top1_agreement": agreement, "agreement_images": described}
