"""An exported file as a function of images, in the runtime that serves it: what the export's
checks and the benchmarks call."""

from __future__ import annotations

import os

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of ``logits`` ``(batch, classes)`` over the last axis, in their dtype."""
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def onnx_runner(path: str):
    """``images (uint8) -> probabilities`` of an ONNX file (whose output is the model's logits,
    as Keras's exporter writes it) in ONNX Runtime, on all cores."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: softmax(np.concatenate([session.run(None, {name: images[i: i + 64].astype(np.float32)})[0]
                                                  for i in range(0, len(images), 64)]))


LITERT_INSTALL = "pip install ai-edge-litert (or sa-conv[tflite])"


def tflite_interpreter(model_path: str | None = None, model_content: bytes | None = None,
                       num_threads: int | None = None):
    """A TFLite file's interpreter from LiteRT (``ai-edge-litert``, the runtime TFLite ships as
    since ``tf.lite.Interpreter`` was deprecated), on ``num_threads`` (default all cores);
    ImportError naming the install when LiteRT is missing."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as exc:
        raise ImportError(f"Running TFLite files needs LiteRT: {LITERT_INSTALL}.") from exc
    return Interpreter(model_path=model_path, model_content=model_content, num_threads=num_threads or os.cpu_count())


def tflite_runner(path: str):
    """``images (uint8) -> probabilities`` of a TFLite file's ``serving_default`` in LiteRT
    (XNNPACK), one image a call as a phone would."""
    runner = tflite_interpreter(path).get_signature_runner("serving_default")
    return lambda images: np.concatenate([runner(images=images[i: i + 1])["probabilities"]
                                          for i in range(len(images))])


OPENVINO_INSTALL = "pip install openvino (or sa-conv[openvino])"


def openvino_compiled(path: str, inference_precision: str | None = None, num_threads: int | None = None):
    """An OpenVINO file (IR ``.xml`` or ONNX) compiled for OpenVINO's CPU plugin on
    ``num_threads`` (default all cores), in ``inference_precision`` (``"f32"``, ``"bf16"``; None:
    the plugin's default on this CPU, bfloat16 where it has AVX512_BF16 or AMX, which is what a
    server that sets nothing runs); ImportError naming the install when OpenVINO is missing."""
    try:
        import openvino
    except ImportError as exc:
        raise ImportError(f"Running OpenVINO files needs OpenVINO: {OPENVINO_INSTALL}.") from exc
    core = openvino.Core()
    config = {"INFERENCE_NUM_THREADS": num_threads or os.cpu_count()}
    if inference_precision:
        config["INFERENCE_PRECISION_HINT"] = inference_precision
    return core.compile_model(core.read_model(path), "CPU", config)


def openvino_default_precision() -> str:
    """The precision OpenVINO's CPU plugin infers in on this CPU when a server sets none."""
    import openvino

    hint = openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    return hint.to_string() if hasattr(hint, "to_string") else str(hint)


def openvino_runner(path: str, inference_precision: str | None = None):
    """``images (uint8) -> probabilities`` of an OpenVINO file whose output is the model's
    logits (as Keras's exporter writes it), compiled as `openvino_compiled` does."""
    compiled = openvino_compiled(path, inference_precision)
    request, output = compiled.create_infer_request(), compiled.output(0)
    return lambda images: softmax(np.concatenate([request.infer({0: images[i: i + 64].astype(np.float32)})[output]
                                                  for i in range(0, len(images), 64)]))
