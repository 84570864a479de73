"""What TensorFlow Serving reads beside a SavedModel: warm-up requests and batching parameters.

* ``assets.extra/tf_serving_warmup_requests``: a TFRecord file of ``PredictionLog`` records
  (``tensorflow-serving-api``'s protos), which the model server replays when it loads a version,
  before it takes traffic, so that the first real request does not pay for tracing and memory
  allocation. One record per signature at batch 1 and at a typical batch (`warmup_requests`).
* ``assets.extra/batching_params.pbtxt``: ``BatchingParameters`` for ``--enable_batching
  --batching_parameters_file=...`` (`batching_parameters`), from the served model's throughput
  measured at doubling batch sizes on the exporting machine (`measure_throughput`).

``tensorflow-serving-api`` depends on the full ``tensorflow`` wheel: install it next to
``tensorflow-cpu`` with ``pip install --no-deps tensorflow-serving-api``. Without it the export
writes no warm-up file and says so (`available`).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import tensorflow as tf

# The SavedModel's folder for other files, which TensorFlow Serving reads its warm-up requests from.
EXTRA = "assets.extra"
WARMUP_FILE = os.path.join(EXTRA, "tf_serving_warmup_requests")
BATCHING_FILE = os.path.join(EXTRA, "batching_params.pbtxt")
INSTALL = "pip install --no-deps tensorflow-serving-api"
# Throughput counts as saturated at this fraction of the best measured.
SATURATION = 0.95


def available() -> bool:
    """Whether ``tensorflow-serving-api``'s protos are importable here."""
    try:
        from tensorflow_serving.apis import prediction_log_pb2  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------ warm-up requests


def warmup_requests(model_name: str, examples: dict) -> list:
    """``PredictionLog`` records: one ``PredictRequest`` per ``(signature, inputs)`` of
    ``examples`` (``{signature: [{input name: array}, ...]}``), in that order."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    logs = []
    for signature, requests in examples.items():
        for inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            for name, value in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            logs.append(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)))
    return logs


def write_warmup(path: str, logs) -> None:
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())


def read_warmup(path: str) -> list:
    """The ``PredictionLog`` records of a warm-up file."""
    from tensorflow_serving.apis import prediction_log_pb2

    return [prediction_log_pb2.PredictionLog.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(path)]


def replay(loaded, logs) -> list:
    """Calls each record's signature of ``loaded`` (`tf.saved_model.load`) with its inputs, as the
    model server does when it loads the version; returns the outputs, ``{name: array}`` each."""
    outputs = []
    for log in logs:
        request = log.predict_log.request
        fn = loaded.signatures[request.model_spec.signature_name]
        inputs = {name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()}
        outputs.append({name: value.numpy() for name, value in fn(**inputs).items()})
    return outputs


# ------------------------------------------------------------------------------ batching parameters


def batching_message():
    """TensorFlow Serving's ``BatchingParameters`` message class. Its schema is
    ``tensorflow_serving/servables/tensorflow/session_bundle_config.proto`` (fields 1-7, the
    wrapper types of ``google/protobuf/wrappers.proto``), which ``tensorflow-serving-api`` does not
    ship: declared here with the same names and numbers, so that the text written is the model
    server's to parse."""
    from google.protobuf import descriptor_pb2, descriptor_pool, wrappers_pb2
    from google.protobuf import message_factory

    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    schema = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto", package="tensorflow.serving",
        syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
    message = schema.message_type.add(name="BatchingParameters")
    field = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate((
            ("max_batch_size", ".google.protobuf.Int64Value"), ("batch_timeout_micros", ".google.protobuf.Int64Value"),
            ("max_enqueued_batches", ".google.protobuf.Int64Value"),
            ("num_batch_threads", ".google.protobuf.Int64Value"),
            ("thread_pool_name", ".google.protobuf.StringValue")), start=1):
        message.field.add(name=name, number=number, type=field.TYPE_MESSAGE, type_name=kind,
                          label=field.LABEL_OPTIONAL)
    message.field.add(name="allowed_batch_sizes", number=6, type=field.TYPE_INT64, label=field.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


# Seconds the export spends at most measuring the batching parameters: ``$SA_CONV_BATCHING_SECONDS``
# or 60. At 0 only batch 1 is measured (a batching of one image): what a test that does not read
# the batching parameters sets, so that each of its exports does not time the model for a minute.
BUDGET_VARIABLE = "SA_CONV_BATCHING_SECONDS"
DEFAULT_BUDGET_SECONDS = 60.0


def measure_throughput(serve, example, max_batch_size: int, calls: int = 2, budget_seconds: float | None = None) -> dict:
    """Images/s of ``serve`` (one image's inputs ``example`` -> outputs, each input repeated along
    a new batch axis) at batch 1, 2, 4, ... up to ``max_batch_size``: the fastest of ``calls``
    after one untimed call. Stops after two doublings that add less than ``1 - SATURATION`` to
    the best, or once ``budget_seconds`` are spent (a slow model on a slow machine; default:
    `BUDGET_VARIABLE` or `DEFAULT_BUDGET_SECONDS`)."""
    if budget_seconds is None:
        budget_seconds = float(os.environ.get(BUDGET_VARIABLE, DEFAULT_BUDGET_SECONDS))
    results, best, flat, start = {}, 0.0, 0, time.monotonic()
    batch = 1
    while batch <= max_batch_size:
        inputs = {name: tf.constant(np.repeat(value[None], batch, axis=0)) for name, value in example.items()}
        serve(**inputs)
        seconds = min(_timed(serve, inputs) for _ in range(calls))
        results[batch] = batch / seconds
        flat = flat + 1 if results[batch] < best / SATURATION else 0
        best = max(best, results[batch])
        if flat >= 2 or time.monotonic() - start > budget_seconds:
            break
        batch *= 2
    return results


def _timed(fn, inputs):
    start = time.perf_counter()
    fn(**inputs)
    return time.perf_counter() - start


def batching_parameters(throughput: dict, threads: int | None = None):
    """``BatchingParameters`` from ``throughput`` (`measure_throughput`: ``{batch: images/s}``):

    * ``max_batch_size``: the smallest measured batch within `SATURATION` of the best images/s:
      larger batches buy this CPU no throughput, only latency; ``allowed_batch_sizes``: the
      measured sizes up to it (doubling, so that padding a formed batch at most doubles it);
    * ``batch_timeout_micros``: a tenth of the batch-1 latency: a lone request waits at most 10%
      longer for company;
    * ``num_batch_threads``: ``threads`` (default: this machine's cores), as TensorFlow Serving
      advises for CPUs; ``max_enqueued_batches``: the batches of one second at full throughput (at
      least ``num_batch_threads``): requests beyond are refused at once rather than answered late.
    """
    best = max(throughput.values())
    largest = min(b for b, images in throughput.items() if images >= SATURATION * best)
    threads = int(threads or os.cpu_count() or 1)
    params = batching_message()()
    params.max_batch_size.value = largest
    params.allowed_batch_sizes.extend(sorted(b for b in throughput if b <= largest))
    params.batch_timeout_micros.value = max(1, round(0.1 * 1e6 / throughput[1]))
    params.num_batch_threads.value = threads
    params.max_enqueued_batches.value = max(threads, math.ceil(throughput[largest] / largest))
    return params


def write_batching(path: str, params) -> None:
    from google.protobuf import text_format

    with open(path, "w") as f:
        f.write(text_format.MessageToString(params))


def read_batching(path: str):
    """The ``BatchingParameters`` of a ``batching_params.pbtxt`` file (text format)."""
    from google.protobuf import text_format

    with open(path) as f:
        return text_format.Parse(f.read(), batching_message()())


def write_files(version_dir: str, loaded, model_name: str, images: np.ndarray, max_batch_size: int,
                log=print) -> dict:
    """Writes `BATCHING_FILE` from the throughput of ``loaded``'s ``serving_default`` measured at
    doubling batches, and `WARMUP_FILE` (when ``tensorflow-serving-api`` is installed): every
    signature at batch 1 and at the batching's largest batch, from ``images`` (uint8
    ``(N, H, W, C)``). Returns what ``metadata.json`` records of them."""
    serve = loaded.signatures["serving_default"]
    throughput = measure_throughput(lambda **x: serve(**x), {"images": images[0]}, max_batch_size)
    params = batching_parameters(throughput)
    write_batching(os.path.join(version_dir, BATCHING_FILE), params)
    record = {"batching_parameters": BATCHING_FILE, "max_batch_size": params.max_batch_size.value,
              "allowed_batch_sizes": list(params.allowed_batch_sizes),
              "measured_images_per_second": {str(b): round(v, 2) for b, v in throughput.items()}}
    if not available():
        log(f"No TensorFlow Serving warm-up records: {INSTALL} to write them.")
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
    logs = warmup_requests(model_name, examples)
    write_warmup(os.path.join(version_dir, WARMUP_FILE), logs)
    return {**record, "warmup_requests": len(logs), "warmup_file": WARMUP_FILE}
