"""Gated positional self-attention (ConViT's GPSA, the ``gated`` encoding): its equation, gates,
training, saving, serving copy and inspection. Backend-independent (also run under JAX and
PyTorch)."""

import keras
import numpy as np
import pytest

import sa_conv
from sa_conv import MultiHeadSelfAttention2D, aggregation, heads, inspection, serving
from sa_conv.attention_init import grid_shifts

GRID, DIM = 6, 18


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(-1, keepdims=True)


def _layer(**kwargs):
    layer = MultiHeadSelfAttention2D(9, encoding="gated", seed=2, **kwargs)
    x = np.random.default_rng(0).normal(size=(2, GRID, GRID, DIM)).astype("float32")
    layer(x)
    return layer, x


def test_probabilities_are_the_gated_mixture_of_a_content_and_a_positional_softmax():
    layer, x = _layer(attention_init="convolutional")
    encoding = layer.position_encoding
    encoding.gating.assign(np.linspace(-2, 2, 9).astype("float32"))  # different gates per head
    d = DIM // 9
    n = GRID * GRID
    flat = x.reshape(2, n, DIM)
    q = (flat @ _np(layer.query_dense.kernel) + _np(layer.query_dense.bias)).reshape(2, n, 9, d).transpose(0, 2, 1, 3)
    k = (flat @ _np(layer.key_dense.kernel) + _np(layer.key_dense.bias)).reshape(2, n, 9, d).transpose(0, 2, 1, 3)
    content = _softmax(np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d))
    rows, cols = np.divmod(np.arange(n), GRID)
    dy, dx = rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]
    centers, alphas = _np(encoding.position.centers), _np(encoding.position.alphas())
    positional = _softmax(-alphas[:, None, None] * ((dy - centers[:, :1, None]) ** 2 + (dx - centers[:, 1:, None]) ** 2))
    g = 1 / (1 + np.exp(-np.linspace(-2, 2, 9)))[:, None, None]
    expected = (1 - g) * content + g * positional
    got = _np(layer.attention_probabilities(x))
    np.testing.assert_allclose(got, expected, atol=2e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    _, scores = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(_np(scores), expected, atol=2e-6)
    # Eq. (6) from the two halves (aggregation.MixtureSum), as from the mixture they make.
    assert isinstance(layer.aggregation_for((GRID, GRID)), aggregation.MixtureSum)
    mixed = np.einsum("bhqk,bkd->bqhd", expected, flat).reshape(2, GRID, GRID, 9 * DIM)
    want = mixed @ _np(layer.value_dense.kernel) + _np(layer.value_dense.bias)
    np.testing.assert_allclose(_np(layer(x)), want, atol=2e-5)


def test_attention_dropout_drops_the_mixture_as_the_dense_sum_does():
    """With attention dropout the mask is per probability: the mixture is formed and dropped as
    `aggregation.DenseSum` drops any other content attention's."""
    layer, x = _layer(attention_dropout=0.5)
    seed = layer.dropout.seed_generator.next()
    dropped = _np(layer(x, training=True, dropout_seed=seed))
    dense = aggregation.DenseSum(0.5, shared=False)(x, layer.attention_probabilities(x), layer.value_dense, "float32",
                                                    seed)
    np.testing.assert_allclose(dropped, _np(dense), atol=1e-5)
    assert not np.allclose(dropped, _np(layer(x)), atol=1e-3)


def test_gates_start_at_convit_s_value_and_the_positional_half_on_the_grid():
    layer, _ = _layer(attention_init="convolutional")
    np.testing.assert_allclose(_np(layer.position_encoding.gates()), 1 / (1 + np.exp(-1.0)), rtol=1e-6)
    np.testing.assert_array_equal(_np(layer.position_encoding.position.centers), grid_shifts(9))
    # The content half has D / heads channels per head (ConViT's), or what encoding_options ask.
    assert layer.query_dense.units == 9 * (DIM // 9)
    wide, _ = _layer(encoding_options={"query_dim": 5, "gate_init": -1.0})
    assert wide.query_dense.units == 45
    np.testing.assert_allclose(_np(wide.position_encoding.gates()), 1 / (1 + np.exp(1.0)), rtol=1e-6)


def test_random_initialization_leaves_the_positional_half_random():
    layer, _ = _layer(attention_init="random")
    centers = _np(layer.position_encoding.position.centers)
    assert not np.allclose(centers, grid_shifts(9)) and centers.std() > 0.5


def test_gated_attention_has_no_single_set_of_logits():
    layer, x = _layer()
    with pytest.raises(ValueError, match="mixes two softmaxes"):
        layer.attention_logits(x)


def test_a_training_step_moves_gates_centers_spreads_and_the_content_maps():
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model("sa_gated_small", num_layers=1)
    encoding = model.get_layer("block_0").attention.position_encoding
    watched = {"gating": encoding.gating, "centers": encoding.position.centers, "spreads": encoding.position.spreads,
               "query": model.get_layer("block_0").attention.query_dense.kernel}
    before = {name: _np(v).copy() for name, v in watched.items()}
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3)).astype("float32")
    model.train_on_batch(images, np.arange(8) % 10)
    for name, value in watched.items():
        assert not np.array_equal(_np(value), before[name]), name


def test_gates_centers_and_spreads_take_no_weight_decay():
    model = sa_conv.build_model("sa_gated_small", num_layers=1)
    names = {v.path for v in sa_conv.no_weight_decay(model)}
    assert names == {"block_0/attention/position_encoding/gating", "block_0/attention/position_encoding/position/centers",
                     "block_0/attention/position_encoding/position/spreads"}


def test_the_presets_keep_the_paper_shape_and_save_and_reload(tmp_path):
    paper, small = sa_conv.get_config("sa_gated"), sa_conv.get_config("sa_gated_small")
    assert (paper.num_layers, paper.num_heads, paper.hidden_size, paper.attention_init) == (6, 9, 400, "convolutional")
    assert (small.num_layers, small.hidden_size, small.encoding) == (3, 64, "gated")
    model = sa_conv.build_model("sa_gated_small", num_layers=1)
    model.save(tmp_path / "g.keras")
    loaded = keras.models.load_model(tmp_path / "g.keras")
    images = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(_np(loaded(images)), _np(model(images)))


def test_the_serving_copy_holds_the_gated_positional_half_as_a_constant(tmp_path):
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model("sa_gated_small", num_layers=2)
    attention = model.get_layer("block_0").attention
    attention.position_encoding.gating.assign(np.linspace(-1, 3, 9).astype("float32"))
    frozen = sa_conv.freeze_for_inference(model)
    served = frozen.get_layer("block_0").attention
    assert isinstance(served.position_encoding, sa_conv.encodings.FrozenGated)
    assert serving.summary(frozen)["attention_constants"] == ["dense", "dense"]
    images = np.random.default_rng(2).integers(0, 256, (3, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(_np(frozen(images)), _np(model(images, training=False)), atol=2e-5)
    gates = 1 / (1 + np.exp(-np.linspace(-1, 3, 9)))
    np.testing.assert_allclose(_np(served.position_encoding.constants["content_weights"]), 1 - gates, rtol=1e-5)
    np.testing.assert_allclose(_np(served.position_encoding.gates()), gates, rtol=1e-5)  # what the locality table shows
    positional = _np(served.position_encoding.constants["positional"])  # (query, head, key)
    # each head's rows sum to its gate
    np.testing.assert_allclose(positional.sum(-1), np.broadcast_to(gates, positional.shape[:2]), rtol=1e-5)
    frozen.save(tmp_path / "f.keras")
    np.testing.assert_array_equal(_np(keras.models.load_model(tmp_path / "f.keras")(images)), _np(frozen(images)))
    with pytest.raises(ValueError, match="serving copy"):
        served(np.zeros((1, 16, 16, 64), "float32"), training=True)


def test_the_locality_table_shows_each_head_s_gate():
    model = sa_conv.build_model("sa_gated_small", num_layers=2)
    gates = heads.head_gates(model)
    assert len(gates) == 2 and gates[0].shape == (9,)
    np.testing.assert_allclose(gates[0], 1 / (1 + np.exp(-1.0)), rtol=1e-6)
    probabilities = np.full((1, 9, 16, 16), 1 / 16)
    metrics = inspection.locality_metrics(probabilities, (4, 4), gates=gates[0])
    assert [m["gate"] for m in metrics] == pytest.approx(list(gates[0]))
    table = inspection.format_metrics([metrics, inspection.locality_metrics(probabilities, (4, 4))])
    assert table.splitlines()[0].split()[-1] == "gate" and table.splitlines()[1].split()[-1] == "0.731"
    assert table.splitlines()[-1].split()[-1] == "-"  # a layer without gates
    assert heads.head_gates(sa_conv.build_model("sa_quadratic_small", num_layers=1)) == [None]
    with pytest.raises(ValueError, match="3 gates for 9 heads"):
        inspection.locality_metrics(probabilities, (4, 4), gates=[0.1, 0.2, 0.3])


def test_pruning_a_gated_block_keeps_the_other_heads_and_their_query_size():
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model("sa_gated_small", num_layers=1)
    attention = model.get_layer("block_0").attention
    pruned = sa_conv.prune_heads(model, {0: [1, 4]})
    kept = [h for h in range(9) if h not in (1, 4)]
    served = pruned.get_layer("block_0").attention
    assert (served.num_heads, served.query_key_dim) == (7, attention.query_key_dim)
    x = np.random.default_rng(3).normal(size=(1, 16, 16, 64)).astype("float32")
    full = _np(attention.attention_probabilities(x))
    np.testing.assert_allclose(_np(served.attention_probabilities(x)), full[:, kept], atol=1e-6)
