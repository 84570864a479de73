"""int8 files beside the float32 SavedModel (``sa-conv-export --precision=int8``): one
`export.formats.Format` per float32 file it quantizes (`QUANTIZED`).

* ``onnx`` (`OnnxDynamicInt8`, always written): ONNX Runtime's dynamic quantization of the
  float32 ONNX file, ``assets.extra/model_int8.onnx``: int8 weights per output channel, uint8
  activations quantized per call; the first and last products (the images' embedding, the
  logits) float32, as per-tensor weights and int8 ends moved 1.3-1.7% of a trained model's classes.
* ``tflite`` (`TFLiteDynamicRange`, with ``--formats=...,tflite``): the TFLite converter's
  dynamic-range quantization, ``assets.extra/model_int8.tflite``: int8 weights per channel, the
  activations of each product quantized per call (no calibration), float32 between; uint8 images
  in, probabilities out, as the float32 file. Not full-integer: LiteRT's XNNPACK delegate has no
  int8 ``BATCH_MATMUL``, so a full-integer file runs the attention products in LiteRT's own
  kernels, slower than its float32 file (``benchmarks/tflite_runtimes.py``).
* ``openvino`` (`OpenVINOInt8`, with ``--formats=...,openvino``): NNCF's post-training
  quantization of the OpenVINO IR calibrated on images, ``assets.extra/openvino/model_int8.xml``:
  int8 weights and activations of the products with weights but the first and last, the rest
  (the attention probabilities' products included) in the plugin's precision (bfloat16 on CPUs
  with AVX512_BF16 or AMX); attention models under NNCF's transformer scheme.
* The SavedModel stays float32 (`SAVED_MODEL_DTYPE`): the int8 files are the ONNX, TFLite and
  OpenVINO routes. Which file serves fastest on which CPU is measured by ``benchmarks/serving.py``
  (``docs/performance.md``), not decided here.

Products with precomputed attention probabilities (values in [0, 1], a (heads, N, N) constant
per block, or its row and column factors) stay float in the ONNX file: a per-tensor int8 scale
would round their small entries to zero; the OpenVINO file keeps them, and the products that
read them, out of its int8 products. Each file must pick the float32 model's class on
`export.MIN_TOP1_AGREEMENT` of held-out images, as the export checks."""

from __future__ import annotations

import logging
import os

import numpy as np

import sa_conv
from export.formats import EXTRA, FORMATS, ExportJob, Format
from export.onnx_files import store_float16
from export.runtimes import onnx_runner, openvino_default_precision, openvino_runner, tflite_runner

SAVED_MODEL_DTYPE = "float32"  # the int8 export's SavedModel: its int8 files are the formats below


class Quantized(Format):
    """An int8 file written from the float32 file of the format ``quantizes`` names. It is
    checked by the user's criterion only, top-1 agreement with the float32 model (int8 moves
    probabilities by more than any bound that would still tell a changed computation)."""

    quantizes: str
    route: str

    def check(self, job: ExportJob) -> dict:
        return job.agreement(job.served(self), self.what)

    def source(self, version_dir: str) -> str:
        """The float32 file this one is written from, in ``version_dir``."""
        return os.path.join(version_dir, FORMATS[self.quantizes].file)


def ir_constant(op, index: int):
    """The OpenVINO ``Constant`` that input ``index`` of ``op`` is, or reads through ``Convert`` ops
    (an IR may store a constant in another type); None if that input computes from the model's."""
    node = op.input(index).get_source_output().get_node()
    while node.get_type_name() == "Convert":
        node = node.input(0).get_source_output().get_node()
    return node if node.get_type_name() == "Constant" else None


class ProbabilityConstants:
    """The precomputed attention probabilities of a serving copy (`sa_conv.serving.probability_constants`),
    recognised among a file's constants by their values (in any layout: a converter may have
    transposed or reshaped them)."""

    def __init__(self, serving):
        self.sorted = [np.sort(np.asarray(v.numpy()).ravel()) for v in sa_conv.serving.probability_constants(serving)]
        self.sizes = {c.size for c in self.sorted}

    def __contains__(self, values) -> bool:
        """Whether the array ``values`` holds one constant's values."""
        values = np.asarray(values)
        if values.size not in self.sizes:
            return False  # (sorting every weight to compare would cost more than the quantization)
        values = np.sort(values.ravel())
        return any(values.shape == c.shape and np.array_equal(values, c) for c in self.sorted)


class OnnxDynamicInt8(Quantized):
    """ONNX Runtime's dynamic quantization of ``assets.extra/model.onnx``."""

    name = "onnx_int8"
    quantizes = "onnx"
    what = "int8 ONNX file"
    file = os.path.join(EXTRA, "model_int8.onnx")
    route = ("onnxruntime dynamic quantization of the ONNX file (int8 weights per channel, uint8 activations "
             "quantized per call); precomputed attention probabilities and the first and last products computed in "
             "float32; large float32 constants stored float16")

    def write(self, job: ExportJob) -> dict:
        """Writes the file; returns what ``metadata.json`` records of it. The products that read
        a precomputed probability constant of the serving copy stay float32, and the large
        constants left float32 are stored float16 (`store_float16`): otherwise they are most of
        the file's bytes, and float16 keeps their entries to 2**-11 relative. The ranges of
        activations are measured per call: no calibration."""
        return self.quantize(job.directory, job.serving)

    def quantize(self, version_dir: str, serving) -> dict:
        """`write` from the float32 ONNX file of ``version_dir`` and the serving copy ``serving``."""
        import onnx
        from onnx import numpy_helper
        from onnxruntime.quantization import QuantType, quantize_dynamic

        source = self.source(version_dir)
        target = os.path.join(version_dir, self.file)
        constants = ProbabilityConstants(serving)
        graph = onnx.load(source).graph
        kept = {initializer.name for initializer in graph.initializer  # (sizes first: to_array copies)
                if int(np.prod(initializer.dims)) in constants.sizes
                and numpy_helper.to_array(initializer) in constants}
        weights = {initializer.name for initializer in graph.initializer}
        products = [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and weights & set(n.input)]
        # The nodes are in the order they compute (ONNX sorts them): the first and last products
        # (the images' embedding, the logits) stay float32 too.
        float32_nodes = sorted({n.name for n in graph.node if kept & set(n.input)} | {products[0], products[-1]})
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=float32_nodes)
        # What the quantizer left float32 and is large: the probability constants, and constants
        # no product reads as a weight (a content encoding's (heads, N, N) position logits).
        halved = store_float16(target)
        return {"route": self.route, "file": self.file,
                "megabytes": os.path.getsize(target) / 2**20, "float32_megabytes": os.path.getsize(source) / 2**20,
                "float32_nodes": float32_nodes, "float16_constants": halved}

    def runner(self, path):
        return onnx_runner(path)


class TFLiteDynamicRange(Quantized):
    """The TFLite converter's dynamic-range quantization of the SavedModel's ``serving_default``."""

    name = "tflite_int8"
    quantizes = "tflite"
    what = "int8 TFLite file"
    file = os.path.join(EXTRA, "model_int8.tflite")
    route = ("TFLite dynamic-range quantization (int8 weights per channel, activations quantized per call, float32 "
             "between; LiteRT's XNNPACK delegate has no int8 BATCH_MATMUL for a full-integer file's attention)")

    def write(self, job: ExportJob) -> dict:
        return self.quantize(job.directory)

    def quantize(self, version_dir: str) -> dict:
        """`write` from the SavedModel in ``version_dir``; returns what ``metadata.json`` records."""
        import tensorflow as tf

        converter = tf.lite.TFLiteConverter.from_saved_model(version_dir, signature_keys=["serving_default"])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # without a representative dataset: dynamic range
        target = os.path.join(version_dir, self.file)
        with open(target, "wb") as f:
            f.write(converter.convert())
        float32 = self.source(version_dir)
        return {"route": self.route, "file": self.file,
                "megabytes": os.path.getsize(target) / 2**20,
                "float32_megabytes": os.path.getsize(float32) / 2**20 if os.path.exists(float32) else None}

    def runner(self, path):
        return tflite_runner(path)


class OpenVINOInt8(Quantized):
    """NNCF's post-training quantization of the OpenVINO IR (``assets.extra/openvino/model.xml``)
    with calibration: the products with weights (``MatMul`` with a constant, ``Convolution``) take
    int8 weights (per output channel) and int8 activations, their ranges measured on calibration
    images (`calibration_images`); every other op computes in the plugin's precision (bfloat16 on
    CPUs with AVX512_BF16 or AMX). Left out of the int8 products: those of the attention
    probabilities (a precomputed ``(heads, N, N)`` constant or its factors, or queries against
    keys), whose small entries a per-tensor activation scale rounds to zero, and the first and
    last products (the images' embedding, the logits). Quantizing every op NNCF would (the layer
    norms' means and variances too) moves a trained model's classes past the agreement guard.

    A model with attention blocks is quantized as NNCF's ``ModelType.TRANSFORMER``
    (`nncf_model_type`): SmoothQuant moves each product's activation outliers into its weights,
    activations take asymmetric ranges, and the plugin fuses each quantization into the product
    that reads it, where the default scheme leaves layout conversions between them
    (``benchmarks/serving.py`` times the difference); a convolutional network keeps the default."""

    name = "openvino_int8"
    quantizes = "openvino"
    what = "int8 OpenVINO model"
    calibrates = True
    file = os.path.join(EXTRA, "openvino", "model_int8.xml")
    route = ("NNCF post-training quantization of the OpenVINO IR, calibrated on images (int8 weights and activations "
             "of the products with weights but the first and last and those of attention probabilities; all else in "
             "the plugin's precision: bfloat16 on CPUs with AVX512_BF16 or AMX, else float32; attention models "
             "under NNCF's transformer scheme: SmoothQuant, asymmetric activations)")
    packages = ("nncf",)
    missing = ("--precision=int8 with --formats=...,openvino quantizes the IR with NNCF: pip install nncf (or "
               "sa-conv[openvino]).")

    def write(self, job: ExportJob) -> dict:
        images, source = job.calibration()
        return {**self.quantize(job.directory, job.serving, images), "calibration_images": f"{len(images)} {source}"}

    @staticmethod
    def quantized_products(model, probabilities: ProbabilityConstants) -> list:
        """The friendly names of ``model``'s (an ``openvino.Model``) products quantized to int8,
        in the order they compute: every ``MatMul`` whose second input is a constant (through a
        ``Convert`` where the IR stores it in another type) other than attention ``probabilities``,
        and every ``Convolution``; the first and last left out."""
        def weight(op):
            found = ir_constant(op, 1)
            return found is not None and found.get_data() not in probabilities

        products = [op.get_friendly_name() for op in model.get_ordered_ops()
                    if op.get_type_name() == "Convolution" or (
                        op.get_type_name() == "MatMul" and ir_constant(op, 0) is None and weight(op))]
        return products[1:-1]

    @staticmethod
    def nncf_model_type(serving) -> str | None:
        """The ``nncf.ModelType`` member's name ``serving`` is quantized as: ``"TRANSFORMER"`` for
        a model with attention blocks (`sa_conv.attention_blocks`), None (NNCF's default scheme)
        for a convolutional network."""
        return "TRANSFORMER" if sa_conv.attention_blocks(serving) else None

    def quantize(self, version_dir: str, serving, images: np.ndarray) -> dict:
        """`write` from the float32 IR of ``version_dir`` and the serving copy ``serving``,
        calibrated on uint8 ``images`` ``(N, H, W, C)``; returns what ``metadata.json`` records."""
        import nncf
        import openvino

        source = self.source(version_dir)
        target = os.path.join(version_dir, self.file)
        model = openvino.Core().read_model(source)
        chosen = self.quantized_products(model, ProbabilityConstants(serving))
        others = {op.get_type_name() for op in model.get_ops()} - {"MatMul", "Convolution", "Constant", "Parameter",
                                                                    "Result"}
        left = [op.get_friendly_name() for op in model.get_ops()
                if op.get_type_name() in ("MatMul", "Convolution") and op.get_friendly_name() not in chosen]
        # NNCF logs its progress and what it quantized at INFO: the export's console is its own
        # progress and results (metadata.json records the products).
        model_type = self.nncf_model_type(serving)
        logger = logging.getLogger("nncf")
        level = logger.level
        logger.setLevel(max(level, logging.WARNING))
        try:
            quantized = nncf.quantize(
                model, nncf.Dataset([images[i: i + 1].astype(np.float32) for i in range(len(images))]),
                subset_size=len(images), ignored_scope=nncf.IgnoredScope(names=left, types=sorted(others),
                                                                         validate=False),
                model_type=getattr(nncf.ModelType, model_type) if model_type else None)
        finally:
            logger.setLevel(level)
        openvino.save_model(quantized, target, compress_to_fp16=False)
        return {"route": self.route, "file": self.file,
                "megabytes": os.path.getsize(target.replace(".xml", ".bin")) / 2**20,
                "float32_megabytes": os.path.getsize(source.replace(".xml", ".bin")) / 2**20,
                "int8_products": len(chosen), "nncf_model_type": model_type or "default",
                "inference_precision": openvino_default_precision()}

    def runner(self, path):
        return openvino_runner(path)  # the plugin's default precision for the rest: what a server runs


QUANTIZED = (OnnxDynamicInt8(), TFLiteDynamicRange(), OpenVINOInt8())
