"""The exact separable path for position-only attention equals the dense softmax path."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from tests.conftest import gradients
from sa_conv.attention import MultiHeadSelfAttention2D

RNG = np.random.default_rng(0)


def _pair(encoding, heads, grid, d=5, out=6, **kwargs):
    fast = MultiHeadSelfAttention2D(heads, output_dim=out, encoding=encoding, max_grid_size=max(grid), seed=3,
                                    fast_position_attention=True, **kwargs)
    dense = MultiHeadSelfAttention2D.from_config({**fast.get_config(), "fast_position_attention": False})
    shape = (None, *grid, d)
    fast.build(shape)
    dense.build(shape)
    dense.set_weights(fast.get_weights())
    return fast, dense


@pytest.mark.parametrize("grid", [(4, 4), (6, 10), (16, 16), (9, 5)])
@pytest.mark.parametrize("encoding", ["quadratic", "learned"])
def test_fast_equals_dense(encoding, grid):
    fast, dense = _pair(encoding, 9, grid)
    assert fast.uses_fast_path(grid=grid) and not dense.uses_fast_path(grid=grid)
    if encoding == "learned":  # larger embeddings than the default init, for varied attention
        for w in fast.position_encoding.weights:
            w.assign(RNG.normal(size=w.shape).astype(np.float32))
        dense.set_weights(fast.get_weights())
    x = RNG.normal(size=(3, *grid, 5)).astype(np.float32)
    np.testing.assert_allclose(ops.convert_to_numpy(fast(x)), ops.convert_to_numpy(dense(x)), rtol=1e-5, atol=2e-5)


def test_centers_outside_the_grid_and_large_alpha():
    """Naive exponentials underflow at alpha = 1e4 (exp(-1e4) = 0); the per-factor softmax does not."""
    fast, dense = _pair("quadratic", 4, (5, 7))
    enc = fast.position_encoding
    enc.centers.assign(np.array([[9.0, -12.0], [0.4, 0.6], [-6.0, 3.0], [2.5, 20.0]], np.float32))
    enc.spreads.assign(np.array([np.sqrt(2e4), 1.0, np.sqrt(2e4), 0.3], np.float32))
    dense.set_weights(fast.get_weights())
    x = RNG.normal(size=(2, 5, 7, 5)).astype(np.float32)
    a, b = ops.convert_to_numpy(fast(x)), ops.convert_to_numpy(dense(x))
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)


def test_gradients_agree():
    fast, dense = _pair("quadratic", 9, (8, 6))
    x = RNG.normal(size=(2, 8, 6, 5)).astype(np.float32)
    grads = [gradients(lambda v, layer=layer: ops.sum(ops.sin(layer(v))), x, layer.trainable_variables)
             for layer in (fast, dense)]
    assert len(grads[0]) == 1 + len(fast.trainable_variables)
    for g_fast, g_dense in zip(*grads):
        np.testing.assert_allclose(g_fast, g_dense, rtol=1e-4, atol=1e-4)


def test_path_selection():
    auto = MultiHeadSelfAttention2D(4, encoding="quadratic")
    auto.build((None, 4, 4, 3))
    assert not auto.uses_fast_path(grid=(4, 4)) and not auto.uses_fast_path(grid=(4, 32))
    assert auto.uses_fast_path(grid=(8, 8)) and auto.uses_fast_path(grid=(16, 16)) and auto.uses_fast_path(grid=(32, 32))
    with pytest.raises(ValueError, match="'auto', True or False"):
        MultiHeadSelfAttention2D(4, fast_position_attention="yes")
    layer = MultiHeadSelfAttention2D(4, encoding="quadratic", attention_dropout=0.1, fast_position_attention=True)
    layer.build((None, 4, 4, 3))
    assert layer.uses_fast_path(training=False) and not layer.uses_fast_path(training=True)
    for encoding in ("quadratic_full", "content_with_relative_keys"):
        other = MultiHeadSelfAttention2D(4, encoding=encoding, max_grid_size=4)
        other.build((None, 4, 4, 4))
        assert not other.uses_fast_path()


def test_fast_path_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        layer = MultiHeadSelfAttention2D(4, encoding="learned", max_grid_size=8, fast_position_attention=True)
        x = RNG.normal(size=(2, 8, 8, 4)).astype(np.float32)
        out, probs = layer(x, return_attention_scores=True)
        assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(probs.dtype) == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_models_with_and_without_fast_path_agree():
    fast = sa_conv.build_model("sa_learned_small", num_layers=2, fast_position_attention=True)
    dense = sa_conv.build_model("sa_learned_small", num_layers=2, fast_position_attention=False)
    dense.set_weights(fast.get_weights())
    images = RNG.integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)
    np.testing.assert_allclose(fast.predict(images, verbose=0), dense.predict(images, verbose=0), atol=1e-4)
