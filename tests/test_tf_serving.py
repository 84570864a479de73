"""TensorFlow Serving's files beside an export (`export.tf_serving`): warm-up records parsed back
with tensorflow-serving-api's protos and replayed against the signatures, and batching parameters
parsed back as the model server's ``BatchingParameters``."""

import json
import os
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import sa_conv
from export import export as export_lib
from export import tf_serving

pytestmark = pytest.mark.skipif(not tf_serving.available(), reason=f"needs {tf_serving.INSTALL}")


@pytest.fixture(scope="module")
def exported(real_images, tmp_path_factory):
    root = tmp_path_factory.mktemp("tf_serving")
    keras.utils.set_random_seed(0)
    sa_conv.build_model("sa_quadratic_small", num_layers=1).save(root / "m.keras")
    messages = []
    # The batching parameters are what these tests read: measured as a user's export measures them.
    with mock.patch.dict(os.environ, {tf_serving.BUDGET_VARIABLE: str(tf_serving.DEFAULT_BUDGET_SECONDS)}):
        version = export_lib.export(model_path=str(root / "m.keras"), export_dir=str(root / "out"), model_name="tiny",
                                    log=messages.append)
    return version, json.load(open(os.path.join(version, export_lib.METADATA)))


def test_warmup_records_replay_every_signature_at_batch_1_and_the_batching_size(exported):
    version, meta = exported
    logs = tf_serving.read_warmup(os.path.join(version, tf_serving.WARMUP_FILE))
    largest = meta["tf_serving"]["max_batch_size"]
    batches = sorted({1, largest})
    requests = [log.predict_log.request for log in logs]
    assert [(r.model_spec.name, r.model_spec.signature_name) for r in requests] == [
        ("tiny", name) for name in ("serving_default", "predict_encoded", "attention_maps") for _ in batches]
    assert meta["tf_serving"]["warmup_requests"] == len(logs) == 3 * len(batches)
    loaded = tf.saved_model.load(version)  # a fresh load, as the model server replays them
    outputs = tf_serving.replay(loaded, logs)
    for i, batch in enumerate(batches):
        images = tf.make_ndarray(requests[i].inputs["images"])
        assert images.shape == (batch, 32, 32, 3) and images.dtype == np.uint8
        want = loaded.signatures["serving_default"](images=tf.constant(images))["probabilities"].numpy()
        np.testing.assert_array_equal(outputs[i]["probabilities"], want)
        # The same images as PNG files (lossless, already the model's size): the same answer.
        np.testing.assert_allclose(outputs[len(batches) + i]["probabilities"], want, rtol=0, atol=1e-7)
        assert outputs[2 * len(batches) + i]["attention"].shape[0] == batch


def test_batching_parameters_parse_back_as_the_model_servers_message(exported):
    version, meta = exported
    params = tf_serving.read_batching(os.path.join(version, tf_serving.BATCHING_FILE))
    sizes = list(params.allowed_batch_sizes)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == params.max_batch_size.value
    assert sizes == meta["tf_serving"]["allowed_batch_sizes"]
    assert params.max_batch_size.value <= 256 and params.num_batch_threads.value >= 1
    assert params.max_enqueued_batches.value >= params.num_batch_threads.value
    measured = {int(b): v for b, v in meta["tf_serving"]["measured_images_per_second"].items()}
    assert set(sizes) <= set(measured) and all(v > 0 for v in measured.values())
    text = open(os.path.join(version, tf_serving.BATCHING_FILE)).read()
    assert f"max_batch_size {{\n  value: {params.max_batch_size.value}\n}}" in text  # the documented layout


def test_batching_parameters_follow_the_measured_throughput():
    params = tf_serving.batching_parameters({1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 16: 31.5}, threads=2)
    assert params.max_batch_size.value == 4  # the first within 95% of the best
    assert list(params.allowed_batch_sizes) == [1, 2, 4]
    assert params.batch_timeout_micros.value == 10_000  # a tenth of the 100 ms batch-1 latency
    assert params.num_batch_threads.value == 2
    assert params.max_enqueued_batches.value == 8  # one second of batches of 4 at 30 images/s
    flat = tf_serving.batching_parameters({1: 500.0, 2: 480.0, 4: 490.0}, threads=4)
    assert flat.max_batch_size.value == 1 and list(flat.allowed_batch_sizes) == [1]
    assert flat.max_enqueued_batches.value == 500


def test_without_the_serving_api_the_export_says_how_to_get_the_warmup(real_images, tmp_path, monkeypatch):
    keras.utils.set_random_seed(0)
    sa_conv.build_model("sa_quadratic_small", num_layers=1).save(tmp_path / "m.keras")
    monkeypatch.setattr(tf_serving, "available", lambda: False)
    messages = []
    version = export_lib.export(model_path=str(tmp_path / "m.keras"), export_dir=str(tmp_path / "out"),
                                log=messages.append)
    assert any(tf_serving.INSTALL in m for m in messages)
    assert not os.path.exists(os.path.join(version, tf_serving.WARMUP_FILE))
    assert os.path.exists(os.path.join(version, tf_serving.BATCHING_FILE))
    none = export_lib.export(model_path=str(tmp_path / "m.keras"), export_dir=str(tmp_path / "none"),
                             tf_serving_files=False, log=lambda s: None)
    assert not os.path.exists(os.path.join(none, tf_serving.BATCHING_FILE))
    assert json.load(open(os.path.join(none, export_lib.METADATA)))["tf_serving"] is None
