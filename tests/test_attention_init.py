"""How attention starts (`sa_conv.attention_init`): the convolutional initialization of every
position-only encoding (Theorem 1's construction), mimetic initialization of content attention,
their options and errors. Backend-independent (also run under JAX and PyTorch)."""

import keras
import numpy as np
import pytest

import sa_conv
from sa_conv import MultiHeadSelfAttention2D
from sa_conv.attention_init import ConvolutionalInit, MimeticInit, convolutional_logits, get_attention_init, grid_shifts
from sa_conv.encodings import ENCODINGS
from tests import tolerances

CONVOLUTIONAL = [name for name, spec in ENCODINGS.items() if spec.cls.convolutional_init]
POSITION_ONLY = [name for name, spec in ENCODINGS.items() if spec.position_only]
GRID = 12


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _layer(encoding, dim=16, **kwargs):
    # Tables and features wide enough for the exact pattern (learned: one column per head;
    # sinusoidal: one feature per offset of the grid).
    kwargs.setdefault("position_embedding_dim", 32)
    layer = MultiHeadSelfAttention2D(9, encoding=encoding, max_grid_size=GRID, seed=3, **kwargs)
    x = np.random.default_rng(0).normal(size=(2, GRID, GRID, dim)).astype("float32")
    layer(x)
    return layer, x


def _probabilities(layer, x):
    p = _np(layer.attention_probabilities(x))
    return p if p.ndim == 4 else p[None]


def test_every_position_only_encoding_has_the_convolutional_initialization():
    assert set(POSITION_ONLY) <= set(CONVOLUTIONAL) and "gated" in CONVOLUTIONAL


def test_grid_shifts_are_the_kxk_convolution_taps_in_row_major_order():
    np.testing.assert_array_equal(grid_shifts(9), [[a, b] for a in (-1, 0, 1) for b in (-1, 0, 1)])
    np.testing.assert_array_equal(grid_shifts(25, spacing=2)[:2], [[-4, -4], [-4, -2]])
    np.testing.assert_array_equal(sa_conv.conversion.shifts(5, 2), grid_shifts(25, 2))  # one source of the taps
    four = grid_shifts(4)
    np.testing.assert_array_equal(four, [[0, 0], [0, 1], [1, 0], [1, 1]])
    six = grid_shifts(6)  # not a square: the grid points nearest the middle, each once
    assert len({tuple(s) for s in six}) == 6 and [0, 0] in six.tolist() and np.abs(six).max() == 1


@pytest.mark.parametrize("encoding", CONVOLUTIONAL)
def test_every_head_starts_attending_to_its_grid_shift(encoding):
    layer, x = _layer(encoding, attention_init="convolutional", locality_strength=1.0)
    p = _probabilities(layer, x)
    shifts = grid_shifts(9).astype(int)
    rows, cols = np.divmod(np.arange(GRID * GRID), GRID)
    interior = [q for q in range(GRID * GRID) if 2 <= rows[q] < GRID - 2 and 2 <= cols[q] < GRID - 2]
    if encoding == "gated":  # its positional half starts on the shifts
        p = _np(layer.position_encoding.positional_probabilities(GRID, GRID))[None]
    for h, (dy, dx) in enumerate(shifts):
        peaks = p[:, h][:, interior].argmax(-1)
        np.testing.assert_array_equal(rows[peaks] - rows[interior], np.full(peaks.shape, dy))
        np.testing.assert_array_equal(cols[peaks] - cols[interior], np.full(peaks.shape, dx))


@pytest.mark.parametrize("encoding", POSITION_ONLY)
def test_the_initial_logits_are_the_quadratic_pattern_of_each_shift(encoding):
    """Near every head's shift the pattern is exact: softmax of -alpha ||delta - Delta_h||^2 over
    a query's keys (the MLP's within its radius, where it is the same quadratic)."""
    layer, x = _layer(encoding, attention_init="convolutional", locality_strength=0.5)
    p = _probabilities(layer, x)[0]
    query = (GRID // 2) * GRID + GRID // 2
    rows, cols = np.divmod(np.arange(GRID * GRID), GRID)
    dy, dx = rows - GRID // 2, cols - GRID // 2
    near = (np.abs(dy) <= 5) & (np.abs(dx) <= 5)
    terms, count = _logit_terms(layer)
    for h, (sy, sx) in enumerate(grid_shifts(9)):
        logits = -0.5 * ((dy - sy) ** 2 + (dx - sx) ** 2)
        expected = np.exp(logits[near] - logits[near].max())
        expected /= expected.sum()
        got = p[h, query, near]
        # float32 evaluates each logit as sums of K terms of up to `terms[h]` in all: it may move
        # by sqrt(K) u of that, and by u of it again where the weights were stored in float32 (the
        # sinusoidal fit's terms cancel: hundreds, for logits of tens). A softmax moves each
        # probability p by at most 2 p max|d logit|.
        logit_error = (np.sqrt(count) + 1) * tolerances.FLOAT32_UNIT * terms[h]
        np.testing.assert_allclose(got / got.sum(), expected, rtol=0, atol=2 * logit_error * expected.max() + 1e-6)
        assert got.sum() > 0.999  # what lies outside the window is negligible


def _logit_terms(layer):
    """``(terms, K)``: per head, the largest sum of the magnitudes of the terms a positional logit adds up (its
    float32 rounding is relative to that, not to the logit). For a sinusoidal encoding, the
    features times the fitted vectors, row and column, computed; for the others, a bound."""
    from sa_conv.encodings.base import axis_offsets
    from sa_conv.encodings.sinusoidal import SinusoidalRelativeEncoding, sinusoid_features

    encoding = layer.position_encoding
    if isinstance(encoding, SinusoidalRelativeEncoding):
        features = np.abs(sinusoid_features(axis_offsets(GRID), encoding.feature_dim)).astype(np.float64)
        terms = sum((features @ np.abs(_np(keys)).astype(np.float64)).max(axis=(0, 1))
                    for keys in (encoding.row_head_keys, encoding.col_head_keys))
        return terms, 2 * encoding.feature_dim
    # The others' logits in the window reach 36 (0.5 (5 + 1)^2 per axis); the MLP encoding's
    # start adds a bias near -30 and some 15 hinge terms per axis that cancel: 1,000 terms' worth
    # and K = 64 bound them all.
    return np.full(9, 1000.0), 64


@pytest.mark.parametrize("encoding", CONVOLUTIONAL)
def test_at_a_high_strength_the_initialized_layer_is_the_convolution_of_its_value_maps(encoding):
    """Theorem 1's construction: value maps copied from a 3x3 Conv2D, heads on the grid at a
    high locality strength -> the convolution's outputs (on pixels whose taps are all inside the
    grid: at the border the softmax has no padding to attend to). For the gated encoding, with
    its gates at 1 (all positional)."""
    dim, out = 6, 5
    layer = MultiHeadSelfAttention2D(9, encoding=encoding, max_grid_size=GRID, seed=1, attention_init="convolutional",
                                     locality_strength=40.0, output_dim=out, position_embedding_dim=32,
                                     encoding_options={"gate_init": 30.0} if encoding == "gated" else None)
    x = np.random.default_rng(1).normal(size=(2, GRID, GRID, dim)).astype("float32")
    layer(x)
    conv = keras.layers.Conv2D(out, 3, padding="same")
    expected = _np(conv(x))
    kernel = _np(conv.kernel)  # (3, 3, dim, out); head h = (a, c) row-major takes tap (a, c)
    layer.set_value_map(kernel.reshape(9, dim, out), _np(conv.bias))
    got = _np(layer(x))
    np.testing.assert_allclose(got[:, 1:-1, 1:-1], expected[:, 1:-1, 1:-1], atol=1e-4)


def test_locality_strength_sets_how_sharply_heads_start():
    peaks = {}
    for strength in (0.1, 1.0, 10.0):
        layer, x = _layer("quadratic", attention_init="convolutional", locality_strength=strength)
        peaks[strength] = _probabilities(layer, x)[0].max(-1).mean()
        np.testing.assert_allclose(_np(layer.position_encoding.alphas()), strength, rtol=1e-6)
    assert peaks[0.1] < peaks[1.0] < peaks[10.0] and peaks[10.0] > 0.99


def test_locality_distance_spaces_the_grid():
    layer, _ = _layer("quadratic", attention_init="convolutional", locality_distance=2.0)
    np.testing.assert_array_equal(_np(layer.position_encoding.centers), grid_shifts(9, 2.0))
    config = sa_conv.get_config("sa_quadratic_small", attention_init="convolutional", locality_distance=3.0,
                                num_layers=1)
    centers = sa_conv.build_model(config).get_layer("block_0").attention.position_encoding.centers
    np.testing.assert_array_equal(_np(centers), grid_shifts(9, 3.0))
    with pytest.raises(ValueError, match="locality_distance must be positive"):
        sa_conv.get_config("sa_quadratic_small", attention_init="convolutional", locality_distance=0)


def test_random_initialization_is_unchanged_by_the_new_options():
    """The default leaves every weight as the encodings' own initializers make them."""
    keras.utils.set_random_seed(0)
    a, _ = _layer("learned")
    keras.utils.set_random_seed(0)
    b, _ = _layer("learned", attention_init="random", locality_strength=7.0)
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(_np(wa), _np(wb))


def test_mimetic_initialization_makes_query_key_products_a_scaled_identity_plus_noise():
    layer, x = _layer("content_plus_learned_bias", dim=32, attention_init="mimetic")
    dim = layer.input_dim
    wq = _np(layer.query_dense.kernel).reshape(dim, 9, dim)
    wk = _np(layer.key_dense.kernel).reshape(dim, 9, dim)
    for h in range(9):
        product = wq[:, h] @ wk[:, h].T
        noise = product - 0.7 * np.eye(dim)
        # alpha Z with Z ~ N(0, 1/D): the entries' spread is 0.7 / sqrt(D), their mean ~0.
        assert abs(noise.std() * np.sqrt(dim) / 0.7 - 1) < 0.15 and abs(noise.mean()) < 0.05
    assert not np.allclose(wq[:, 0] @ wk[:, 0].T, wq[:, 1] @ wk[:, 1].T)  # each head its own noise
    np.testing.assert_array_equal(_np(layer.query_dense.bias), 0)


def test_unseeded_mimetic_initialization_follows_keras_global_seed():
    def query_kernel(seed):
        keras.utils.set_random_seed(seed)
        layer = MultiHeadSelfAttention2D(4, encoding="content_plus_learned_bias", max_grid_size=GRID,
                                         attention_init="mimetic")
        layer(np.zeros((1, GRID, GRID, 8), np.float32))
        return keras.ops.convert_to_numpy(layer.query_dense.kernel)

    first = query_kernel(0)
    np.testing.assert_array_equal(query_kernel(0), first)  # formerly drawn from the OS's entropy
    assert not np.allclose(query_kernel(1), first)


def test_mimetic_content_attention_starts_attending_to_similar_pixels():
    """Products near the identity make a pixel's own key score high: the attention a query
    pays to itself is far above uniform, where the random initialization's is about uniform."""
    self_attention = {}
    for init in ("random", "mimetic"):
        layer, x = _layer("content_with_relative_keys", dim=32, attention_init=init)
        p = _probabilities(layer, x)
        self_attention[init] = np.einsum("bhqq->", p) / (p.shape[0] * p.shape[1] * p.shape[2])
    uniform = 1 / GRID ** 2
    assert self_attention["random"] < 3 * uniform and self_attention["mimetic"] > 10 * uniform


def test_mimetic_initialization_with_fewer_query_channels_is_the_best_low_rank_product():
    layer, _ = _layer("gated", dim=27, attention_init="mimetic")  # d = 27 // 9 = 3 channels per head
    assert layer.query_dense.units == 27
    init = MimeticInit(seed=layer.sublayer_seed(1))
    rng = np.random.default_rng(init.seed)
    target = 0.7 * rng.normal(0.0, 1.0 / np.sqrt(27), (27, 27)) + 0.7 * np.eye(27)
    u, s, vt = np.linalg.svd(target)
    best = (u[:, :3] * s[:3]) @ vt[:3]
    product = _np(layer.query_dense.kernel)[:, :3] @ _np(layer.key_dense.kernel)[:, :3].T
    np.testing.assert_allclose(product, best, atol=1e-5)


@pytest.mark.parametrize("encoding,init,message", [
    ("content_plus_learned_bias", "convolutional", "has none. Use one of quadratic"),
    ("content_with_relative_keys", "convolutional", "'random' or 'mimetic'"),
    ("quadratic", "mimetic", "position only"),
    ("learned", "sideways", "must be one of random, convolutional, mimetic"),
])
def test_initializations_an_encoding_cannot_take_are_refused_naming_the_choices(encoding, init, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadSelfAttention2D(9, encoding=encoding, attention_init=init)
    with pytest.raises(ValueError, match=message):
        sa_conv.get_config("sa_quadratic_small", encoding=encoding, attention_init=init)


def test_bad_locality_options_are_refused():
    with pytest.raises(ValueError, match="locality_strength must be positive"):
        get_attention_init("convolutional", locality_strength=0.0)
    with pytest.raises(ValueError, match="locality_distance must be positive"):
        ConvolutionalInit(1.0, spacing=-1)
    with pytest.raises(ValueError, match="locality_strength must be positive"):
        sa_conv.get_config("sa_learned_small", attention_init="convolutional", locality_strength=-2)


def test_too_small_position_tables_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="position_embedding_dim"):
        _layer("learned", position_embedding_dim=4, attention_init="convolutional")
    with pytest.raises(ValueError, match="hidden_units >= 10"):
        _layer("mlp", encoding_options={"hidden_units": 8}, attention_init="convolutional")


def test_convolutional_logits_are_minus_strength_times_the_squared_distance():
    np.testing.assert_array_equal(convolutional_logits([0, 1], 2.0, np.array([-1, 0, 2])),
                                  [[-2, 0, -8], [-8, -2, -2]])


def test_models_configs_and_files_keep_the_initialization(tmp_path):
    config = sa_conv.get_config("sa_sinusoidal_small", attention_init="convolutional", locality_strength=3.0,
                                num_layers=1)
    model = sa_conv.build_model(config)
    attention = model.get_layer("block_0").attention
    assert (attention.attention_init, attention.locality_strength) == ("convolutional", 3.0)
    restored = MultiHeadSelfAttention2D.from_config(attention.get_config())
    assert (restored.attention_init, restored.locality_strength) == ("convolutional", 3.0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(_np(loaded(images)), _np(model(images)), atol=1e-6)
    # Presets other than the gated ones keep their random initialization, and so their configs.
    assert sa_conv.get_config("sa_quadratic").attention_init == "random"
    assert "attention_init" not in sa_conv.build_model("sa_learned_small", num_layers=1).get_layer(
        "block_0").attention_config
