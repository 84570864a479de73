"""`sa_conv.separable` on its own: the factorized Eq. (5)-(6) against the dense sum in NumPy."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

from sa_conv import aggregation
from sa_conv.separable import separable_pays, separable_sum
from tests.conftest import gradients

# Draws per property. Under TensorFlow (the full suite) as many as the property needs; under JAX
# every drawn shape is a new compilation of both paths and their gradients (about 4 s each), so the
# other backends check the same keras.ops code on a third of the draws.
DRAWS = 1.0 if keras.backend.backend() == "tensorflow" else 1 / 3


def separable_attention(x, row_logits, col_logits, kernel, bias=None, dtype=None, recompute_gradient=False):
    """The layer's separable path from logits: each factor's softmax over keys
    (`aggregation.softmax`), then `separable_sum`."""
    row, col = aggregation.softmax(aggregation.Factors(ops.convert_to_tensor(row_logits), ops.convert_to_tensor(col_logits)))
    return separable_sum(x, row, col, kernel, bias, dtype, recompute_gradient=recompute_gradient)


def _softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def dense_reference(x, row_logits, col_logits, kernel, bias):
    """Eq. (5)-(6) as written, float64: the full ``(heads, N, N)`` softmax of ``r + c``."""
    b, height, width, d = x.shape
    heads = row_logits.shape[0]
    logits = row_logits[:, :, None, :, None] + col_logits[:, None, :, None, :]  # [h, qi, qj, ki, kj]
    probs = _softmax(logits.reshape(heads, height * width, height * width))
    mixed = np.einsum("hqk,bkd->bqhd", probs, x.reshape(b, height * width, d)).reshape(b, height * width, heads * d)
    out = mixed @ kernel + (0.0 if bias is None else bias)
    return out.reshape(b, height, width, -1)


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")  # 1-row grids: legitimately size 1
@settings(max_examples=round(25 * DRAWS), deadline=None)
@given(height=st.integers(1, 7), width=st.integers(1, 7), heads=st.integers(1, 4), d=st.integers(1, 4),
       out=st.integers(1, 5), batch=st.integers(1, 3), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_equals_the_dense_softmax_of_the_summed_logits(height, width, heads, d, out, batch, with_bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, height, width, d))
    row = rng.normal(scale=3.0, size=(heads, height, height))
    col = rng.normal(scale=3.0, size=(heads, width, width))
    kernel = rng.normal(size=(heads * d, out))
    bias = rng.normal(size=(out,)) if with_bias else None
    got = separable_attention(ops.convert_to_tensor(x, "float32"), ops.convert_to_tensor(row, "float32"),
                              ops.convert_to_tensor(col, "float32"), ops.convert_to_tensor(kernel, "float32"),
                              None if bias is None else ops.convert_to_tensor(bias, "float32"))
    assert tuple(got.shape) == (batch, height, width, out)
    np.testing.assert_allclose(ops.convert_to_numpy(got), dense_reference(x, row, col, kernel, bias),
                               rtol=1e-4, atol=1e-4)


def test_large_logit_spreads_do_not_underflow():
    """Logits of -1e4 and below: exp() of the summed logits underflows to 0 everywhere but at the
    maximum; each factor subtracts its own maximum, so the output is the arg-max pixel's value map."""
    heads, height, width, d = 1, 5, 6, 2
    row = np.full((heads, height, height), -1e4, np.float32)
    col = np.full((heads, width, width), -2e4, np.float32)
    row[0, :, 3] = -5e3  # every query attends key row 3 ...
    col[0, :, 1] = -9e3  # ... and key column 1
    x = np.random.default_rng(1).normal(size=(2, height, width, d)).astype(np.float32)
    kernel = np.eye(d, dtype=np.float32)
    got = ops.convert_to_numpy(separable_attention(x, row, col, kernel))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, np.broadcast_to(x[:, 3:4, 1:2, :], got.shape), rtol=1e-6)


def dense_attention(x, row_logits, col_logits, kernel, bias):
    """Eq. (5)-(6) in Keras ops, differentiated by the backend's autodiff."""
    b, height, width, d = x.shape
    heads, n = row_logits.shape[0], height * width
    logits = ops.reshape(row_logits[:, :, None, :, None] + col_logits[:, None, :, None, :], (heads, n, n))
    mixed = ops.einsum("hqk,bkd->bqhd", ops.softmax(logits, axis=-1), ops.reshape(x, (-1, n, d)))
    return ops.reshape(ops.matmul(ops.reshape(mixed, (-1, n, heads * d)), kernel) + bias, (-1, height, width, kernel.shape[-1]))


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@settings(max_examples=round(15 * DRAWS), deadline=None)
@given(height=st.integers(1, 6), width=st.integers(1, 6), heads=st.integers(1, 3), d=st.integers(1, 4),
       out=st.integers(1, 4), batch=st.integers(1, 3), seed=st.integers(0, 2**16), recompute=st.booleans())
def test_gradients_equal_autodiff_of_the_dense_sum(height, width, heads, d, out, batch, seed, recompute):
    """Both gradients of the separable path (autodiff of the all-heads order, and the per-head
    custom gradient that recomputes) for the input, both factors' logits, the value maps and the
    bias, against the backend's autodiff of the dense Eq. (5)-(6)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, height, width, d)).astype(np.float32)
    weights = [keras.Variable(rng.normal(scale=s, size=shape).astype(np.float32)) for s, shape in
               ((2.0, (heads, height, height)), (2.0, (heads, width, width)), (1.0, (heads * d, out)), (1.0, (out,)))]
    target = ops.convert_to_tensor(rng.normal(size=(batch, height, width, out)).astype(np.float32))
    def separable(v, *w):
        return separable_attention(v, *w, recompute_gradient=recompute)

    got, want = (gradients(lambda v, fn=fn: ops.sum(fn(v, *weights) * target), x, weights)
                 for fn in (separable, dense_attention))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compute_dtype_keeps_float32_softmax(dtype):
    """The softmax runs in float32 and only its result is cast: a spread that overflows float16
    (exp(70000) does in any dtype, 70000 itself does in float16) still gives a finite output."""
    rng = np.random.default_rng(2)
    row = rng.normal(size=(2, 4, 4)).astype(np.float32) * 7e4
    col = rng.normal(size=(2, 3, 3)).astype(np.float32)
    x = rng.normal(size=(1, 4, 3, 2)).astype(np.float32)
    kernel = rng.normal(size=(4, 3)).astype(np.float32)
    got = separable_attention(ops.cast(x, dtype), row, col, kernel, dtype=dtype)
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(got, "float32")),
                               dense_reference(x.astype(np.float64), row, col, kernel, None), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("height,width,pays", [(7, 7, False), (8, 8, True), (5, 100, True), (4, 100, False), (2, 1000, False),
                                               (16, 16, True), (1, 1, False)])
def test_separable_pays_from_the_grid_size(height, width, pays):
    """``H W >= 4 (H + W)``: 8x8 is the first square grid, a 2-row strip never pays."""
    assert separable_pays(height, width) is pays
