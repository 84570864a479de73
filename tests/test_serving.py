"""Serving copies (`sa_conv.serving`, `sa_conv.freeze_for_inference`): for every position-only
encoding the frozen copy serves from precomputed probabilities and gives the trained model's
inference outputs, reads none of the encoding's weights per call, only serves, and saves and
reloads; content attention with a position bias serves from one folded query-key map; the
training layers take no serving flags."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import sa_conv
from sa_conv import serving
from sa_conv.serving import fold_query_key
from sa_conv.resnet import build_resnet

POSITION_ONLY = [name for name, spec in sa_conv.ENCODINGS.items() if spec.position_only]
IMAGES = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3)).astype(np.float32)


def _model(encoding, **overrides):
    keras.utils.set_random_seed(1)
    config = sa_conv.get_config("sa_quadratic_small", encoding=encoding, num_layers=2, hidden_size=32, mlp_size=32,
                                **overrides)
    model = sa_conv.build_model(config)
    for block in sa_conv.attention_blocks(model):  # away from the initialization: varied attention
        for w in block.attention.position_encoding.trainable_weights:
            w.assign(w + np.random.default_rng(2).normal(scale=0.3, size=w.shape).astype(np.float32))
    return model


def test_every_position_only_encoding_is_covered():
    assert set(POSITION_ONLY) == {"quadratic", "quadratic_full", "learned", "sinusoidal", "mlp"}


@pytest.mark.parametrize("encoding", POSITION_ONLY)
@pytest.mark.parametrize("fast", ["auto", False])
def test_frozen_copy_gives_the_models_outputs_on_the_same_path(encoding, fast):
    model = _model(encoding, fast_position_attention=fast)
    frozen = sa_conv.freeze_for_inference(model)
    live = [b.attention for b in sa_conv.attention_blocks(model)]
    served = [b.attention for b in sa_conv.attention_blocks(frozen)]
    assert all(isinstance(a.position_encoding, sa_conv.encodings.FrozenProbabilities) for a in served)
    assert {a.encoding for a in served} == {f"frozen:{encoding}"}
    assert all(isinstance(a, sa_conv.MultiHeadSelfAttention2D) for a in live + served)
    separable = sa_conv.ENCODINGS[encoding].separable and fast == "auto"  # 16x16: separable pays
    assert {a.position_encoding.factored for a in served} == {separable}
    assert serving.summary(frozen)["attention_constants"] == ["separable" if separable else "dense"] * 2
    want = ops.convert_to_numpy(model(IMAGES, training=False))
    np.testing.assert_allclose(ops.convert_to_numpy(frozen(IMAGES, training=False)), want, rtol=1e-5, atol=1e-5)
    # The attention maps too (the export's attention_maps signature reads them).
    for got, ref in zip(sa_conv.attention_probabilities(frozen, IMAGES[:1]), sa_conv.attention_probabilities(model, IMAGES[:1])):
        np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(ref), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("encoding", ["quadratic", "quadratic_full", "mlp"])
def test_inference_reads_the_constants_not_the_encoding(encoding):
    """The traced inference function captures the constants; the copy has none of the encoding's
    weights, and changing them in the trained model afterwards changes nothing."""
    model = _model(encoding)
    frozen = sa_conv.freeze_for_inference(model)
    concrete = tf.function(lambda x: frozen(x, training=False)).get_concrete_function(
        tf.TensorSpec((None, 32, 32, 3), tf.float32))
    read = {id(v) for v in concrete.variables}  # TensorFlow's variables, behind Keras's
    paths = {id(v.value): v.path for v in frozen.weights}
    assert set(paths) >= read
    read = {paths[i] for i in read}
    encoding_weights = {v.path for b in sa_conv.attention_blocks(model) for v in b.attention.position_encoding.weights}
    assert encoding_weights and not {v.path for v in frozen.weights} & encoding_weights
    assert sum("/constant_" in p for p in read) >= 2
    before = ops.convert_to_numpy(frozen(IMAGES, training=False))
    for v in sa_conv.attention_blocks(model)[0].attention.position_encoding.weights:
        v.assign(ops.zeros_like(v))
    np.testing.assert_array_equal(ops.convert_to_numpy(frozen(IMAGES, training=False)), before)


@pytest.mark.parametrize("grid,path", [(4, "dense"), (8, "dense"), (12, "separable"), (16, "separable")])
def test_constants_take_the_path_measured_faster_for_the_grid(grid, path):
    """benchmarks/results/serving_aggregation.json: with constant probabilities the dense path
    was faster up to 8x8 and the separable one from 12x12, at batch 1 and 100 alike."""
    live = sa_conv.MultiHeadSelfAttention2D(2, encoding="quadratic", max_grid_size=grid)
    x = np.random.default_rng(0).normal(size=(2, grid, grid, 4)).astype(np.float32)
    live.build(x.shape)
    layer = serving.serving_attention(live, x.shape)
    assert layer.position_encoding.factored == layer.uses_fast_path(grid=(grid, grid)) == (path == "separable")
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), ops.convert_to_numpy(live(x)), rtol=1e-5, atol=1e-6)


def test_a_frozen_model_refuses_to_train_and_saves(tmp_path):
    frozen = sa_conv.freeze_for_inference(_model("learned"))
    with pytest.raises(ValueError, match="is a serving copy .* Train the model it was made from"):
        frozen(IMAGES, training=True)
    path = tmp_path / "frozen.keras"
    frozen.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(IMAGES, training=False)),
                               ops.convert_to_numpy(frozen(IMAGES, training=False)), rtol=1e-6, atol=1e-6)


def _away_from_initialization(model, seed=4):
    """Biases, tables and LayerNorms moved off their initial zeros and ones, as after training: a
    fold that dropped a bias (the query's, the value map's) or misordered heads cannot pass."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if any(part in w.path for part in ("bias", "embeddings", "head_keys", "gamma", "beta")):
            w.assign(w + rng.normal(scale=0.3, size=w.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("encoding", ["content_plus_learned_bias", "content_with_relative_keys", "learned"])
def test_folded_maps_give_the_models_outputs_and_probabilities(encoding, tmp_path):
    """The frozen copy has no attention_output map (folded into the value map) and, for content
    logits plus a position bias, one (folded) query map and the position term as a constant in
    place of the query and key maps; outputs and attention maps are the model's to float32 rounding,
    also after a .keras round trip."""
    model = _away_from_initialization(_model(encoding))
    frozen = sa_conv.freeze_for_inference(model)
    paths = {w.path.split("/", 1)[1] for w in frozen.weights if w.path.startswith("block_0/")}
    assert not any(p.startswith("attention_output/") for p in paths)
    folds_query_key = encoding == "content_plus_learned_bias"
    assert ("attention/key/kernel" in paths) == (encoding == "content_with_relative_keys")  # folded away
    assert ("attention/query/kernel" in paths) == (encoding != "learned")
    assert ("attention/position_encoding/constant_position_logits" in paths) == folds_query_key
    want = ops.convert_to_numpy(model(IMAGES, training=False))
    path = str(tmp_path / "frozen.keras")
    frozen.save(path)
    for served in (frozen, keras.models.load_model(path)):
        np.testing.assert_allclose(ops.convert_to_numpy(served(IMAGES, training=False)), want, rtol=1e-5, atol=1e-5)
        for got, ref in zip(sa_conv.attention_probabilities(served, IMAGES[:2]),
                            sa_conv.attention_probabilities(model, IMAGES[:2])):
            np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(ref), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="it serves, it does not train"):
        frozen(IMAGES, training=True)
    with pytest.raises(ValueError, match="already frozen for inference"):
        sa_conv.freeze_for_inference(frozen)


def test_query_key_fold_drops_only_what_the_softmax_removes():
    """``fold_query_key``: for every query, the folded logits minus q.k are the same for every
    key (the terms of the key bias and the query-only term), so the softmax is unchanged."""
    rng = np.random.default_rng(5)
    heads, dim, n = 3, 6, 7
    wq, wk = rng.normal(size=(dim, heads * dim)), rng.normal(size=(dim, heads * dim))
    bq, bk = rng.normal(size=heads * dim), rng.normal(size=heads * dim)
    x = rng.normal(size=(n, dim))
    kernel, bias = fold_query_key(wq, bq, wk, heads)
    q, k = (x @ wq + bq).reshape(n, heads, dim), (x @ wk + bk).reshape(n, heads, dim)
    exact = np.einsum("qhd,khd->hqk", q, k)
    folded = np.einsum("qhd,kd->hqk", (x @ kernel + bias).reshape(n, heads, dim), x)
    difference = exact - folded
    np.testing.assert_allclose(difference, difference[:, :, :1].repeat(n, axis=2), atol=1e-9)
    assert np.ptp(difference) > 1e-3  # the dropped terms are not zero: the test can fail


@pytest.mark.parametrize("encoding,served", [("content_plus_learned_bias", "FrozenPositionBias"),
                                              ("content_with_relative_keys", "ContentWithRelativeKeysEncoding"),
                                              ("learned", "FrozenProbabilities"), ("gated", "FrozenGated")])
def test_each_encoding_is_served_by_its_serving_form(encoding, served):
    """The serving layer is the attention layer with the frozen encoding the trained one names
    (its ``serving_form``): only content encodings with a position bias fold their query and key
    maps (no key map is left); content logits without a serving form are served by a copy of the
    trained layer; the training layers take no serving flags."""
    live = sa_conv.MultiHeadSelfAttention2D(2, encoding=encoding, max_grid_size=4)
    live.build((None, 4, 4, 8))
    layer = serving.serving_attention(live, (None, 4, 4, 8))
    assert type(layer) is sa_conv.MultiHeadSelfAttention2D and layer is not live
    assert type(layer.position_encoding).__name__ == served
    assert hasattr(layer, "key_dense") == (encoding in ("content_with_relative_keys", "gated"))
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), ops.convert_to_numpy(live(x)), rtol=1e-5, atol=1e-6)
    for flag in ("inference_constants", "query_key"):
        with pytest.raises(ValueError, match=f"Unrecognized keyword arguments .*{flag}"):
            sa_conv.MultiHeadSelfAttention2D(2, encoding=encoding, **{flag: True})
    with pytest.raises(ValueError, match="Unrecognized keyword arguments .*fold_attention_output"):
        sa_conv.TransformerBlock(8, fold_attention_output=True)


@pytest.mark.parametrize("encoding,pooling_width,shapes", [
    ("quadratic", 2, [(4, 16, 16), (4, 16, 16)]),  # 16x16 grid: separable row and column factors
    ("quadratic", 4, [(4, 64, 64)]),  # 8x8 grid: dense
    ("gated", 2, [(256, 4, 256)]),  # the gated positional half, (query, head, key)
    ("content_plus_learned_bias", 2, [])])  # a term of the logits, not probabilities
def test_a_serving_copy_names_its_probability_constants(encoding, pooling_width, shapes):
    """The variables the int8 ONNX route keeps float32 are those each serving attention layer
    names, per block: found by what holds them, not by a name."""
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model("sa_quadratic_small", encoding=encoding, num_layers=1, num_heads=4,
                                pooling_width=pooling_width)
    constants = serving.probability_constants(sa_conv.freeze_for_inference(model))
    assert [tuple(v.shape) for v in constants] == shapes
    assert serving.probability_constants(model) == []  # a trained model has none


def _with_batch_statistics(model, seed=3):
    """Moving statistics and affine parameters away from their initial 0/1, as after training."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            shape = layer.moving_mean.shape
            layer.moving_mean.assign(rng.normal(scale=0.5, size=shape).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.2, 3.0, size=shape).astype(np.float32))
            layer.gamma.assign(rng.uniform(0.5, 2.0, size=shape).astype(np.float32))
            layer.beta.assign(rng.normal(scale=0.5, size=shape).astype(np.float32))
    return model


def test_resnet_batch_norms_fold_into_their_convolutions(tmp_path):
    """Every conv -> batch-norm pair of the ResNet becomes one convolution with bias, with
    ``kernel * gamma / sqrt(var + eps)`` and ``beta - mean * gamma / sqrt(var + eps)``; the copy
    gives the model's inference outputs and round-trips through .keras."""
    keras.utils.set_random_seed(4)
    model = _with_batch_statistics(build_resnet(widths=(8, 16, 16, 32)))
    frozen = sa_conv.freeze_for_inference(model)
    batch_norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(batch_norms) == 20
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in frozen.layers)
    assert len(frozen.layers) == len(model.layers) - 20
    bn, conv = model.get_layer("stage2_block1_shortcut_bn"), model.get_layer("stage2_block1_shortcut_conv")
    scale = bn.gamma.numpy() / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
    folded = frozen.get_layer("stage2_block1_shortcut_conv")
    np.testing.assert_allclose(folded.kernel.numpy(), conv.kernel.numpy() * scale, rtol=1e-6)
    np.testing.assert_allclose(folded.bias.numpy(), bn.beta.numpy() - bn.moving_mean.numpy() * scale, rtol=1e-5, atol=1e-6)
    expected = ops.convert_to_numpy(model(IMAGES, training=False))
    np.testing.assert_allclose(ops.convert_to_numpy(frozen(IMAGES, training=False)), expected, rtol=1e-4, atol=1e-5)
    frozen.save(tmp_path / "frozen.keras")
    loaded = keras.models.load_model(tmp_path / "frozen.keras")
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(IMAGES, training=False)), expected, rtol=1e-4, atol=1e-5)


def test_mixed_precision_copy_holds_convolution_weights_in_the_compute_dtype(tmp_path):
    """Under mixed_bfloat16 the frozen ResNet's convolutions hold bfloat16 weights: the float32
    copy's folded weights rounded once, which is what the mixed policy would compute with on
    every call. The logits layer (kept float32 by `with_dtype_policy`) stays float32."""
    keras.utils.set_random_seed(4)
    model = _with_batch_statistics(build_resnet(widths=(8, 16, 16, 32)))
    float32 = sa_conv.freeze_for_inference(model)
    mixed = sa_conv.freeze_for_inference(sa_conv.with_dtype_policy(model, "mixed_bfloat16"))
    convs = [layer for layer in mixed.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(convs) == 20 and all(c.kernel.dtype == "bfloat16" and c.bias.dtype == "bfloat16" for c in convs)
    for conv in convs:
        twin = float32.get_layer(conv.name)
        np.testing.assert_array_equal(ops.convert_to_numpy(ops.cast(conv.kernel, "float32")),
                                      ops.convert_to_numpy(ops.cast(ops.cast(twin.kernel, "bfloat16"), "float32")))
    logits = mixed.get_layer(model.output_names[0])
    assert logits.kernel.dtype == "float32" and logits.compute_dtype == "float32"
    got, want = (ops.convert_to_numpy(m(IMAGES, training=False)) for m in (mixed, float32))
    assert (got.argmax(-1) == want.argmax(-1)).all()
    np.testing.assert_allclose(got, want, rtol=0.1, atol=0.1 * np.abs(want).max())
    mixed.save(tmp_path / "mixed.keras")
    np.testing.assert_array_equal(ops.convert_to_numpy(keras.models.load_model(tmp_path / "mixed.keras")(IMAGES)), got)


def test_only_a_convolution_feeding_its_batch_norm_alone_is_folded():
    """A convolution whose output also goes elsewhere, one with an activation, and a batch norm
    after another layer are left as they are; the copy still computes the same function."""
    inputs = keras.Input((6, 6, 3))
    shared = keras.layers.Conv2D(4, 3, padding="same", use_bias=False, name="shared")(inputs)
    a = keras.layers.BatchNormalization(name="bn_after_shared")(shared)
    b = keras.layers.Conv2D(4, 1, name="other")(shared)
    relu = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="relu_conv")(inputs)
    c = keras.layers.BatchNormalization(name="bn_after_relu")(relu)
    d = keras.layers.BatchNormalization(name="bn_after_add")(keras.layers.Add()([a, b]))
    alone = keras.layers.Conv2D(4, 3, padding="same", name="alone")(inputs)
    e = keras.layers.BatchNormalization(name="bn_after_alone")(alone)
    model = _with_batch_statistics(keras.Model(inputs, keras.layers.Concatenate()([c, d, e])))
    frozen = sa_conv.freeze_for_inference(model)
    kept = {layer.name for layer in frozen.layers if isinstance(layer, keras.layers.BatchNormalization)}
    assert kept == {"bn_after_shared", "bn_after_relu", "bn_after_add"}
    x = np.random.default_rng(5).normal(size=(2, 6, 6, 3)).astype(np.float32)
    np.testing.assert_allclose(ops.convert_to_numpy(frozen(x, training=False)),
                               ops.convert_to_numpy(model(x, training=False)), rtol=1e-5, atol=1e-5)


def test_a_position_bias_with_another_query_size_is_served_at_its_scale():
    """The folded logits are divided by sqrt(D) where the trained ones are divided by sqrt(d): the
    fold scales its map by sqrt(D / d). A position-bias encoding with d = D / 2 (registered as a user
    would) is served with the trained outputs; without the scale its logits would be sqrt(2) too
    large."""

    @sa_conv.register_encoding("test_half_query_bias")
    class HalfQueryBias(sa_conv.encodings.ContentPlusLearnedBiasEncoding):
        @classmethod
        def from_attention(cls, attention, input_dim):
            return sa_conv.encodings.ContentEncoding.from_attention.__func__(
                cls, attention, input_dim // 2, num_heads=attention.num_heads,
                embedding_dim=attention.position_embedding_dim or input_dim)

    try:
        live = sa_conv.MultiHeadSelfAttention2D(2, encoding="test_half_query_bias", max_grid_size=4)
        x = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype(np.float32)
        live.build(x.shape)
        assert live.query_key_dim == 4
        layer = serving.serving_attention(live, x.shape)
        assert layer.encoding == "frozen:test_half_query_bias" and not layer.position_encoding.maps_keys
        for a, b in zip(_np_list(layer(x, return_attention_scores=True)), _np_list(live(x, return_attention_scores=True))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    finally:
        sa_conv.encodings.unregister_encoding("test_half_query_bias")


def _np_list(values):
    return [ops.convert_to_numpy(v) for v in values]


def test_a_serving_copy_needs_a_static_grid():
    live = sa_conv.MultiHeadSelfAttention2D(2, encoding="quadratic")
    live.build((None, 4, 4, 8))
    with pytest.raises(ValueError, match="fixed spatial shape"):
        serving.serving_attention(live, (None, None, None, 8))
