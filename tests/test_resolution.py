"""Changing resolution after training (`sa_conv.with_image_size`, ``--init_from`` at another
``--image_size``, ``sa-conv-export --image_size``): offset-function encodings carry over as they are,
learned offset tables are interpolated, for every position-only encoding."""

import json
import os

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

import sa_conv

POSITION_ONLY = [name for name, spec in sa_conv.ENCODINGS.items() if spec.position_only]
OFFSET_FUNCTIONS = [name for name in POSITION_ONLY if name != "learned"]


def _model(encoding, image_size=16, **overrides):
    keras.utils.set_random_seed(1)
    model = sa_conv.build_model("sa_quadratic_small", encoding=encoding, num_layers=2, hidden_size=16, mlp_size=16,
                                num_heads=4, image_size=image_size, max_grid_size=image_size // 2, **overrides)
    rng = np.random.default_rng(2)
    for block in sa_conv.attention_blocks(model):  # away from the initialization: varied attention
        for w in block.attention.position_encoding.trainable_weights:
            w.assign(w + rng.normal(scale=0.3, size=w.shape).astype(np.float32))
    return model


def _images(size, count=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3)).astype(np.float32)


def test_every_position_only_encoding_is_covered():
    assert set(POSITION_ONLY) == {"quadratic", "quadratic_full", "learned", "sinusoidal", "mlp"}


@settings(max_examples=30, deadline=None)
@given(old=st.integers(1, 12), rows=st.integers(1, 3))
def test_interpolating_a_table_at_twice_the_grid_puts_old_offsets_on_even_ones(old, rows):
    table = np.random.default_rng(old).normal(size=(2 * old - 1, rows))
    new = sa_conv.interpolate_offset_table(table, 2 * old, scale=0.5)
    assert new.shape == (4 * old - 1, rows)
    centre, old_centre = 2 * old - 1, old - 1
    for d in range(-(old - 1), old):
        np.testing.assert_allclose(new[centre + 2 * d], table[old_centre + d], atol=1e-12)  # offset 2d reads d
    for d in range(-(old - 1), old - 1):  # offset 2d+1 is halfway between d and d+1
        np.testing.assert_allclose(new[centre + 2 * d + 1], (table[old_centre + d] + table[old_centre + d + 1]) / 2)
    np.testing.assert_allclose(new[-1], table[-1])  # beyond the old reach: clamped to its last offset
    np.testing.assert_allclose(sa_conv.interpolate_offset_table(table, old, 1.0), table)


@pytest.mark.parametrize("encoding", POSITION_ONLY)
def test_the_same_size_is_the_same_model(encoding):
    model = _model(encoding)
    copy = sa_conv.with_image_size(model, 16)
    np.testing.assert_array_equal(ops.convert_to_numpy(copy(_images(16))), ops.convert_to_numpy(model(_images(16))))


@pytest.mark.parametrize("encoding", OFFSET_FUNCTIONS)
def test_offset_function_encodings_keep_their_logits_per_offset(encoding):
    """At twice the size, the logit of each offset the old grid had is unchanged: the encoding's
    weights are the same; the new grid adds offsets."""
    model = _model(encoding)
    copy = sa_conv.with_image_size(model, 32)
    assert copy.inputs[0].shape[1:] == (32, 32, 3) and sa_conv.attention_grid(copy)[0] == (16, 16)
    for old, new in zip(sa_conv.attention_blocks(model), sa_conv.attention_blocks(copy)):
        before = ops.convert_to_numpy(old.attention.position_encoding.logits(8, 8)).reshape(-1, 8, 8, 8, 8)
        after = ops.convert_to_numpy(new.attention.position_encoding.logits(16, 16)).reshape(-1, 16, 16, 16, 16)
        np.testing.assert_allclose(after[:, :8, :8, :8, :8], before, rtol=1e-5, atol=1e-5)
    assert ops.convert_to_numpy(copy(_images(32))).shape == (2, 10)


def test_learned_tables_are_interpolated_so_offsets_scale_with_the_image():
    """At twice the size, offset 2d has the old logit of offset d, and odd offsets the mean of
    their neighbours': the learned model attends to the same image distances."""
    model = _model("learned")
    copy = sa_conv.with_image_size(model, 32)
    for old, new in zip(sa_conv.attention_blocks(model), sa_conv.attention_blocks(copy)):
        assert new.attention.max_grid_size == 16
        row_old, _ = (ops.convert_to_numpy(t) for t in old.attention.position_encoding.factor_logits(8, 8))
        row_new, _ = (ops.convert_to_numpy(t) for t in new.attention.position_encoding.factor_logits(16, 16))
        np.testing.assert_allclose(row_new[:, 0, 0:16:2], row_old[:, 0, 0:8], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(row_new[:, 0, 1:15:2], (row_old[:, 0, 0:7] + row_old[:, 0, 1:8]) / 2,
                                   rtol=1e-5, atol=1e-5)
    small = sa_conv.with_image_size(model, 8)  # and down: offset d reads 2d
    row_small, _ = (ops.convert_to_numpy(t) for t in
                    sa_conv.attention_blocks(small)[0].attention.position_encoding.factor_logits(4, 4))
    row_old, _ = (ops.convert_to_numpy(t) for t in
                  sa_conv.attention_blocks(model)[0].attention.position_encoding.factor_logits(8, 8))
    np.testing.assert_allclose(row_small[:, 0, :4], row_old[:, 0, 0:8:2], rtol=1e-5, atol=1e-5)


def test_what_cannot_change_resolution_says_why():
    model = _model("quadratic")
    with pytest.raises(ValueError, match="multiple of the pooling width 2"):
        sa_conv.with_image_size(model, 17)
    with pytest.raises(ValueError, match="inference constants .* then sa_conv.freeze_for_inference"):
        sa_conv.with_image_size(sa_conv.freeze_for_inference(model), 32)


def test_a_resnet_takes_any_size():
    keras.utils.set_random_seed(0)
    model = sa_conv.build_resnet(image_size=16, widths=(4, 8, 8, 8))
    copy = sa_conv.with_image_size(model, 24)
    assert copy.inputs[0].shape[1:] == (24, 24, 3) and ops.convert_to_numpy(copy(_images(24))).shape == (2, 10)
    np.testing.assert_array_equal(ops.convert_to_numpy(sa_conv.with_image_size(model, 16)(_images(16))),
                                  ops.convert_to_numpy(model(_images(16))))


@pytest.mark.parametrize("encoding", POSITION_ONLY)
def test_init_from_another_resolution(encoding, tmp_path):
    """--init_from a model trained at 16x16 into a 32x32 run: every weight carried over, the learned
    tables through `with_image_size`; a log line says so."""
    from trainers import checkpoints

    source = _model(encoding)
    source.save(tmp_path / "small.keras")
    target = _model(encoding, image_size=32)
    logs = []
    checkpoints.init_from(target, str(tmp_path / "small.keras"), log=logs.append)
    assert "trained on 16x16 images; this run's are 32x32" in logs[0]
    expected = sa_conv.with_image_size(source, 32, max_grid_size=16)
    np.testing.assert_allclose(ops.convert_to_numpy(target(_images(32))), ops.convert_to_numpy(expected(_images(32))),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_train_fine_tune_and_export_at_other_resolutions(tmp_path, monkeypatch):
    """Trained at 32x32 on the synthetic data, the learned model is fine-tuned at 48x48 from it
    (--init_from, --image_size) and exported at 64x64 (--image_size): each step runs, keeps what
    it was given and records the size. The fine-tuning's first step starts from the source's
    weights, moved to 48x48."""
    from export import export as export_lib
    from trainers import train as train_lib
    from trainers.config import make_config

    # The weights each run trains from, read as its first epoch begins.
    train_epochs, starts = train_lib.Trainer.train_epochs, []

    def record_start(self, *args, **kwargs):
        starts.append([v.numpy() for v in self.model.weights if "seed_generator" not in v.path])
        return train_epochs(self, *args, **kwargs)

    monkeypatch.setattr(train_lib.Trainer, "train_epochs", record_start)

    settings_ = dict(model="sa_learned_small", num_layers=1, hidden_size=16, mlp_size=16, num_heads=4,
                     dataset="synthetic", global_batch_size=50, eval_batch_size=100, validation_size=100, epochs=2,
                     strategy="one_device", dropout=0.0)
    train_lib.train(make_config(overrides=dict(settings_, model_dir=str(tmp_path / "at32"))), log=lambda s: None)
    logs = []
    train_lib.train(make_config(overrides=dict(
        settings_, epochs=1, image_size=48, init_from=str(tmp_path / "at32" / "model.keras"),
        model_dir=str(tmp_path / "at48"))), log=logs.append)
    assert any("trained on 32x32 images; this run's are 48x48" in line for line in logs)
    model = keras.models.load_model(tmp_path / "at48" / "model.keras")
    assert model.inputs[0].shape[1:] == (48, 48, 3)
    assert sa_conv.attention_blocks(model)[0].attention.max_grid_size == 24
    source = sa_conv.with_image_size(keras.models.load_model(tmp_path / "at32" / "model.keras"), 48, max_grid_size=24)
    want = [v.numpy() for v in source.weights if "seed_generator" not in v.path]
    assert len(starts) == 2 and len(starts[1]) == len(want)
    for started, value in zip(starts[1], want):
        np.testing.assert_array_equal(started, value)
    version = export_lib.export(model_dir=str(tmp_path / "at32"), export_dir=str(tmp_path / "out"), image_size=64,
                                log=lambda s: None)
    import tensorflow as tf

    served = tf.saved_model.load(version).signatures["serving_default"]
    assert served.structured_input_signature[1]["images"].shape[1:] == (64, 64, 3)
    meta = json.load(open(os.path.join(version, "assets.extra", "metadata.json")))
    assert meta["image_shape"] == [64, 64, 3]
    assert meta["verification"]["max_abs_error"]["saved_model"] <= 1e-5
