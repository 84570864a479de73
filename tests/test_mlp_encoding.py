"""The MLP relative encoding: logits by hand, a function of the offset only, any grid size,
its options through the layer, the model config and a saved file."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from sa_conv.encodings.mlp import MLPRelativeEncoding


def _numpy_mlp(enc, offsets):
    x = np.asarray(offsets, np.float64) / enc.scale
    for i, (k, b) in enumerate(zip(enc.kernels, enc.biases)):
        x = x @ ops.convert_to_numpy(k) + ops.convert_to_numpy(b)
        if i < len(enc.kernels) - 1:
            x = np.maximum(x, 0)
    return x


def _encoding(**kwargs):
    enc = MLPRelativeEncoding(3, seed=2, **kwargs)
    enc.build()
    for bias in enc.biases:  # non-zero biases, so the test sees them
        bias.assign(np.linspace(-0.5, 0.5, bias.shape[0]).astype(np.float32))
    return enc


def test_logits_by_hand_and_translation_equivariance():
    enc = _encoding(hidden_units=5, depth=2)
    assert [tuple(k.shape) for k in enc.kernels] == [(2, 5), (5, 5), (5, 3)]
    logits = ops.convert_to_numpy(enc.logits(3, 4))
    assert logits.shape == (3, 12, 12)
    rows, cols = np.divmod(np.arange(12), 4)
    for q in range(12):
        for k in range(12):
            expected = _numpy_mlp(enc, [rows[k] - rows[q], cols[k] - cols[q]])
            np.testing.assert_allclose(logits[:, q, k], expected, rtol=1e-5, atol=1e-6)


def test_grids_larger_than_the_training_grid():
    layer = sa_conv.MultiHeadSelfAttention2D(4, encoding="mlp", encoding_options={"hidden_units": 8, "depth": 1})
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 8)).astype(np.float32)
    layer(x, training=True)  # built and run on 6x6
    big = ops.convert_to_numpy(layer.position_encoding.logits(40, 40))
    corner = _numpy_mlp(layer.position_encoding, [39, -39])  # an offset no 6x6 grid has
    np.testing.assert_allclose(big[:, 39, 40 * 39], corner, rtol=1e-5, atol=1e-6)
    assert ops.convert_to_numpy(layer(np.zeros((1, 40, 40, 8), np.float32))).shape == (1, 40, 40, 8)
    assert not layer.uses_fast_path(grid=(40, 40))  # not separable: dense path


def test_options_reach_the_encoding_and_survive_saving(tmp_path):
    model = sa_conv.build_model("sa_mlp_small", num_layers=1, encoding_options={"hidden_units": 7, "depth": 3})
    encoding = sa_conv.attention_blocks(model)[0].attention.position_encoding
    assert [tuple(k.shape) for k in encoding.kernels] == [(2, 7), (7, 7), (7, 7), (7, 9)]
    model.save(tmp_path / "m.keras")
    images = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    np.testing.assert_allclose(ops.convert_to_numpy(keras.models.load_model(tmp_path / "m.keras")(images)),
                               ops.convert_to_numpy(model(images)), atol=1e-6)


def test_option_errors():
    with pytest.raises(ValueError, match="does not take encoding_options \\['depth'\\]"):
        layer = sa_conv.MultiHeadSelfAttention2D(4, encoding="learned", encoding_options={"depth": 2})
        layer.build((None, 4, 4, 8))
    with pytest.raises(ValueError, match="fixed by the encoding name 'quadratic'"):
        layer = sa_conv.MultiHeadSelfAttention2D(4, encoding="quadratic", encoding_options={"covariance": "full"})
        layer.build((None, 4, 4, 8))
    with pytest.raises(ValueError, match="positive"):
        MLPRelativeEncoding(2, hidden_units=0)
