"""The sinusoidal relative encoding: logits by hand, a function of the offset only, the separable
path equal to the dense one, and grids of any size."""

import numpy as np
import pytest
from keras import ops

import sa_conv
from sa_conv.encodings.sinusoidal import SinusoidalRelativeEncoding, sinusoid_features


def _encoding(heads=3, dim=4, seed=1):
    enc = SinusoidalRelativeEncoding(heads, dim, initializer_range=0.5, seed=seed)
    enc.build()
    return enc


def test_features_by_hand():
    f = sinusoid_features(np.array([0.0, 2.0]), 4)  # w = (1, 10000^-0.5 = 0.01)
    np.testing.assert_allclose(f[0], [0, 0, 1, 1], atol=1e-7)
    np.testing.assert_allclose(f[1], [np.sin(2), np.sin(0.02), np.cos(2), np.cos(0.02)], rtol=1e-6)


def test_logits_by_hand_on_a_2x3_grid():
    enc = _encoding()
    u_row, u_col = ops.convert_to_numpy(enc.row_head_keys), ops.convert_to_numpy(enc.col_head_keys)
    logits = ops.convert_to_numpy(enc.logits(2, 3))
    assert logits.shape == (3, 6, 6)
    for q in range(6):
        for k in range(6):
            dy, dx = k // 3 - q // 3, k % 3 - q % 3
            expected = sinusoid_features(dy, 4) @ u_row + sinusoid_features(dx, 4) @ u_col
            np.testing.assert_allclose(logits[:, q, k], expected, rtol=1e-5, atol=1e-6)


def test_logits_depend_only_on_the_offset():
    logits = ops.convert_to_numpy(_encoding().logits(5, 6))
    rows, cols = np.divmod(np.arange(30), 6)
    by_offset = {}
    for q in range(30):
        for k in range(30):
            key = (rows[k] - rows[q], cols[k] - cols[q])
            by_offset.setdefault(key, logits[:, q, k])
            np.testing.assert_allclose(logits[:, q, k], by_offset[key], atol=1e-5)
    assert len(by_offset) == 9 * 11


@pytest.mark.parametrize("grid", [(16, 16), (9, 5)])
def test_separable_path_equals_dense(grid):
    x = np.random.default_rng(0).normal(size=(2, *grid, 8)).astype(np.float32)
    fast = sa_conv.MultiHeadSelfAttention2D(4, encoding="sinusoidal", fast_position_attention=True)
    dense = sa_conv.MultiHeadSelfAttention2D(4, encoding="sinusoidal", fast_position_attention=False)
    fast.build(x.shape)
    dense.build(x.shape)
    dense.set_weights(fast.get_weights())
    assert fast.uses_fast_path(grid=grid)
    np.testing.assert_allclose(ops.convert_to_numpy(fast(x)), ops.convert_to_numpy(dense(x)), rtol=1e-5, atol=2e-5)


def test_any_grid_size_and_the_presets():
    layer = sa_conv.MultiHeadSelfAttention2D(4, encoding="sinusoidal", max_grid_size=4)
    assert ops.convert_to_numpy(layer(np.zeros((1, 40, 40, 8), np.float32))).shape == (1, 40, 40, 8)
    model = sa_conv.build_model("sa_sinusoidal_small")
    assert model(np.zeros((2, 32, 32, 3), np.uint8)).shape == (2, 10)
    with pytest.raises(ValueError, match="even"):
        SinusoidalRelativeEncoding(2, 3)


def test_paper_size_parameter_count():
    # sa_quadratic's, less its centers and spreads (9 x 3 per layer), plus two (400, 9) head-key
    # matrices per layer.
    model = sa_conv.build_model("sa_sinusoidal")
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 12_086_844 - 6 * 27 + 6 * 2 * 400 * 9
