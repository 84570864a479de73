"""The files an export writes: one class per format.

A `Format` names what it needs installed (`require`), writes its file into the version being
exported (`write`, from an `ExportJob`), and runs that file in the runtime that serves it
(`runner`: ``images (N, H, W, C) uint8 -> probabilities (N, classes)``). The export's
`precisions.Precision` chooses the formats and checks each file the same way (`Format.check`):
against the Keras model it was written from, to its precision's bound. A new format is one class
here and its entry in `FORMATS` (a quantized one: a class in `export.int8` and its entry in
`export.int8.QUANTIZED`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Callable

import numpy as np

from export import onnx_files, runtimes, signatures, tf_serving
from export.verify import (CONVERTED_FLOAT32_TOLERANCE, FLOAT32_TOLERANCE, ExportError, Top1Agreement, read_images,
                           verification_images)

EXTRA = tf_serving.EXTRA  # every other file of an export goes beside TensorFlow Serving's
METADATA = os.path.join(EXTRA, "metadata.json")  # read back by the runners (limits) and by users
# How many images a file quantized with calibration measures its activations' ranges on (NNCF's default).
CALIBRATION_IMAGES = 300


@dataclasses.dataclass
class ExportJob:
    """One export in progress: what every format reads.

    ``model`` is the trained float32 model every file is compared with; ``serving`` its serving
    copy (`sa_conv.freeze_for_inference`) in the export's precision, which the files are written
    from; ``directory`` the version being written (the SavedModel's root); ``images`` uint8
    ``(N, H, W, C)`` verification images (``source`` says which) and ``expected`` the float32
    model's probabilities ``(N, classes)`` on them; ``results`` the run's results (with its
    ``train_config``) and ``calibration_images`` a user's file of images to calibrate on."""

    model: object
    serving: object
    precision: object
    directory: str
    model_name: str
    class_names: list
    images: np.ndarray
    source: str
    expected: np.ndarray
    agreement: Top1Agreement
    max_image_pixels: int = signatures.DEFAULT_MAX_IMAGE_PIXELS
    max_batch_size: int = signatures.DEFAULT_MAX_BATCH_SIZE
    tf_serving_files: bool = True
    log: Callable = print
    runners: dict = dataclasses.field(default_factory=dict)
    saved_model: object = None  # the SavedModel once written, as `tf.saved_model.load` returns it
    results: dict = dataclasses.field(default_factory=dict)
    calibration_images: str | None = None

    def __post_init__(self):
        # A user's file is read now: a bad one stops the export before it writes anything.
        self._calibration = None if not self.calibration_images else (
            read_images(self.calibration_images, self.model.inputs[0].shape[1:], "--calibration_images"),
            f"images of {self.calibration_images}")

    def calibration(self) -> tuple[np.ndarray, str]:
        """``(uint8 images (N, H, W, C), a description)`` a quantized file calibrates on: those of
        ``calibration_images``, else up to `CALIBRATION_IMAGES` training images of the run's own
        dataset (local files; the agreement reads its test images), else generated ones."""
        if self._calibration:
            return self._calibration
        return verification_images(self.results, self.model.inputs[0].shape[1:], count=CALIBRATION_IMAGES,
                                   split="train")

    def path(self, fmt: "Format") -> str:
        return os.path.join(self.directory, fmt.file)

    def served(self, fmt: "Format"):
        """``fmt``'s file as a function of images, made once per export."""
        if fmt.name not in self.runners:
            self.runners[fmt.name] = fmt.runner(self.path(fmt))
        return self.runners[fmt.name]


class Format:
    """One exported file. ``name`` is its key in ``--formats`` and ``metadata.json``; ``file`` its
    path in the version directory; ``what`` how messages name it; ``tolerance`` the largest
    |difference| of probabilities from the float32 Keras model accepted in float32."""

    name: str
    file: str
    what: str
    tolerance = CONVERTED_FLOAT32_TOLERANCE
    calibrates = False  # whether the file is quantized with ranges measured on `ExportJob.calibration` images
    # The modules the file is written or checked with, and the message naming their install.
    packages: tuple = ()
    missing: str = ""
    install: str = ""  # what it needs and the command, for a file the user did not ask for by --formats

    def require(self) -> None:
        """ExportError (`missing`) when one of `packages` cannot be imported; called before
        anything is written."""
        for package in self.packages:
            try:
                importlib.import_module(package)
            except ImportError:
                raise ExportError(self.missing) from None

    def write(self, job: ExportJob) -> dict:
        """Writes the file; returns what ``metadata.json`` records of it."""
        raise NotImplementedError

    def runner(self, path: str) -> Callable[[np.ndarray], np.ndarray]:
        """``images (N, H, W, C) uint8 -> probabilities (N, classes)`` of the file at ``path``."""
        raise NotImplementedError

    def check(self, job: ExportJob) -> dict:
        """The file against the Keras model, as the export's precision checks a file of it:
        ``{"max_abs_error", "tolerance"}`` (and the top-1 agreement where the precision asks)."""
        return job.precision.check(self, job.served(self), job)


class SavedModel(Format):
    """The SavedModel TensorFlow Serving loads (the version directory itself), with its
    signatures (`signatures.build_archive`) and, when asked, TensorFlow Serving's batching
    parameters and warm-up records (`tf_serving.write_files`), written once the SavedModel has
    passed its check (they time it)."""

    name = "saved_model"
    file = ""
    what = "SavedModel"
    tolerance = FLOAT32_TOLERANCE  # the same graph as the Keras model's, in TensorFlow

    def write(self, job):
        import tensorflow as tf

        archive = signatures.build_archive(job.serving, job.class_names, job.max_image_pixels, job.max_batch_size)
        archive.write_out(job.directory, verbose=False)
        os.makedirs(os.path.join(job.directory, EXTRA), exist_ok=True)
        loaded = tf.saved_model.load(job.directory)
        job.runners[self.name] = self._served(loaded, job.max_batch_size)
        job.saved_model = loaded
        return {"signatures": sorted(loaded.signatures.keys())}

    def check(self, job):
        checked = super().check(job)
        files = None
        if job.tf_serving_files:
            files = tf_serving.write_files(job.directory, job.saved_model, job.model_name, job.images,
                                           job.max_batch_size, job.log)
        return {**checked, "tf_serving": files}

    def runner(self, path):
        """The published version at ``path``, in requests of at most its ``--max_batch_size``."""
        import json

        import tensorflow as tf

        metadata = os.path.join(path, METADATA)
        limit = signatures.DEFAULT_MAX_BATCH_SIZE
        if os.path.isfile(metadata):
            with open(metadata) as f:
                limit = json.load(f).get("limits", {}).get("max_batch_size", limit)
        return self._served(tf.saved_model.load(path), limit)

    @staticmethod
    def _served(loaded, max_batch_size):
        import tensorflow as tf

        serve = loaded.signatures["serving_default"]
        return lambda images: np.concatenate([
            serve(images=tf.constant(images[i: i + max_batch_size]))["probabilities"].numpy()
            for i in range(0, len(images), max_batch_size)])


class TFLite(Format):
    """The SavedModel's ``serving_default`` as a TFLite file, builtin ops only (LiteRT has no
    TensorFlow-op delegate: an op without a TFLite kernel fails here, by name, not when served)."""

    name = "tflite"
    file = os.path.join(EXTRA, "model.tflite")
    what = "TFLite model"
    packages = ("ai_edge_litert",)
    missing = f"--formats=tflite checks the file in LiteRT: {runtimes.LITERT_INSTALL}."

    def write(self, job):
        import tensorflow as tf

        converter = tf.lite.TFLiteConverter.from_saved_model(job.directory, signature_keys=["serving_default"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        with open(job.path(self), "wb") as f:
            f.write(converter.convert())
        return {"file": self.file}

    def runner(self, path):
        return runtimes.tflite_runner(path)


class Onnx(Format):
    """The serving copy as ONNX (Keras's exporter, through tf2onnx), its constant shapes folded
    (`onnx_files.fold_constant_shapes`), run in ONNX Runtime."""

    name = "onnx"
    file = os.path.join(EXTRA, "model.onnx")
    what = "ONNX model"
    packages = ("onnxruntime", "tf2onnx")
    install = "tf2onnx and onnxruntime: pip install -e '.[onnx]'"
    missing = f"--formats=onnx needs {install}."

    def write(self, job):
        job.serving.export(job.path(self), format="onnx", verbose=False)
        onnx_files.fold_constant_shapes(job.path(self))
        return {"file": self.file}

    def runner(self, path):
        return runtimes.onnx_runner(path)


class OpenVINO(Format):
    """OpenVINO's IR of the serving copy (``model.xml``, its weights in ``model.bin`` beside it;
    Keras's exporter, through `openvino.convert_model`), run in OpenVINO's CPU plugin. It is
    checked in float32 (the plugin's ``INFERENCE_PRECISION_HINT=f32``); ``metadata.json`` records
    the precision the plugin picks by itself on the exporting CPU (bfloat16 where it has
    AVX512_BF16 or AMX), which is what a server that sets no hint runs."""

    name = "openvino"
    file = os.path.join(EXTRA, "openvino", "model.xml")
    what = "OpenVINO model"
    packages = ("openvino",)
    missing = f"--formats=openvino needs OpenVINO: {runtimes.OPENVINO_INSTALL}."

    def write(self, job):
        os.makedirs(os.path.dirname(job.path(self)), exist_ok=True)
        job.serving.export(job.path(self), format="openvino", verbose=False)
        return {"file": self.file, "checked_inference_precision": "f32",
                "default_inference_precision": runtimes.openvino_default_precision()}

    def runner(self, path):
        return runtimes.openvino_runner(path, inference_precision="f32")


# The float files, in the order they are written (TFLite converts the SavedModel).
FORMATS = {fmt.name: fmt for fmt in (SavedModel(), TFLite(), Onnx(), OpenVINO())}
