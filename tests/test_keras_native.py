"""The layers behave like Keras's own: independent initialization of every weight, seeds that
reproduce, per-layer dtype policies, and Keras's own layer test harness on every public layer."""

import itertools

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from keras import ops
from keras.src import testing

import sa_conv
from tests import tiers

ATTENTION = sa_conv.MultiHeadSelfAttention2D


def identical_weight_pairs(model):
    """Pairs of distinct weight tensors of one shape with equal values, apart from constant
    tensors (zeros, ones: biases, norms' scales and offsets, running statistics)."""
    weights = [(w.path, ops.convert_to_numpy(w)) for w in model.weights]
    weights = [(p, v) for p, v in weights if v.size > 1 and not np.all(v == v.flat[0])]
    return [(a, b) for (a, x), (b, y) in itertools.combinations(weights, 2)
            if x.shape == y.shape and np.array_equal(x, y)]


@pytest.mark.parametrize("preset", tiers.presets(sa_conv.preset_names()))
def test_every_weight_tensor_is_drawn_independently(preset):
    keras.utils.set_random_seed(0)
    # The convolutional initialization puts every block's heads on the same grid on purpose:
    # what is drawn at random is checked with the random one.
    random = {"attention_init": "random"} if sa_conv.get_config(preset).is_attention else {}
    model = sa_conv.build_model(preset, **random)
    assert identical_weight_pairs(model) == []
    assert len(model.weights) > 10


def test_identical_pair_finder_finds_shared_initializers():
    init = keras.initializers.RandomNormal()  # one unseeded object: the same values every call
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(4, kernel_initializer=init)(keras.layers.Dense(4, kernel_initializer=init)(inputs))
    assert len(identical_weight_pairs(keras.Model(inputs, outputs))) == 1


@pytest.mark.parametrize("preset", ["sa_quadratic_small", "sa_content_plus_learned_bias_small", "resnet18"])
def test_seeds_reproduce_and_differ(preset):
    def weights(seed):
        keras.utils.set_random_seed(seed)
        return [ops.convert_to_numpy(w) for w in sa_conv.build_model(preset).weights]

    first, again, other = weights(3), weights(3), weights(4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    differing = [not np.array_equal(a, b) for a, b in zip(first, other) if not np.all(a == a.flat[0])]
    assert differing and all(differing)


def test_layer_seed_reproduces_without_the_global_seed():
    def build(seed):
        layer = ATTENTION(4, encoding="learned", seed=seed, max_grid_size=4)
        layer.build((None, 4, 4, 8))
        return [ops.convert_to_numpy(w) for w in layer.position_encoding.weights]

    a, b, c = build(5), build(5), build(6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not any(np.array_equal(x, y) for x, y in zip(a, c))
    assert not np.array_equal(a[0], a[1])  # row and column tables differ


# ------------------------------------------------------------------ dtype policies


def test_transformer_block_with_its_own_mixed_float16_policy():
    block = sa_conv.TransformerBlock(8, attention_config=dict(num_heads=4), dtype="mixed_float16")
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype(np.float16)
    y = block(x)
    assert keras.backend.standardize_dtype(y.dtype) == "float16"
    assert {keras.backend.standardize_dtype(w.dtype) for w in block.weights} == {"float32"}
    assert block.attention.dtype_policy.name == "mixed_float16"
    assert block.intermediate.dtype_policy.name == "mixed_float16"


@pytest.mark.parametrize("encoding", list(sa_conv.ENCODINGS))
@pytest.mark.parametrize("fast", [True, False])
def test_attention_returns_the_compute_dtype_and_float32_probabilities(encoding, fast):
    """float16 outputs and float32 scores; content attention's probabilities are a float16
    softmax (2^-11 a rounding, up to about 2^-8 where the softmax rounds exp's argument too):
    rows within 2^-7 of 1."""
    layer = ATTENTION(4, encoding=encoding, dtype="mixed_float16", fast_position_attention=fast, max_grid_size=8)
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 8)).astype(np.float16)
    out, probs = layer(x, return_attention_scores=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert keras.backend.standardize_dtype(probs.dtype) == "float32"
    np.testing.assert_allclose(ops.convert_to_numpy(ops.sum(probs, -1)), 1.0,
                               atol=1e-5 if layer.position_only else 2 ** -7)
    reference = ATTENTION(4, encoding=encoding, fast_position_attention=fast, max_grid_size=8)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(out).astype(np.float32),
                               ops.convert_to_numpy(reference(x.astype(np.float32))), atol=5e-2, rtol=5e-2)


# ------------------------------------------------------------------ Keras's own harness

_GRID = (2, 4, 4, 8)
_HARNESS_CASES = [
    *[(f"attention_{e}_{f}", ATTENTION, dict(num_heads=4, encoding=e, max_grid_size=4, fast_position_attention=f),
       _GRID, (2, 4, 4, 8)) for e in sa_conv.ENCODINGS for f in (True, False, "auto")],
    ("attention_output_dim", ATTENTION, dict(num_heads=4, output_dim=6), _GRID, (2, 4, 4, 6)),
    ("attention_dropout", ATTENTION, dict(num_heads=4, attention_dropout=0.5, fast_position_attention=True),
     _GRID, (2, 4, 4, 8)),
    ("transformer_block", sa_conv.TransformerBlock, dict(mlp_size=16, attention_config=dict(num_heads=4)),
     _GRID, (2, 4, 4, 8)),
    ("transformer_block_content", sa_conv.TransformerBlock,
     dict(mlp_size=16, attention_config=dict(num_heads=4, encoding="content_with_relative_keys", max_grid_size=4)),
     _GRID, (2, 4, 4, 8)),
    ("invertible_pooling", sa_conv.InvertiblePooling, dict(width=2), _GRID, (2, 2, 2, 32)),
    ("invertible_unpooling", sa_conv.InvertibleUnpooling, dict(width=2), _GRID, (2, 8, 8, 2)),
    ("pixel_normalization", sa_conv.PixelNormalization, dict(mean=(0.5,) * 8, std=(0.25,) * 8), _GRID, _GRID),
    ("attention_conv2d_same", sa_conv.AttentionConv2D, dict(filters=5, kernel_size=3, padding="same"),
     (2, 6, 6, 3), (2, 6, 6, 5)),
    ("attention_conv2d_valid_strided", sa_conv.AttentionConv2D,
     dict(filters=5, kernel_size=3, padding="valid", strides=2), (2, 7, 7, 3), (2, 3, 3, 5)),
]


class KerasLayerHarnessTest(testing.TestCase):
    @parameterized.named_parameters(*_HARNESS_CASES)
    def test_run_layer_test(self, layer_cls, init_kwargs, input_shape, output_shape):
        self.run_layer_test(layer_cls, init_kwargs=init_kwargs, input_shape=input_shape,
                            expected_output_shape=output_shape, run_mixed_precision_check=True)


def test_the_harness_covers_every_public_layer():
    covered = {case[1] for case in _HARNESS_CASES}
    public = {sa_conv.MultiHeadSelfAttention2D, sa_conv.TransformerBlock, sa_conv.InvertiblePooling,
              sa_conv.InvertibleUnpooling, sa_conv.PixelNormalization, sa_conv.AttentionConv2D}
    assert public <= covered and len(_HARNESS_CASES) >= 16
