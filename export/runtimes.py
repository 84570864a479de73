"""An exported file as a function of images, in the runtime that serves it: what the export's
checks and the benchmarks call."""

from __future__ import annotations

import os

import numpy as np


def onnx_runner(path: str):
    """``images (uint8) -> logits`` of an ONNX file in ONNX Runtime, on all cores."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: np.concatenate([session.run(None, {name: images[i: i + 64].astype(np.float32)})[0]
                                          for i in range(0, len(images), 64)])


def tflite_runner(path: str):
    """``images (uint8) -> probabilities`` of a TFLite file's ``serving_default`` in the TFLite
    interpreter (XNNPACK), one image a call as a phone would."""
    import tensorflow as tf

    runner = tf.lite.Interpreter(model_path=path, num_threads=os.cpu_count()).get_signature_runner("serving_default")
    return lambda images: np.concatenate([runner(images=images[i: i + 1])["probabilities"]
                                          for i in range(len(images))])
