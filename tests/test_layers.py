"""Layers: invertible pooling, relative encodings and 2-D multi-head self-attention."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from sa_conv import encodings as pe
from sa_conv.attention import MultiHeadSelfAttention2D

RNG = np.random.default_rng(0)


def _np(x):
    return ops.convert_to_numpy(x)


# ------------------------------------------------------------------ invertible pooling


def test_invertible_pooling_hand_worked_4x4():
    # One channel, values 0..15 row-major; width 2 -> 2x2 grid of 4 channels.
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    y = _np(sa_conv.InvertiblePooling(2)(x))
    assert y.shape == (1, 2, 2, 4)
    # Channel (dy * 2 + dx) holds the pixel at offset (dy, dx) of each 2x2 block.
    np.testing.assert_array_equal(y[0, 0, 0], [0, 1, 4, 5])
    np.testing.assert_array_equal(y[0, 0, 1], [2, 3, 6, 7])
    np.testing.assert_array_equal(y[0, 1, 0], [8, 9, 12, 13])
    np.testing.assert_array_equal(y[0, 1, 1], [10, 11, 14, 15])


@pytest.mark.parametrize("width,shape", [(2, (3, 8, 6, 5)), (3, (2, 9, 3, 2)), (1, (1, 4, 4, 3))])
def test_invertible_pooling_inverse_is_exact(width, shape):
    x = RNG.normal(size=shape).astype(np.float32)
    pooled = sa_conv.InvertiblePooling(width)(x)
    assert pooled.shape == (shape[0], shape[1] // width, shape[2] // width, shape[3] * width**2)
    np.testing.assert_array_equal(_np(sa_conv.InvertibleUnpooling(width)(pooled)), x)


def test_invertible_pooling_matches_space_to_depth():
    x = RNG.normal(size=(2, 6, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(
        _np(sa_conv.InvertiblePooling(2)(x)), _np(ops.space_to_depth(x, 2))
    )


def test_invertible_pooling_traces_with_unknown_height_and_width():
    """A graph over images of any size (a SavedModel's signature, say) knows the sizes only when run."""
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a tf.function of a Keras layer")
    pool, unpool = sa_conv.InvertiblePooling(2), sa_conv.InvertibleUnpooling(2)
    spec = tf.TensorSpec((None, None, None, 3), tf.float32)
    pooled = tf.function(pool, input_signature=[spec])
    x = np.arange(2 * 4 * 6 * 3, dtype="float32").reshape(2, 4, 6, 3)
    np.testing.assert_array_equal(pooled(x).numpy(), keras.ops.convert_to_numpy(pool(x)))
    restored = tf.function(unpool, input_signature=[tf.TensorSpec((None, None, None, 12), tf.float32)])
    np.testing.assert_array_equal(restored(pooled(x)).numpy(), x)


def test_invertible_pooling_errors():
    with pytest.raises(ValueError, match="height 5 is not divisible by 2"):
        sa_conv.InvertiblePooling(2)(np.zeros((1, 5, 4, 1), np.float32))
    with pytest.raises(ValueError, match="rank 3"):
        sa_conv.InvertiblePooling(2)(np.zeros((5, 4, 1), np.float32))
    with pytest.raises(ValueError, match="not divisible by width\\*\\*2"):
        sa_conv.InvertibleUnpooling(2)(np.zeros((1, 2, 2, 3), np.float32))


# ------------------------------------------------------------------ quadratic encoding


def _quadratic(heads=4, covariance="isotropic", centers=None, spreads=None):
    enc = pe.QuadraticEncoding(heads, covariance=covariance)
    enc.build()
    if centers is not None:
        enc.centers.assign(np.asarray(centers, np.float32))
    if spreads is not None:
        enc.spreads.assign(np.asarray(spreads, np.float32))
    return enc


def test_quadratic_scores_match_hand_computation_up_to_a_per_query_constant():
    height, width = 3, 4
    centers = np.array([[0.5, -1.0], [1.0, 2.0]], np.float32)
    s = np.array([1.3, 0.7], np.float32)
    alpha = s**2 / 2
    enc = _quadratic(2, centers=centers, spreads=s)
    logits = _np(enc.logits(height, width))
    assert logits.shape == (2, 12, 12)
    expected = np.zeros((2, 12, 12))
    for h in range(2):
        for q in range(12):
            qi, qj = divmod(q, width)
            expected[h, q] = [
                -alpha[h] * ((ki - qi - centers[h, 0]) ** 2 + (kj - qj - centers[h, 1]) ** 2)
                for ki in range(height) for kj in range(width)
            ]
            diff = logits[h, q] - expected[h, q]
            np.testing.assert_allclose(diff, diff[0], atol=1e-5)  # a per-query constant (here 0)
    # Probabilities: softmax of the hand-computed scores (which a per-query constant leaves
    # unchanged), in float64: float32 logits of up to ~19 leave ~2e-6 relative (measured).
    probs = _np(enc.probabilities(height, width))
    want = np.exp(expected - expected.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-7)


def test_quadratic_with_large_alpha_is_one_hot_at_q_plus_delta():
    height, width = 7, 7
    centers = np.array([[-1, -1], [0, 1], [1, 0], [1, 1]], np.float32)
    enc = _quadratic(4, centers=centers, spreads=np.full(4, np.sqrt(2 * 50.0)))  # alpha = 50
    probs = _np(ops.softmax(enc.logits(height, width), axis=-1))
    for h, (dy, dx) in enumerate(centers.astype(int)):
        for qi in range(1, 6):
            for qj in range(1, 6):
                q = qi * width + qj
                k = (qi + dy) * width + (qj + dx)
                assert probs[h, q, k] > 1 - 1e-6
                assert probs[h, q].argmax() == k


def test_quadratic_full_equals_mahalanobis_form():
    a = np.array([[[1.0, 0.0], [0.3, 0.8]], [[0.5, 0.2], [-0.1, 1.1]]], np.float32)
    centers = np.array([[0.2, 0.4], [-1.0, 0.5]], np.float32)
    enc = _quadratic(2, covariance="full", centers=centers, spreads=a)
    logits = _np(enc.logits(3, 2))
    dy, dx = pe.relative_offsets(3, 2)
    for h in range(2):
        inv = a[h] @ a[h].T
        e = np.stack([dy - centers[h, 0], dx - centers[h, 1]], -1)
        expected = -0.5 * np.einsum("qki,ij,qkj->qk", e, inv, e)
        np.testing.assert_allclose(logits[h], expected, rtol=1e-5, atol=1e-5)


def test_isotropic_is_full_with_scaled_identity():
    centers = RNG.normal(size=(3, 2)).astype(np.float32)
    s = np.array([0.5, 1.0, 1.5], np.float32)
    iso = _quadratic(3, centers=centers, spreads=s)
    full = _quadratic(3, "full", centers=centers, spreads=s[:, None, None] * np.eye(2, dtype=np.float32))
    np.testing.assert_allclose(_np(iso.logits(4, 5)), _np(full.logits(4, 5)), atol=1e-5)


def test_quadratic_initialization():
    enc = pe.QuadraticEncoding(2000, seed=1)
    enc.build()
    centers, spreads = _np(enc.centers), _np(enc.spreads)
    assert abs(centers.std() - 2.0) < 0.1 and abs(centers.mean()) < 0.1
    alpha = spreads**2 / 2
    assert abs(alpha.mean() - 0.5) < 0.01 and spreads.std() < 0.02


# ------------------------------------------------------------------ learned encodings


def test_learned_score_is_the_sum_of_the_right_table_rows():
    heads, p, e = 3, 8, 5
    enc = pe.LearnedRelativeEncoding(heads, p, e, seed=2)
    enc.build()
    row, col = _np(enc.row_embeddings), _np(enc.col_embeddings)
    wr, wc = _np(enc.row_head_keys), _np(enc.col_head_keys)
    height, width = 6, 4  # non-square: rows and columns must not be swapped
    logits = _np(enc.logits(height, width))
    assert logits.shape == (heads, 24, 24)
    for (qi, qj, ki, kj) in [(0, 0, 5, 3), (5, 3, 0, 0), (2, 1, 4, 0), (3, 3, 3, 3)]:
        q, k = qi * width + qj, ki * width + kj
        dy, dx = ki - qi, kj - qj
        for h in range(heads):
            expected = wr[:, h] @ row[dy + p - 1] + wc[:, h] @ col[dx + p - 1]
            np.testing.assert_allclose(logits[h, q, k], expected, rtol=1e-5, atol=1e-7)


def test_content_with_relative_keys_relative_term():
    p, d, heads = 8, 6, 2
    enc = pe.ContentWithRelativeKeysEncoding(p, d, seed=3)
    enc.build()
    row, col = _np(enc.row_embeddings), _np(enc.col_embeddings)
    height, width = 3, 5
    q = RNG.normal(size=(2, heads, height, width, d)).astype(np.float32)
    scores = _np(enc.relative_logits(q))
    assert scores.shape == (2, heads, 15, 15)
    for b, h, qi, qj, ki, kj in [(0, 0, 0, 0, 2, 4), (1, 1, 2, 3, 0, 1), (1, 0, 1, 2, 1, 2)]:
        qv = q[b, h, qi, qj]
        expected = qv[:3] @ row[ki - qi + p - 1] + qv[3:] @ col[kj - qj + p - 1]
        np.testing.assert_allclose(scores[b, h, qi * width + qj, ki * width + kj], expected, rtol=1e-5, atol=1e-6)


def test_the_content_encodings_are_two_classes_named_for_what_they_compute():
    assert sa_conv.ENCODINGS["content_plus_learned_bias"].cls is sa_conv.ContentPlusLearnedBiasEncoding
    assert sa_conv.ENCODINGS["content_with_relative_keys"].cls is sa_conv.ContentWithRelativeKeysEncoding
    assert sa_conv.ENCODINGS["content_plus_learned_bias"].has_position_bias
    assert not sa_conv.ENCODINGS["content_with_relative_keys"].has_position_bias


def test_grid_larger_than_learned_table():
    layer = MultiHeadSelfAttention2D(2, encoding="learned", max_grid_size=4)
    with pytest.raises(ValueError, match="grid is 5x3.*max_grid_size=4"):
        layer(np.zeros((1, 5, 3, 4), np.float32))


# ------------------------------------------------------------------ attention layer


@pytest.mark.parametrize("encoding", sa_conv.ENCODINGS)
def test_attention_probabilities_are_normalized_and_output_shape(encoding):
    layer = MultiHeadSelfAttention2D(4, output_dim=6, encoding=encoding, max_grid_size=10, seed=0)
    x = RNG.normal(size=(3, 6, 10, 8)).astype(np.float32)
    out, probs = layer(x, return_attention_scores=True)
    assert out.shape == (3, 6, 10, 6)
    probs = _np(probs)
    assert probs.shape == (3, 4, 60, 60) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    if sa_conv.get_encoding(encoding).position_only:
        # Position only: identical for every example of the batch.
        np.testing.assert_array_equal(probs[0], probs[1])
        np.testing.assert_array_equal(probs[0], probs[2])
    else:
        assert np.abs(probs[0] - probs[1]).max() > 1e-6


@pytest.mark.parametrize("encoding", sa_conv.ENCODINGS)
def test_output_equals_the_papers_formula(encoding):
    """out_q = sum_h sum_k P_h[q, k] X_k W^(h) + b, with W^(h) the head's slice of the value map."""
    layer = MultiHeadSelfAttention2D(3, output_dim=5, encoding=encoding, max_grid_size=6, seed=1)
    x = RNG.normal(size=(2, 4, 6, 4)).astype(np.float32)
    out, probs = layer(x, return_attention_scores=True)
    kernel, bias = (_np(w) for w in layer.value_dense.weights)
    w = kernel.reshape(3, 4, 5)  # rows ordered [head, channel]
    xf = x.reshape(2, 24, 4)
    expected = np.einsum("bhqk,bkd,hde->bqe", _np(probs), xf, w) + bias
    np.testing.assert_allclose(_np(out).reshape(2, 24, 5), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("encoding", ["quadratic", "content_plus_learned_bias"])
@pytest.mark.parametrize("recompute_gradient", [False, True])
def test_dropout_seed_applies_the_mask_it_draws_head_by_head(encoding, recompute_gradient):
    """In training, the mask drawn from ``dropout_seed`` (`draw_keep_mask`) on the probabilities,
    the value map applied one head at a time: the formula with the masked, rescaled
    probabilities, on either aggregation (gradients: tests/test_remat.py, TensorFlow)."""
    from sa_conv.seeded_dropout import draw_keep_mask

    rate = 0.3
    layer = MultiHeadSelfAttention2D(3, output_dim=5, encoding=encoding, max_grid_size=6, attention_dropout=rate,
                                     seed=2, recompute_gradient=recompute_gradient)
    x = ops.convert_to_tensor(RNG.normal(size=(2, 4, 6, 4)).astype(np.float32))
    _, probs = layer(x, return_attention_scores=True)
    seed = keras.random.SeedGenerator(7).next()  # a seed tensor of the backend's dtype
    out = layer(x, training=True, dropout_seed=seed)
    keep = _np(draw_keep_mask((2, 3, 24, 24), seed, rate))
    kernel, bias = (_np(w) for w in layer.value_dense.weights)
    dropped = np.where(keep, _np(probs) / (1 - rate), 0.0)
    expected = np.einsum("bhqk,bkd,hde->bqe", dropped, _np(x).reshape(2, 24, 4), kernel.reshape(3, 4, 5)) + bias
    np.testing.assert_allclose(_np(out).reshape(2, 24, 5), expected, rtol=1e-4, atol=1e-5)
    assert np.abs(_np(out) - _np(layer(x))).max() > 1e-3  # the mask did drop weights
    np.testing.assert_array_equal(_np(layer(x, training=False, dropout_seed=seed)), _np(layer(x)))  # inference: none


def test_position_only_attention_is_translation_equivariant_on_interior_pixels():
    layer = MultiHeadSelfAttention2D(4, encoding="quadratic", seed=4)
    layer.build((None, 16, 16, 3))
    enc = layer.position_encoding
    enc.centers.assign(np.array([[0, 1], [1, 0], [-1, 1], [0.3, -0.6]], np.float32))
    enc.spreads.assign(np.full(4, 2.5, np.float32))  # concentrated: borders barely matter
    x = RNG.normal(size=(1, 16, 16, 3)).astype(np.float32)
    shifted = np.roll(x, shift=(2, 3), axis=(1, 2))
    y, y_shifted = _np(layer(x)), _np(layer(shifted))
    # Interior: away from the wrapped border by more than the attention's reach.
    np.testing.assert_allclose(y_shifted[0, 7:12, 8:13], y[0, 5:10, 5:10], rtol=1e-3, atol=1e-3)


def test_content_attention_matches_hand_computation():
    layer = MultiHeadSelfAttention2D(2, encoding="content_with_relative_keys", max_grid_size=4, seed=5)
    x = RNG.normal(size=(1, 2, 3, 4)).astype(np.float32)
    _, probs = layer(x, return_attention_scores=True)
    wq, bq = (_np(w) for w in layer.query_dense.weights)
    wk, bk = (_np(w) for w in layer.key_dense.weights)
    row, col = _np(layer.position_encoding.row_embeddings), _np(layer.position_encoding.col_embeddings)
    xf = x.reshape(6, 4)
    q = (xf @ wq + bq).reshape(6, 2, 4)
    k = (xf @ wk + bk).reshape(6, 2, 4)
    for h in range(2):
        logits = np.zeros((6, 6))
        for a in range(6):
            for b in range(6):
                (ai, aj), (bi, bj) = divmod(a, 3), divmod(b, 3)
                rel = q[a, h, :2] @ row[bi - ai + 3] + q[a, h, 2:] @ col[bj - aj + 3]
                logits[a, b] = (q[a, h] @ k[b, h] + rel) / 2.0  # sqrt(4)
        expected = np.exp(logits - logits.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        np.testing.assert_allclose(_np(probs)[0, h], expected, rtol=1e-4, atol=1e-6)


def test_attention_dropout_uses_independent_masks_per_example():
    layer = MultiHeadSelfAttention2D(2, encoding="quadratic", attention_dropout=0.5, seed=6)
    x = np.ones((4, 4, 4, 3), np.float32)
    x = np.broadcast_to(RNG.normal(size=(1, 4, 4, 3)).astype(np.float32), (4, 4, 4, 3))
    train_out = _np(layer(x, training=True))
    infer_out = _np(layer(x, training=False))
    # Same input for every example: inference outputs agree, training outputs differ.
    np.testing.assert_allclose(infer_out[0], infer_out[3], atol=1e-6)
    assert np.abs(train_out[0] - train_out[1]).max() > 1e-3
    np.testing.assert_allclose(_np(layer(x)), infer_out, atol=1e-6)


def test_attention_errors():
    with pytest.raises(ValueError, match="Unknown encoding 'gaussian'"):
        MultiHeadSelfAttention2D(4, encoding="gaussian")
    with pytest.raises(ValueError, match="num_heads must be positive"):
        MultiHeadSelfAttention2D(0)
    with pytest.raises(ValueError, match="rank 3"):
        MultiHeadSelfAttention2D(2)(np.zeros((2, 16, 8), np.float32))
    with pytest.raises(ValueError, match="query size.*must be even, got 5"):
        MultiHeadSelfAttention2D(2, encoding="content_with_relative_keys")(np.zeros((1, 2, 2, 5), np.float32))
    # Formerly built, then failed in fit or predict on the output projection's input size.
    block = sa_conv.TransformerBlock(8, attention_config={"num_heads": 2, "output_dim": 6})
    with pytest.raises(ValueError, match="output_dim=6: a TransformerBlock's attention keeps the block's 8 channels"):
        keras.Sequential([keras.Input((4, 4, 8)), block])
    same = sa_conv.TransformerBlock(8, attention_config={"num_heads": 2, "output_dim": 8})
    assert same(np.zeros((1, 4, 4, 8), np.float32)).shape == (1, 4, 4, 8)


# ------------------------------------------------------------------ serialization


LAYERS = [
    lambda: sa_conv.InvertiblePooling(2),
    lambda: sa_conv.InvertibleUnpooling(2),
    lambda: sa_conv.PixelNormalization(),
    lambda: pe.QuadraticEncoding(4, covariance="full", center_init_std=1.0),
    lambda: pe.LearnedRelativeEncoding(4, 8, 6),
    lambda: pe.ContentWithRelativeKeysEncoding(8, 6),
    lambda: pe.ContentPlusLearnedBiasEncoding(8, 6, num_heads=3, embedding_dim=4),
    lambda: MultiHeadSelfAttention2D(4, output_dim=7, encoding="learned", max_grid_size=9, attention_dropout=0.2),
    lambda: sa_conv.TransformerBlock(16, dropout=0.2, attention_config={"num_heads": 4, "encoding": "quadratic_full"}),
]


def test_a_transformer_blocks_initializers_reach_its_attention_unless_its_config_names_others():
    block = sa_conv.TransformerBlock(8, bias_initializer="ones", attention_config={
        "num_heads": 2, "encoding": "content_plus_learned_bias"})
    block.build((1, 4, 4, 8))
    for name in ("query_dense", "key_dense", "value_dense"):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(getattr(block.attention, name).bias), 1.0)
    own = sa_conv.TransformerBlock(8, attention_config={"num_heads": 2, "kernel_initializer": "zeros"})
    own.build((1, 4, 4, 8))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(own.attention.value_dense.kernel), 0.0)
    assert np.abs(keras.ops.convert_to_numpy(own.intermediate.kernel)).max() > 0  # the block's own: glorot


@pytest.mark.parametrize("make", [lambda: MultiHeadSelfAttention2D(2, encoding="content_plus_learned_bias"),
                                  lambda: sa_conv.TransformerBlock(8, attention_config={"num_heads": 2})])
def test_attention_scores_are_a_functional_models_output(make):
    """``return_attention_scores=True`` on a symbolic input gives the scores' tensor too (Keras's
    MultiHeadAttention does): a functional model can output them."""
    layer = make()
    inputs = keras.Input((4, 4, 8))
    outputs, scores = layer(inputs, return_attention_scores=True)
    assert tuple(scores.shape) == (None, 2, 16, 16) and tuple(outputs.shape) == (None, 4, 4, 8)
    model = keras.Model(inputs, [outputs, scores])
    x = np.random.default_rng(0).normal(size=(3, 4, 4, 8)).astype("float32")
    got, probabilities = (keras.ops.convert_to_numpy(t) for t in model(x))
    want, want_scores = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(want), atol=1e-6)
    np.testing.assert_allclose(probabilities, keras.ops.convert_to_numpy(want_scores), atol=1e-6)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("make", LAYERS)
def test_get_config_round_trips(make):
    layer = make()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    # Also through Keras's registered serialization.
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(again) is type(layer) and again.get_config() == config


# ------------------------------------------------------------------ mixed precision


@pytest.mark.parametrize("encoding", sa_conv.ENCODINGS)
def test_mixed_bfloat16_attention_outputs_bfloat16_and_scores_whose_rows_sum_to_one(encoding):
    """bfloat16 outputs, float32 weights and returned scores. Position-only probabilities are a
    float32 softmax (rows sum to 1 within float32 rounding); content attention's are computed in
    bfloat16, each rounded by 2^-8 relative, up to about 2^-6 by TensorFlow's own softmax, which
    also rounds exp's argument: rows within 2^-5 of 1."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        layer = MultiHeadSelfAttention2D(4, encoding=encoding, max_grid_size=8, seed=0)
        x = RNG.normal(size=(2, 4, 8, 8)).astype(np.float32)
        out, probs = layer(x, return_attention_scores=True)
        assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(probs.dtype) == "float32"
        assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in layer.weights)
        np.testing.assert_allclose(_np(probs).sum(-1), 1.0, atol=1e-5 if layer.position_only else 2 ** -5)
        ref = MultiHeadSelfAttention2D.from_config({**layer.get_config(), "dtype": "float32"})
        ref.build(x.shape)
        ref.set_weights(layer.get_weights())
        np.testing.assert_allclose(_np(ops.cast(out, "float32")), _np(ref(x)), rtol=0.05, atol=0.05)
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("shared", [False, True], ids=["per_example", "shared_by_the_batch"])
def test_the_per_head_sum_is_eq6s_contraction_over_keys_in_query_head_channel_order(shared):
    """`aggregation.heads_times_pixels`: ``out[b, q, h, d] = sum_k P[b?, h, q, k] X[b, k, d]``, as a
    loop over examples, heads and queries writes it (4 examples, 3 heads, 6 pixels, 5 channels)."""
    from sa_conv.aggregation import heads_times_pixels

    rng = np.random.default_rng(1)
    p = rng.random((3, 6, 6) if shared else (4, 3, 6, 6)).astype("float32")
    x = rng.normal(size=(4, 6, 5)).astype("float32")
    expected = np.zeros((4, 6, 3, 5), "float32")
    for b in range(4):
        for h in range(3):
            for q in range(6):
                expected[b, q, h] = (p[h, q] if shared else p[b, h, q]) @ x[b]
    np.testing.assert_allclose(ops.convert_to_numpy(heads_times_pixels(ops.convert_to_tensor(p),
                                                                       ops.convert_to_tensor(x))),
                               expected, rtol=1e-5, atol=1e-5)
