"""Export trained models as SavedModels for TensorFlow Serving (``python -m export.export``,
``sa-conv-export``).

Layout (TensorFlow Serving's): ``export_dir/<model_name>/<version>/saved_model.pb`` and
``variables/``, with ``assets.extra/metadata.json`` (class names, preset, parameter count, the
training results) and, when asked, ``assets.extra/model.tflite``, ``assets.extra/model.onnx`` and
OpenVINO's IR ``assets.extra/openvino/model.xml`` (each checked against the Keras model before
success is reported; `export.formats`); with ``--precision=int8``, their int8 versions beside them
(`export.int8`). `export` checks the request, then writes and checks each file in turn.

Signatures:

* ``serving_default``: ``images`` uint8 ``(None, H, W, C)`` (the model's input, 32x32x3 for
  CIFAR) -> ``probabilities`` float32 ``(None, classes)``, ``classes`` int64 ``(None,)``,
  ``class_names`` string ``(None,)``. The normalization is inside the graph: clients send raw
  pixels.
* ``predict_encoded``: ``image_bytes`` string ``(None,)`` of PNG, JPEG, BMP or GIF files (what
  the trainer reads from a folder, decoded by the same function, `trainers.image_files.decode`)
  -> the same outputs (shorter side resized to the model's input size and center-cropped, in the
  graph, as evaluation crops). Each image's size is read from its header first: empty, or above
  ``max_image_pixels`` (default 4096 x 4096) as sent or once resized, it is refused before decoding.
* ``attention_maps`` (attention models): ``images`` as above and ``query_pixel`` int32 ``(2,)``
  (row, col on the attention grid) -> ``attention`` float32 ``(None, layers, heads, H, W)``, the
  probabilities of every layer and head for that query (a layer with fewer heads, after
  `sa_conv.prune_heads`, is padded with all-zero maps).

Every signature refuses batches above ``max_batch_size`` (default 256); both limits are set at
export (``--max_image_pixels``, ``--max_batch_size``) and recorded in ``metadata.json``.

The write is atomic: the SavedModel is written to a temporary directory beside the target and
renamed into place, so a crash never leaves a partial version that a server would load. An
existing version is replaced only with ``--overwrite``.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
if __name__ == "__main__" and sys.path and os.path.realpath(sys.path[0]) == _HERE:
    # Run as a script (Bazel's export_model binary, `python export/export.py`): Python put this
    # file's folder first on the path, where `export` would name this file, not its package.
    del sys.path[0]

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import dataclasses
import re
import shutil
import socket
import uuid
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

import sa_conv
from export import precisions, tf_serving, verify
from export.formats import FORMATS as FLOAT_FORMATS
from export.formats import METADATA, ExportJob
from export.signatures import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_IMAGE_PIXELS, build_archive  # noqa: F401
from export.verify import (ExportError, Top1Agreement, bfloat16_probability_tolerance, read_images,  # noqa: F401
                           verification_images)
from trainers import cli, files, run_files
from trainers import data as data_lib

FORMATS = tuple(FLOAT_FORMATS)
# The agreement guard's minimum (`verify.MIN_TOP1_AGREEMENT`), read by every export from here.
MIN_TOP1_AGREEMENT = verify.MIN_TOP1_AGREEMENT


# ------------------------------------------------------------------------------ export


def export(
    model_dir: str | None = None,
    model_path: str | None = None,
    export_dir: str = "exported",
    model_name: str | None = None,
    version: int | None = None,
    overwrite: bool = False,
    formats=("saved_model",),
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    precision: str = "float32",
    agreement_images: str | None = None,
    calibration_images: str | None = None,
    image_size: int | None = None,
    tf_serving_files: bool = True,
    log=print,
) -> str:
    """Exports a trained model; returns the version directory. Flag-free, see the module doc."""
    precision, chosen = requested_files(formats, precision, max_image_pixels, max_batch_size)
    if calibration_images and not any(fmt.calibrates for fmt in chosen):
        raise ExportError("--calibration_images calibrates the int8 OpenVINO file, which this export does not write: "
                          "add --precision=int8 --formats=saved_model,openvino, or leave it out.")
    if agreement_images and not precision.checks_agreement:
        log(f"--agreement_images {agreement_images} is not used: {precision.name} files ({precision.why}) are checked "
            "against the Keras model to float32's bound, not by top-1 agreement.")
        agreement_images = None
    path, results = resolve_model(model_dir, model_path)
    model = resized(load_keras_model(path), image_size)
    height, width = model.inputs[0].shape[1:3]
    if max_image_pixels < height * width:  # predict_encoded resizes every image to the input's pixels
        raise ExportError(f"--max_image_pixels={max_image_pixels} is below the model's input of {height} x {width} = "
                          f"{height * width} pixels: predict_encoded would refuse every image. Use at least "
                          f"{height * width}.")
    names = class_names(model, results)
    model_name, version, target = destination(export_dir, model_name or results.get("preset") or model.name,
                                              version, overwrite)
    for removed in remove_abandoned(os.path.dirname(target)):
        log(f"Removed {removed}: the temporary folder of an export that stopped before it finished.")
    tmp = os.path.join(os.path.dirname(target), f"{TMP_PREFIX}{version}-{socket.gethostname()}-{os.getpid()}-"
                                                f"{uuid.uuid4().hex[:8]}")
    try:
        images, source = verification_images(results, model.inputs[0].shape[1:])
        image_shape = model.inputs[0].shape[1:]
        job = ExportJob(
            model=model, serving=precision.serving_copy(model), precision=precision, directory=tmp,
            model_name=model_name, class_names=names, images=images, source=source,
            expected=tf.nn.softmax(model.predict(images, verbose=0)).numpy(),
            agreement=Top1Agreement(model, results, agreement_images, image_shape, MIN_TOP1_AGREEMENT),
            max_image_pixels=max_image_pixels, max_batch_size=max_batch_size, tf_serving_files=tf_serving_files,
            log=log, results=results, calibration_images=calibration_images)
        checks = {}
        for fmt in chosen:  # each file written, then checked against the Keras model
            checks[fmt.name] = {**fmt.write(job), **fmt.check(job)}
        meta = metadata(job, chosen, checks, version, path, results)
        files.write_json(os.path.join(tmp, METADATA), meta, sort_keys=True)
        publish(tmp, target, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(summary(job, chosen, checks, target, version))
    return target


# ------------------------------------------------------------------------------ its steps


def requested_files(formats, precision: str, max_image_pixels: int, max_batch_size: int):
    """``(the Precision, the Formats to write in order)`` of the request; ExportError naming a
    wrong setting before anything is loaded or written."""
    for name, value in (("max_image_pixels", max_image_pixels), ("max_batch_size", max_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(f"--{name} must be a positive integer, got {value!r}.")
    formats = tuple(formats)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or "saved_model" not in formats:
        raise ExportError(f"--formats must include saved_model and be among {FORMATS}, got {list(formats)}.")
    chosen_precision = precisions.resolve(precision)
    chosen = chosen_precision.formats(formats)
    for fmt in chosen:
        try:
            fmt.require()
        except ExportError:
            if fmt.name in formats or fmt.name not in chosen_precision.added:
                raise
            # The user did not ask for this file: say which setting writes it.
            raise ExportError(f"--precision={chosen_precision.name} also writes the float32 {fmt.what} "
                              f"({chosen_precision.added[fmt.name]}), which needs {fmt.install}.") from None
    return chosen_precision, chosen


def resolve_model(model_dir: str | None, model_path: str | None) -> tuple[str, dict]:
    """The ``.keras`` file to export and what is known of its training (may be empty)."""
    if bool(model_dir) == bool(model_path):
        raise ExportError("Give exactly one of --model_dir (a trainer output) or --model_path (a .keras file).")
    results = {}
    if model_dir:
        path = os.path.join(model_dir, run_files.MODEL)
        if not os.path.isfile(path):
            raise ExportError(
                f"{model_dir!r} has no model.keras: is it a finished sa-conv-train --model_dir?"
            )
        results = run_files.read_results(model_dir) or {}
        train_config = run_files.read_config(model_dir)
        if train_config is not None:
            results["train_config"] = train_config
        return path, results
    if not os.path.isfile(model_path):
        raise ExportError(f"--model_path {model_path!r} does not exist.")
    if not model_path.endswith(".keras"):
        raise ExportError(f"--model_path {model_path!r} is not a .keras file.")
    return model_path, results


def load_keras_model(path: str) -> keras.Model:
    """The model saved at ``path``, computing in float32: one trained under a mixed policy
    (``--mixed_precision``; its variables are float32) is moved to float32, as every file's
    check compares it with the float32 SavedModel; ``--precision`` decides what is served."""
    try:
        model = keras.models.load_model(path)
    except Exception as exc:  # corrupt zip, unknown layer, ...
        raise ExportError(f"Cannot load {path!r} as a Keras model ({type(exc).__name__}: {exc}).") from None
    if any(layer.dtype_policy.compute_dtype != "float32" for layer in model.layers):
        model = sa_conv.with_dtype_policy(model, "float32")
    return model


def resized(model: keras.Model, image_size: int | None) -> keras.Model:
    """``model`` at another input size than training's (`sa_conv.with_image_size`), when asked:
    every check of the export compares the files with this model."""
    if image_size is None or image_size == model.inputs[0].shape[1]:
        return model
    try:
        return sa_conv.with_image_size(model, image_size)
    except ValueError as exc:
        raise ExportError(f"--image_size: {exc}") from None


def next_version(model_root: str) -> int:
    """One more than the largest integer version directory, or 1."""
    versions = [int(d) for d in os.listdir(model_root) if d.isdigit()] if os.path.isdir(model_root) else []
    return max(versions, default=0) + 1


def destination(export_dir: str, model_name: str, version: int | None, overwrite: bool) -> tuple[str, int, str]:
    """``(model name, version, the version's directory)``, the model's directory created."""
    if not model_name or "/" in model_name or model_name.startswith("."):
        raise ExportError(f"--model_name {model_name!r} is not a valid directory name.")
    model_root = os.path.join(export_dir, model_name)
    version = next_version(model_root) if version is None else int(version)
    if version < 1:
        raise ExportError(f"--version must be a positive integer, got {version}.")
    target = os.path.join(model_root, str(version))
    if os.path.exists(target) and not overwrite:
        raise ExportError(f"{target} exists: choose another --version or pass --overwrite.")
    os.makedirs(model_root, exist_ok=True)
    return model_name, version, target


# An export writes its version in ``.tmp-<version>-<host>-<pid>-<hex>`` beside the versions (a server
# reads only integer folders), then renames it; ``-old`` marks a replaced version being removed.
TMP_PREFIX = ".tmp-"


def remove_abandoned(model_root: str) -> list[str]:
    """Removes the temporary folders in ``model_root`` of exports on this host whose process is gone
    (killed before its ``finally``); returns their paths. A replaced version moved aside (``-old``)
    is removed only once its successor is in place: otherwise it is the only copy."""
    host = socket.gethostname()
    pattern = re.compile(rf"{re.escape(TMP_PREFIX)}(\d+)-{re.escape(host)}-(\d+)-[0-9a-f]+(-old)?$")
    removed = []
    for name in sorted(os.listdir(model_root)) if os.path.isdir(model_root) else []:
        match = pattern.match(name)
        if not match or _alive(int(match.group(2))):
            continue
        if match.group(3) and not os.path.isdir(os.path.join(model_root, match.group(1))):
            continue
        shutil.rmtree(os.path.join(model_root, name), ignore_errors=True)
        removed.append(os.path.join(model_root, name))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def class_names(model: keras.Model, results: dict) -> list:
    """The training's class names, else CIFAR-10's for 10 classes, else ``class_<i>``."""
    num_classes = int(model.outputs[0].shape[-1])
    names = results.get("label_names") or (
        list(data_lib.CIFAR10_LABEL_NAMES) if num_classes == 10 else [f"class_{i}" for i in range(num_classes)])
    if len(names) != num_classes:
        raise ExportError(f"The model has {num_classes} outputs but {len(names)} class names are recorded.")
    return list(names)


def _count_batch_norms(model):
    return sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)


# What `metadata` records elsewhere than under "files": the checks' results and the SavedModel's signatures.
_CHECKED = ("max_abs_error", "tolerance", "signatures", "tf_serving", "top1_agreement", "agreement_images")


def metadata(job: ExportJob, chosen, checks: dict, version: int, path: str, results: dict) -> dict:
    """``assets.extra/metadata.json`` of the export ``job`` whose files were checked so (``checks``:
    ``{format name: {**what it wrote, **what its check measured}}``)."""
    model, saved_model = job.model, checks["saved_model"]
    folds = sa_conv.serving.summary(job.serving)
    return {
        "model_name": job.model_name,
        "version": version,
        "preset": results.get("preset", model.name),
        "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        "class_names": job.class_names,
        # (height, width, channels) every file takes: the trained size, or --image_size's.
        "image_shape": [int(d) for d in model.inputs[0].shape[1:]],
        "signatures": saved_model["signatures"],
        "limits": {"max_image_pixels": job.max_image_pixels, "max_batch_size": job.max_batch_size},
        "precision": job.precision.record(checks),
        # What each float file's format recorded of it (its path; OpenVINO's inference precisions).
        "files": {fmt.name: {k: v for k, v in checks[fmt.name].items() if k not in _CHECKED}
                  for fmt in chosen if "max_abs_error" in checks[fmt.name]},
        # Per block with constants (position-only probabilities on this path, or a content
        # encoding's position term: "dense").
        "attention_constants": folds["attention_constants"],
        # Linear maps folded into the one before them, per kind (sa_conv.freeze_for_inference).
        "maps_folded": folds["maps_folded"],
        # Batch norms folded into the convolution before them (the ResNet's): one conv with bias each.
        "batch_norms_folded": _count_batch_norms(model) - _count_batch_norms(job.serving),
        "source": os.path.abspath(path),
        "training_results": {k: v for k, v in results.items() if k != "train_config"},
        "verification": {"images": f"{len(job.images)} {job.source}",
                         "max_abs_error": {name: c["max_abs_error"] for name, c in checks.items() if "max_abs_error" in c},
                         "saved_model_tolerance": saved_model["tolerance"],
                         # Every file's bound on its probabilities, and the low-precision files' agreement minimum.
                         "tolerance": {name: c["tolerance"] for name, c in checks.items() if "tolerance" in c},
                         "min_top1_agreement": job.agreement.minimum if job.precision.checks_agreement else None},
        "process": process.describe(),  # what the export and its verification ran with
        # TensorFlow Serving's warm-up records and batching parameters (measured by this export).
        "tf_serving": saved_model["tf_serving"],
    }


def summary(job: ExportJob, chosen, checks: dict, target: str, version: int) -> str:
    """The line the export logs when it is done."""
    errors = ", ".join(f"{name} max error {c['max_abs_error']:.2g}" for name, c in checks.items() if "max_abs_error" in c)
    agreements = "".join(
        f"; {job.precision.describe(fmt)} top-1 agrees with float32 on {checks[fmt.name]['top1_agreement']:.2%} of "
        f"{checks[fmt.name]['agreement_images']}" for fmt in chosen if "top1_agreement" in checks[fmt.name])
    return (f"Exported {job.model_name} version {version} to {target} (signatures: "
            f"{', '.join(checks['saved_model']['signatures'])}; checked on {len(job.images)} {job.source}: "
            f"{errors}{agreements})")


def publish(tmp: str, target: str, overwrite: bool = False) -> None:
    """Moves the finished version ``tmp`` to ``target`` by renames, so that a server never sees
    half a version; with ``overwrite`` an existing version is moved aside first, then removed.
    Without it, a version that appeared while this export ran (another export's) is kept and
    this one refused."""
    if os.path.exists(target):
        if not overwrite:
            raise ExportError(f"{target} appeared while this export ran (another export of the same model?); it is "
                              "kept and this export is not published. Run again for the next version, or pass "
                              "--overwrite.")
        trash = f"{tmp}-old"
        os.rename(target, trash)
        os.rename(tmp, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, target)


# ------------------------------------------------------------------------------ CLI

_field = cli.config_field


@dataclasses.dataclass
class ExportConfig:
    model_dir: Optional[str] = _field(None, "A trainer output directory (uses its model.keras and results.json).")
    model_path: Optional[str] = _field(None, "A .keras file (instead of --model_dir).")
    export_dir: str = _field("exported", "Root of the TensorFlow Serving model directories.")
    model_name: Optional[str] = _field(None, "Model name (directory); default: the preset.")
    version: Optional[int] = _field(None, "Version number; default: the next free integer.")
    overwrite: bool = _field(False, "Replace an existing version.")
    formats: tuple = _field(("saved_model",), f"Comma-separated formats among {', '.join(FORMATS)}.")
    max_image_pixels: int = _field(DEFAULT_MAX_IMAGE_PIXELS, "predict_encoded refuses images with more pixels, as "
                                   "sent or once resized to the input (read from the header before decoding).")
    max_batch_size: int = _field(DEFAULT_MAX_BATCH_SIZE, "Every signature refuses requests with more images.")
    precision: str = _field(
        "float32", "bfloat16: compute in bfloat16 (float32 weights and encodings), checked to pick the "
        "float32 model's class on >= 99% of held-out images; auto: bfloat16 on CPUs with AVX512_BF16/AMX and GPUs "
        "of compute capability 8.0+, else float32; int8: int8 files beside the float32 SavedModel "
        "(assets.extra/model_int8.onnx, ONNX Runtime's dynamic quantization; with --formats=...,tflite also "
        "model_int8.tflite, the TFLite converter's dynamic-range quantization; with openvino also "
        "openvino/model_int8.xml, NNCF's quantization calibrated on images), each checked the same way.",
        precisions.CHOICES)
    agreement_images: Optional[str] = _field(
        None, "A .npy/.npz file of uint8 images for the bfloat16 and int8 agreement checks; default: the run's own "
        "test images when its dataset is on local files, else generated ones.")
    calibration_images: Optional[str] = _field(
        None, "A .npy/.npz file of uint8 images the int8 OpenVINO file (--precision=int8 --formats=...,openvino) "
        "measures its activations' ranges on; default: up to 300 of the run's own training images when its dataset "
        "is on local files, else generated ones.")
    image_size: Optional[int] = _field(
        None, "Serve another input size than training's (offset-function encodings as they are, learned offset "
        "tables interpolated: sa_conv.with_image_size); default: the trained size.")
    tf_serving_files: bool = _field(
        True, "Write TensorFlow Serving's assets.extra/batching_params.pbtxt (from the throughput this export measures "
        f"at doubling batches) and tf_serving_warmup_requests (needs `{tf_serving.INSTALL}`).")


def main():
    config = cli.make(ExportConfig, cli.settings(ExportConfig))
    export(**{k: v for k, v in dataclasses.asdict(config).items()})


def run():
    """Console script ``sa-conv-export``."""
    cli.run("sa-conv-export", main, ExportConfig)


if __name__ == "__main__":
    run()
