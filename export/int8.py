"""int8 files beside the float32 SavedModel (``sa-conv-export --precision=int8``): one route per
format, chosen once in `ROUTES`.

* ``onnx`` (`OnnxDynamicInt8`, always written): ONNX Runtime's dynamic quantization of the
  float32 ONNX file, ``assets.extra/model_int8.onnx``: int8 weights per tensor, uint8 activations
  quantized per call.
* ``tflite`` (`TFLiteFullInteger`, with ``--formats=...,tflite``): the TFLite converter's
  full-integer quantization, ``assets.extra/model_int8.tflite``: int8 weights and activations,
  their ranges calibrated on training images of the run (`CALIBRATION_IMAGES` of them), float32
  kept only where an op has no int8 kernel; uint8 images in, probabilities out, as the float32
  file.
* The SavedModel stays float32 (`SAVED_MODEL_DTYPE`): the int8 files are the ONNX and TFLite
  routes. Which file serves fastest on which CPU is measured by ``benchmarks/serving.py``
  (``docs/performance.md``), not decided here.

Products with precomputed attention probabilities (values in [0, 1], a (heads, N, N) constant
per block) stay float32 in the ONNX route: a per-tensor int8 scale would round their small
entries to zero. Each file must pick the float32 model's class on `export.MIN_TOP1_AGREEMENT` of
held-out images, as the export checks."""

from __future__ import annotations

import os

import numpy as np

import sa_conv
from export.onnx_files import store_float16
from export.runtimes import onnx_runner, tflite_runner

CALIBRATION_IMAGES = 100  # ranges of a full-integer file: enough to cover a dataset's activations
SAVED_MODEL_DTYPE = "float32"  # the int8 export's SavedModel: its int8 files are the routes below


class OnnxDynamicInt8:
    """ONNX Runtime's dynamic quantization of ``assets.extra/model.onnx``."""

    format = "onnx"
    name = "int8 ONNX file"
    file = "model_int8.onnx"
    route = ("onnxruntime dynamic quantization of the ONNX file (int8 weights per tensor, uint8 activations "
             "quantized per call); precomputed attention probabilities computed in float32; large float32 "
             "constants stored float16")
    runner = staticmethod(onnx_runner)

    def write(self, version_dir: str, serving, calibration: np.ndarray) -> dict:
        """Writes the file; returns what ``metadata.json`` records of it. The products that read
        a precomputed probability constant of ``serving`` stay float32, and the large constants
        left float32 are stored float16 (`store_float16`): otherwise they are most of the file's
        bytes, and float16 keeps their entries to 2**-11 relative. ``calibration`` is unused: the
        ranges of activations are measured per call."""
        import onnx
        from onnx import numpy_helper
        from onnxruntime.quantization import QuantType, quantize_dynamic

        extra = os.path.join(version_dir, "assets.extra")
        source, target = os.path.join(extra, "model.onnx"), os.path.join(extra, self.file)
        constants = [np.sort(np.asarray(v.numpy()).ravel()) for v in sa_conv.serving.probability_constants(serving)]
        sizes = {c.size for c in constants}
        graph = onnx.load(source).graph
        kept = set()
        for initializer in graph.initializer:
            if int(np.prod(initializer.dims)) not in sizes:
                continue  # (sorting every weight to compare would cost more than the quantization)
            values = np.sort(numpy_helper.to_array(initializer).ravel())
            if any(values.shape == c.shape and np.array_equal(values, c) for c in constants):
                kept.add(initializer.name)
        float32_nodes = sorted(n.name for n in graph.node if kept & set(n.input))
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, nodes_to_exclude=float32_nodes)
        # What the quantizer left float32 and is large: the probability constants, and constants
        # no product reads as a weight (a content encoding's (heads, N, N) position logits).
        halved = store_float16(target)
        return {"route": self.route, "file": os.path.join("assets.extra", self.file),
                "megabytes": os.path.getsize(target) / 2**20, "float32_megabytes": os.path.getsize(source) / 2**20,
                "float32_nodes": float32_nodes, "float16_constants": halved}


class TFLiteFullInteger:
    """The TFLite converter's full-integer quantization of the SavedModel's ``serving_default``."""

    format = "tflite"
    name = "int8 TFLite file"
    file = "model_int8.tflite"
    route = ("TFLite full-integer quantization (int8 weights per channel and activations, ranges calibrated on "
             "training images of the run; float32 only where an op has no int8 kernel)")
    runner = staticmethod(tflite_runner)

    def write(self, version_dir: str, serving, calibration: np.ndarray) -> dict:
        """Converts the SavedModel in ``version_dir`` with ``calibration`` (uint8 images) as the
        representative dataset; returns what ``metadata.json`` records of the file."""
        import tensorflow as tf

        extra = os.path.join(version_dir, "assets.extra")
        converter = tf.lite.TFLiteConverter.from_saved_model(version_dir, signature_keys=["serving_default"])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ({"images": calibration[i: i + 1]} for i in range(len(calibration)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
        target = os.path.join(extra, self.file)
        with open(target, "wb") as f:
            f.write(converter.convert())
        float32 = os.path.join(extra, "model.tflite")
        return {"route": self.route, "file": os.path.join("assets.extra", self.file),
                "megabytes": os.path.getsize(target) / 2**20,
                "float32_megabytes": os.path.getsize(float32) / 2**20 if os.path.exists(float32) else None,
                "calibration_images": len(calibration)}


ROUTES = {route.format: route for route in (OnnxDynamicInt8(), TFLiteFullInteger())}
