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
