"""Export trained models as SavedModels for TensorFlow Serving (``python -m export.export``,
``sa-conv-export``).

Layout (TensorFlow Serving's): ``export_dir/<model_name>/<version>/saved_model.pb`` and
``variables/``, with ``assets.extra/metadata.json`` (class names, preset, parameter count, the
training results) and, when asked, ``assets.extra/model.tflite`` and ``assets.extra/model.onnx``
(each checked against the Keras model before success is reported); with ``--precision=int8``,
their int8 versions beside them (`export.int8`).

Signatures:

* ``serving_default``: ``images`` uint8 ``(None, H, W, C)`` (the model's input, 32x32x3 for
  CIFAR) -> ``probabilities`` float32 ``(None, classes)``, ``classes`` int64 ``(None,)``,
  ``class_names`` string ``(None,)``. The normalization is inside the graph: clients send raw
  pixels.
* ``predict_encoded``: ``image_bytes`` string ``(None,)`` of PNG, JPEG, BMP or GIF files (what
  the trainer reads from a folder, decoded by the same function, `trainers.image_files.decode`)
  -> the same outputs (shorter side resized to the model's input size and center-cropped, in the
  graph, as evaluation crops). Each image's size is read from its header first: empty, or above
  ``max_image_pixels`` (default 4096 x 4096), it is refused before decoding.
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
import json
import shutil
import uuid
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

import sa_conv
from export import int8, onnx_files, runtimes, tf_serving
from trainers import cli, files, image_files
from trainers import data as data_lib
from sa_conv.errors import SaConvError
from trainers import precision as precision_lib

FORMATS = ("saved_model", "tflite", "onnx")
METADATA = os.path.join("assets.extra", "metadata.json")
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_BATCH_SIZE = 256


class ExportError(SaConvError):
    """The export cannot be done as asked; the message names the problem and the fix."""


# ------------------------------------------------------------------------------ inputs


def resolve_model(model_dir: str | None, model_path: str | None) -> tuple[str, dict]:
    """The ``.keras`` file to export and what is known of its training (may be empty)."""
    if bool(model_dir) == bool(model_path):
        raise ExportError("Give exactly one of --model_dir (a trainer output) or --model_path (a .keras file).")
    results = {}
    if model_dir:
        path = os.path.join(model_dir, "model.keras")
        if not os.path.isfile(path):
            raise ExportError(
                f"{model_dir!r} has no model.keras: is it a finished sa-conv-train --model_dir?"
            )
        results_path = os.path.join(model_dir, "results.json")
        if os.path.isfile(results_path):
            with open(results_path) as f:
                results = json.load(f)
        config_path = os.path.join(model_dir, "config.json")
        if os.path.isfile(config_path):
            with open(config_path) as f:
                results["train_config"] = json.load(f)
        return path, results
    if not os.path.isfile(model_path):
        raise ExportError(f"--model_path {model_path!r} does not exist.")
    if not model_path.endswith(".keras"):
        raise ExportError(f"--model_path {model_path!r} is not a .keras file.")
    return model_path, results


def load_keras_model(path: str) -> keras.Model:
    try:
        return keras.models.load_model(path)
    except Exception as exc:  # corrupt zip, unknown layer, ...
        raise ExportError(f"Cannot load {path!r} as a Keras model ({type(exc).__name__}: {exc}).") from None


def next_version(model_root: str) -> int:
    """One more than the largest integer version directory, or 1."""
    versions = [int(d) for d in os.listdir(model_root) if d.isdigit()] if os.path.isdir(model_root) else []
    return max(versions, default=0) + 1


# ------------------------------------------------------------------------------ signatures


def build_archive(model: keras.Model, class_names, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
                  max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> keras.export.ExportArchive:
    """An ExportArchive with the signatures described in the module docstring. Requests with
    more than ``max_batch_size`` images, or an encoded image of more than ``max_image_pixels``
    pixels (read from its header, before decoding), fail with InvalidArgumentError."""
    height, width, channels = model.inputs[0].shape[1:]
    names = tf.constant([str(n) for n in class_names])
    archive = keras.export.ExportArchive()
    archive.track(model)

    def check_batch(size):
        tf.debugging.assert_positive(size, message="empty batch: send at least one image")
        tf.debugging.assert_less_equal(
            tf.cast(size, tf.int64), tf.constant(max_batch_size, tf.int64),
            message=f"batch larger than max_batch_size={max_batch_size} images (set at export with --max_batch_size)")

    def outputs(images):
        check_batch(tf.shape(images)[0])
        logits = tf.cast(model(images, training=False), tf.float32)
        probabilities = tf.nn.softmax(logits, axis=-1)
        classes = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "classes": classes, "class_names": tf.gather(names, classes)}

    def decode(blob):
        # Each check runs before the next step: nothing is decoded before its size is known, and the
        # decoder is training's own (`image_files.decode`), so an image gives the pixels it trained on.
        size = image_files.encoded_size(blob)
        with tf.control_dependencies([
                tf.debugging.assert_positive(size, message="image_bytes holds an empty image"),
                tf.debugging.assert_less_equal(
                    size[0] * size[1], tf.constant(max_image_pixels, tf.int64),
                    message=f"image larger than max_image_pixels={max_image_pixels} (set at export with "
                            "--max_image_pixels)")]):
            image = image_files.decode(blob, channels, from_bytes=True)
        # As the model was evaluated: shorter side to the input size, then the center crop.
        return data_lib.resize_and_crop(image, height)

    image_spec = tf.TensorSpec((None, height, width, channels), tf.uint8, name="images")
    archive.add_endpoint("serving_default", lambda images: outputs(images), input_signature=[image_spec])

    def predict_encoded(image_bytes):
        check_batch(tf.size(image_bytes))
        images = tf.map_fn(decode, image_bytes, fn_output_signature=tf.TensorSpec((height, width, channels), tf.uint8))
        return outputs(images)

    archive.add_endpoint(
        "predict_encoded", predict_encoded, input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")]
    )
    if sa_conv.attention_blocks(model):
        (gh, gw), _ = sa_conv.attention_grid(model)

        def attention_maps(images, query_pixel):
            check_batch(tf.shape(images)[0])
            tf.debugging.assert_less(query_pixel, tf.constant([gh, gw], tf.int32),
                                     message=f"query_pixel must be (row, col) inside the {gh}x{gw} attention grid")
            tf.debugging.assert_non_negative(query_pixel, message="query_pixel must be non-negative")
            query = query_pixel[0] * gw + query_pixel[1]
            per_layer = sa_conv.attention_probabilities(model, images)
            rows = [tf.gather(p, query, axis=2) for p in per_layer]  # (b, heads_l, N) per layer
            most = max(r.shape[1] for r in rows)  # pruned layers have fewer heads: zero-padded
            maps = tf.stack([tf.pad(r, [[0, 0], [0, most - r.shape[1]], [0, 0]]) for r in rows], axis=1)
            return {"attention": tf.reshape(maps, (-1, len(per_layer), most, gh, gw))}

        archive.add_endpoint(
            "attention_maps", attention_maps,
            input_signature=[image_spec, tf.TensorSpec((2,), tf.int32, name="query_pixel")],
        )
    return archive


# ------------------------------------------------------------------------------ verification


def verification_images(results: dict, image_shape, count: int = 16, split: str = "test") -> tuple[np.ndarray, str]:
    """Real images of ``split`` (``test`` or ``train``) of the dataset the model was trained on
    when it is on local files here (the official python files, or a folder dataset), at the model's
    input size as its evaluation saw them, else generated ones of the model's input shape; and a
    word saying which."""
    config = results.get("train_config", {})
    dataset = config.get("dataset")
    if dataset:
        try:
            source = data_lib.get_source(dataset)
            fmt = getattr(source, "fmt", None)
            local = isinstance(source, data_lib.FolderSource) or (
                fmt is not None and config.get("data_dir") and fmt.find(config["data_dir"]))
            if local:  # never a download
                loaded = source.load(config.get("data_dir"), config.get("seed", 0), image_size=config.get("image_size"))
                images = data_lib.head(getattr(loaded, split), count, int(image_shape[0]))
                if images.shape[1:] == tuple(image_shape):
                    return images, f"{split} images"
        except data_lib.DatasetError:
            pass
    generated = data_lib.make_synthetic(num_train=1, num_test=count, seed=0, image_shape=tuple(image_shape))
    return generated.test.images, "generated images"


# How far an export's probabilities may be from the Keras model's it was written from, in the same
# precision. float32: two executions of one graph differ by the order of their sums (measured below
# 1e-6). bfloat16 keeps 8 significant bits: one rounding moves a value by up to 2**-9 of it, and the
# SavedModel and Keras's predict round the same activations through differently fused kernels, a
# few roundings of the logits' scale that grow with depth (measured up to 1.2e-3 on probabilities
# for the paper presets, against a fixed 1e-3 that refused them); 2**-6 of the logits' scale leaves
# room for that and not for a changed computation, which moves them by tenths. The user's own
# criterion, top-1 agreement with float32 (`Top1Agreement`), is checked besides.
FLOAT32_TOLERANCE = 1e-5
BFLOAT16_LOGIT_TOLERANCE = 2 ** -6


def probability_tolerance(dtype: str, logits) -> float:
    """The largest |difference| of probabilities `_verify` accepts for an export in ``dtype``
    computed from a model with these ``logits`` ``(images, classes)``: float32 `FLOAT32_TOLERANCE`;
    bfloat16 half of `BFLOAT16_LOGIT_TOLERANCE` times the logits' largest magnitude (at least 1),
    since the softmax moves no probability by more than half the largest change of a logit (its
    Jacobian's rows sum to ``2 p (1 - p) <= 1/2`` in absolute value)."""
    if dtype == "float32":
        return FLOAT32_TOLERANCE
    if dtype == "bfloat16":
        return BFLOAT16_LOGIT_TOLERANCE * max(1.0, float(np.abs(np.asarray(logits)).max())) / 2
    raise ValueError(f"No tolerance for dtype {dtype!r}; it is float32 or bfloat16.")


def _verify(name, expected, actual, atol):
    error = float(np.abs(np.asarray(expected) - np.asarray(actual)).max())
    if not error <= atol:
        raise ExportError(f"{name} disagrees with the Keras model: max |difference| {error:.3g} > {atol:.3g}.")
    return error


def export_onnx(model: keras.Model, target: str, images: np.ndarray, expected: np.ndarray) -> float:
    """Writes ``model`` as ONNX (Keras's exporter, through tf2onnx: ``pip install .[onnx]``) and
    checks it with ONNX Runtime against the Keras model's probabilities."""
    try:
        import onnxruntime  # noqa: F401  (only to name the extra when it is missing)
    except ImportError:
        raise ExportError("--formats=onnx needs tf2onnx and onnxruntime: pip install -e '.[onnx]'.") from None
    model.export(target, format="onnx", verbose=False)
    onnx_files.fold_constant_shapes(target)
    return _verify("The ONNX model", expected, runtimes.onnx_runner(target)(images), 1e-4)


def export_tflite(saved_model_dir: str, target: str, images: np.ndarray, expected: np.ndarray) -> float:
    """Writes the SavedModel's ``serving_default`` as TFLite and checks it in LiteRT against the
    Keras model's probabilities."""
    try:
        import ai_edge_litert  # noqa: F401  (only to name the package when it is missing)
    except ImportError:
        raise ExportError(f"--formats=tflite checks the file in LiteRT: {runtimes.LITERT_INSTALL}.") from None
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=["serving_default"])
    # Builtin ops only: LiteRT has no TensorFlow-op (Flex) delegate, so an op without a TFLite
    # kernel fails here, by name, rather than when the file is served.
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    with open(target, "wb") as f:
        f.write(converter.convert())
    return _verify("The TFLite model", expected, runtimes.tflite_runner(target)(images), 1e-4)


def write_tf_serving_files(version_dir: str, loaded, model_name: str, images: np.ndarray, max_batch_size: int,
                           log=print) -> dict:
    """Writes `tf_serving.BATCHING_FILE` from the throughput of ``loaded``'s ``serving_default``
    measured at doubling batches, and `tf_serving.WARMUP_FILE` (when ``tensorflow-serving-api`` is
    installed): every signature at batch 1 and at the batching's largest batch, from the
    verification ``images``. Returns what ``metadata.json`` records of them."""
    serve = loaded.signatures["serving_default"]
    throughput = tf_serving.measure_throughput(lambda **x: serve(**x), {"images": images[0]}, max_batch_size)
    params = tf_serving.batching_parameters(throughput)
    tf_serving.write_batching(os.path.join(version_dir, tf_serving.BATCHING_FILE), params)
    record = {"batching_parameters": tf_serving.BATCHING_FILE, "max_batch_size": params.max_batch_size.value,
              "allowed_batch_sizes": list(params.allowed_batch_sizes),
              "measured_images_per_second": {str(b): round(v, 2) for b, v in throughput.items()}}
    if not tf_serving.available():
        log(f"No TensorFlow Serving warm-up records: {tf_serving.INSTALL} to write them.")
        return {**record, "warmup_requests": 0}
    examples = {}
    for batch in sorted({1, params.max_batch_size.value}):
        chosen = np.resize(images, (batch,) + images.shape[1:])
        png = np.array([tf.io.encode_png(image).numpy() for image in chosen], dtype=object)
        examples.setdefault("serving_default", []).append({"images": chosen})
        examples.setdefault("predict_encoded", []).append({"image_bytes": png})
        if "attention_maps" in loaded.signatures:
            examples.setdefault("attention_maps", []).append({"images": chosen,
                                                              "query_pixel": np.zeros(2, np.int32)})
    logs = tf_serving.warmup_requests(model_name, examples)
    tf_serving.write_warmup(os.path.join(version_dir, tf_serving.WARMUP_FILE), logs)
    return {**record, "warmup_requests": len(logs), "warmup_file": tf_serving.WARMUP_FILE}


MIN_TOP1_AGREEMENT = 0.99


def read_images(path: str, image_shape) -> np.ndarray:
    """uint8 images ``(N, H, W, C)`` of the model's input shape from a ``.npy`` file or an
    ``.npz`` file's ``images`` (or only) array."""
    try:
        loaded = np.load(path, allow_pickle=False)  # an array (.npy) or an archive of arrays (.npz)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                array = loaded["images"] if "images" in loaded.files else loaded[loaded.files[0]]
        else:
            array = loaded
    except (OSError, ValueError, IndexError) as exc:
        raise ExportError(f"--agreement_images: cannot read {path} ({exc}).") from None
    if array.ndim != 4 or tuple(array.shape[1:]) != tuple(image_shape) or len(array) == 0:
        raise ExportError(f"--agreement_images: {path} holds {array.shape}; the model takes (N, "
                          f"{', '.join(map(str, image_shape))}) images.")
    return np.clip(array, 0, 255).astype(np.uint8)


class Top1Agreement:
    """The check that an exported low-precision file picks the float32 ``model``'s class on at
    least `MIN_TOP1_AGREEMENT` of held-out images: those of ``agreement_images``, else up to 1,000
    test images of the run's own dataset (local files), else generated ones. The float32 classes
    are computed on the first check and kept for the export's other low-precision files (a pass
    of a paper-size model over 1,000 images is the slowest step of a low-precision export)."""

    def __init__(self, model, results: dict, agreement_images: str | None, image_shape):
        self.model, self.results, self.agreement_images, self.image_shape = model, results, agreement_images, image_shape
        self._reference = None

    def reference(self) -> tuple[np.ndarray, np.ndarray, str]:
        """``(images (N, H, W, C) uint8, float32 classes (N,), a description of the images)``."""
        if self._reference is None:
            if self.agreement_images:
                images = read_images(self.agreement_images, self.image_shape)
                source = f"images of {self.agreement_images}"
            else:
                images, source = verification_images(self.results, self.image_shape, count=1000)
            classes = np.argmax(self.model.predict(images, verbose=0), axis=-1)
            self._reference = images, classes, f"{len(images)} {source}"
        return self._reference

    def __call__(self, served, what: str) -> dict:
        """``{"top1_agreement", "agreement_images"}`` of ``served`` (images -> probabilities or
        logits), the low-precision file ``what``; ExportError below `MIN_TOP1_AGREEMENT`."""
        images, want, described = self.reference()
        agreement = float(np.mean(want == np.argmax(served(images), axis=-1)))
        if agreement < MIN_TOP1_AGREEMENT:
            raise ExportError(
                f"The {what} picks the float32 model's class on {agreement:.2%} of {described}, below "
                f"{MIN_TOP1_AGREEMENT:.0%}: export in float32 (--precision=float32).")
        return {"top1_agreement": agreement, "agreement_images": described}


# ------------------------------------------------------------------------------ export


def _count_batch_norms(model):
    return sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)


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
    image_size: int | None = None,
    tf_serving_files: bool = True,
    log=print,
) -> str:
    """Exports a trained model; returns the version directory. Flag-free, see the module doc."""
    formats = tuple(formats)
    for name, value in (("max_image_pixels", max_image_pixels), ("max_batch_size", max_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(f"--{name} must be a positive integer, got {value!r}.")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or "saved_model" not in formats:
        raise ExportError(f"--formats must include saved_model and be among {FORMATS}, got {list(formats)}.")
    try:
        dtype, dtype_reason = ("int8", "requested") if precision == "int8" else precision_lib.resolve(precision)
    except ValueError as exc:
        raise ExportError(f"--precision: {exc.args[0].replace('got', 'or int8, got')}") from None
    if dtype == "int8" and "onnx" not in formats:
        formats += ("onnx",)  # the int8 ONNX file starts from the float32 one; see export.int8
    if dtype == "bfloat16" and set(formats) - {"saved_model"}:
        raise ExportError("--precision=bfloat16 writes a SavedModel only; export TFLite and ONNX in float32.")
    path, results = resolve_model(model_dir, model_path)
    model = load_keras_model(path)
    if image_size is not None and image_size != model.inputs[0].shape[1]:
        # Another resolution than training's (sa_conv.with_image_size); every check below compares
        # the export with this resized model.
        try:
            model = sa_conv.with_image_size(model, image_size)
        except ValueError as exc:
            raise ExportError(f"--image_size: {exc}") from None
    model_name = model_name or results.get("preset") or model.name
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
    num_classes = int(model.outputs[0].shape[-1])
    class_names = results.get("label_names") or (
        list(data_lib.CIFAR10_LABEL_NAMES) if num_classes == 10 else [f"class_{i}" for i in range(num_classes)])
    if len(class_names) != num_classes:
        raise ExportError(f"The model has {num_classes} outputs but {len(class_names)} class names are recorded.")
    tmp = os.path.join(model_root, f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    # Position-only attention serves from its precomputed probabilities; the checks below compare
    # every format with the trained model itself.
    serving = sa_conv.freeze_for_inference(
        sa_conv.with_dtype_policy(model, "mixed_bfloat16") if dtype == "bfloat16" else model)
    folds = sa_conv.serving.summary(serving)
    try:
        archive = build_archive(serving, class_names, max_image_pixels, max_batch_size)
        archive.write_out(tmp, verbose=False)
        images, source = verification_images(results, model.inputs[0].shape[1:])
        expected = tf.nn.softmax(model.predict(images, verbose=0)).numpy()
        loaded = tf.saved_model.load(tmp)
        serve = loaded.signatures["serving_default"]

        def served(batch):
            return np.concatenate([serve(images=tf.constant(batch[i: i + max_batch_size]))["probabilities"]
                                   for i in range(0, len(batch), max_batch_size)])

        precision_record = {"dtype": dtype, "why": dtype_reason}
        agreement = Top1Agreement(model, results, agreement_images, model.inputs[0].shape[1:])
        if dtype != "bfloat16":  # int8: the SavedModel stays float32 (see export.int8)
            tolerance = probability_tolerance("float32", None)
            checks = {"saved_model": _verify("The SavedModel", expected, served(images), tolerance)}
        else:  # against the bfloat16 Keras model it was written from, then top-1 against float32
            own_logits = serving.predict(images, verbose=0)
            tolerance = probability_tolerance(dtype, own_logits)
            checks = {"saved_model": _verify("The bfloat16 SavedModel", tf.nn.softmax(own_logits).numpy(),
                                             served(images), tolerance)}
            precision_record.update(agreement(served, "bfloat16 export"))
        extra = os.path.join(tmp, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        serving_files = (write_tf_serving_files(tmp, loaded, model_name, images, max_batch_size, log)
                         if tf_serving_files else None)
        if "tflite" in formats:
            checks["tflite"] = export_tflite(tmp, os.path.join(extra, "model.tflite"), images, expected)
        if "onnx" in formats:
            checks["onnx"] = export_onnx(serving, os.path.join(extra, "model.onnx"), images, expected)
        if dtype == "int8":
            calibration, calibration_source = verification_images(
                results, model.inputs[0].shape[1:], int8.CALIBRATION_IMAGES, "train")
            precision_record.update(saved_model=int8.SAVED_MODEL_DTYPE, files={})
            for fmt, route in int8.ROUTES.items():
                if fmt in formats:
                    record = route.write(tmp, serving, calibration)
                    if "calibration_images" in record:
                        record["calibration_images"] = f"{len(calibration)} {calibration_source}"
                    record.update(agreement(route.runner(os.path.join(tmp, record["file"])), route.name))
                    precision_record["files"][fmt] = record
        metadata = {
            "model_name": model_name,
            "version": version,
            "preset": results.get("preset", model.name),
            "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "class_names": list(class_names),
            "signatures": sorted(loaded.signatures.keys()),
            "limits": {"max_image_pixels": max_image_pixels, "max_batch_size": max_batch_size},
            "precision": precision_record,
            # Per block with constants (position-only probabilities on this path, or a content
            # encoding's position term: "dense").
            "attention_constants": folds["attention_constants"],
            # Linear maps folded into the one before them, per kind (sa_conv.freeze_for_inference).
            "maps_folded": folds["maps_folded"],
            # Batch norms folded into the convolution before them (the ResNet's): one conv with bias each.
            "batch_norms_folded": _count_batch_norms(model) - _count_batch_norms(serving),
            "source": os.path.abspath(path),
            "training_results": {k: v for k, v in results.items() if k != "train_config"},
            "verification": {"images": f"{len(images)} {source}", "max_abs_error": checks,
                             "saved_model_tolerance": tolerance},
            "process": process.describe(),  # what the export and its verification ran with
            # TensorFlow Serving's warm-up records and batching parameters (measured by this export).
            "tf_serving": serving_files,
        }
        files.write_json(os.path.join(tmp, METADATA), metadata, sort_keys=True)
        publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"Exported {model_name} version {version} to {target} "
        f"(signatures: {', '.join(metadata['signatures'])}; checked on {len(images)} {source}: "
        + ", ".join(f"{k} max error {v:.2g}" for k, v in checks.items())
        + "".join(f"; {what} top-1 agrees with float32 on {record['top1_agreement']:.2%} of {record['agreement_images']}"
                  for what, record in _agreements(dtype, precision_record)) + ")")
    return target


def publish(tmp: str, target: str) -> None:
    """Moves the finished version ``tmp`` to ``target`` by renames, so that a server never sees
    half a version; with --overwrite the old version is moved aside first, then removed."""
    if os.path.exists(target):
        trash = f"{tmp}-old"
        os.rename(target, trash)
        os.rename(tmp, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, target)


def _agreements(dtype: str, record: dict):
    """``(what, record with its top-1 agreement)`` of each low-precision file the export checked."""
    if dtype == "bfloat16":
        return [("bfloat16", record)]
    return [(int8.ROUTES[fmt].name, file) for fmt, file in record.get("files", {}).items()]


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
    max_image_pixels: int = _field(DEFAULT_MAX_IMAGE_PIXELS, "predict_encoded refuses images with more pixels "
                                   "(read from the PNG/JPEG header before decoding).")
    max_batch_size: int = _field(DEFAULT_MAX_BATCH_SIZE, "Every signature refuses requests with more images.")
    precision: str = _field(
        "float32", "bfloat16: compute in bfloat16 (float32 weights, softmax and encodings), checked to pick the "
        "float32 model's class on >= 99% of held-out images; auto: bfloat16 on CPUs with AVX512_BF16/AMX and GPUs "
        "of compute capability 8.0+, else float32; int8: int8 files beside the float32 SavedModel "
        "(assets.extra/model_int8.onnx, ONNX Runtime's dynamic quantization; with --formats=...,tflite also "
        "model_int8.tflite, full-integer, calibrated on the run's training images), each checked the same way.",
        precision_lib.CHOICES + ("int8",))
    agreement_images: Optional[str] = _field(
        None, "A .npy/.npz file of uint8 images for the bfloat16 and int8 agreement checks; default: the run's own "
        "test images when its dataset is on local files, else generated ones.")
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
