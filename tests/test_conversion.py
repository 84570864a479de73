"""Theorem 1: Conv2D -> multi-head self-attention -> Conv2D."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from sa_conv import conversion
from sa_conv.attention import MultiHeadSelfAttention2D

RNG = np.random.default_rng(0)
# Measured here at the default alpha = 40: max |attention(x) - conv(x)| = 0.0 over the cases below
# (the off-target probabilities, ~exp(-40), vanish against 1 in float32); 1.2e-7 at alpha 20,
# 1.9e-6 at 16, 4.1e-3 at 8 for a 3x3 kernel on unit-normal inputs. The bound asserted is 1e-4.
TOLERANCE = 1e-4


def _conv(k, d_in, d_out, **kwargs):
    conv = keras.layers.Conv2D(d_out, k, bias_initializer="random_normal", **kwargs)
    conv.build((None, None, None, d_in))
    return conv


def _max_error(conv, layer, x):
    return float(np.abs(ops.convert_to_numpy(layer(x)) - ops.convert_to_numpy(conv(x))).max())


CASES = [
    # kernel, d_in, d_out, input (H, W), options
    (1, 3, 5, (6, 7), dict(padding="same")),
    (3, 4, 6, (8, 8), dict(padding="same")),
    (3, 4, 2, (7, 10), dict(padding="valid")),
    (5, 2, 3, (9, 6), dict(padding="same")),
    (5, 3, 4, (11, 12), dict(padding="valid")),
    (3, 3, 5, (10, 9), dict(padding="same", dilation_rate=2)),
    (3, 3, 5, (12, 11), dict(padding="valid", dilation_rate=2)),
    (3, 4, 3, (9, 8), dict(padding="same", strides=2)),
    (3, 4, 3, (9, 10), dict(padding="valid", strides=2)),
    (5, 2, 2, (13, 11), dict(padding="same", strides=3)),
]


@pytest.mark.parametrize("k,d_in,d_out,size,options", CASES)
def test_attention_equals_convolution(k, d_in, d_out, size, options):
    conv = _conv(k, d_in, d_out, **options)
    layer = conversion.conv_to_attention(conv)
    assert layer.attention.num_heads == k * k
    x = RNG.normal(size=(2, *size, d_in)).astype(np.float32)
    out = layer(x)
    assert tuple(out.shape) == tuple(conv(x).shape)
    assert tuple(layer.compute_output_shape(x.shape)) == tuple(conv(x).shape)
    assert _max_error(conv, layer, x) < TOLERANCE


def test_error_falls_monotonically_as_alpha_grows():
    conv = _conv(3, 4, 5, padding="same")
    x = RNG.normal(size=(2, 8, 9, 4)).astype(np.float32)
    errors = [_max_error(conv, conversion.conv_to_attention(conv, alpha=a), x) for a in (0.5, 1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 0.1 and errors[-1] < 1e-4


def test_without_padding_attention_converges_to_edge_padded_convolution():
    """Plain attention (no zero padding) equals the convolution of the edge-padded input."""
    conv = _conv(3, 2, 3, padding="valid")
    layer = conversion.conv_to_attention(conv)
    x = RNG.normal(size=(1, 6, 7, 2)).astype(np.float32)
    plain = ops.convert_to_numpy(layer.attention(x))  # attention over the unpadded grid
    edge = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], mode="edge")
    np.testing.assert_allclose(plain, ops.convert_to_numpy(conv(edge)), atol=TOLERANCE)
    zero = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    assert np.abs(plain - ops.convert_to_numpy(conv(zero))).max() > 1e-2  # differs at borders


def test_kernel_and_bias_without_a_layer():
    kernel = RNG.normal(size=(3, 3, 2, 4)).astype(np.float32)
    bias = RNG.normal(size=4).astype(np.float32)
    layer = conversion.conv_to_attention(kernel=kernel, bias=bias, padding="same")
    x = RNG.normal(size=(1, 5, 5, 2)).astype(np.float32)
    conv = _conv(3, 2, 4, padding="same")
    conv.set_weights([kernel, bias])
    assert _max_error(conv, layer, x) < TOLERANCE


def test_head_centers_and_value_slices():
    conv = _conv(3, 2, 3)
    layer = conversion.conv_to_attention(conv)
    centers = ops.convert_to_numpy(layer.attention.position_encoding.centers)
    np.testing.assert_array_equal(centers[0], [-1, -1])
    np.testing.assert_array_equal(centers[5], [0, 1])
    w = ops.convert_to_numpy(layer.attention.value_dense.kernel).reshape(9, 2, 3)
    np.testing.assert_array_equal(w[5], ops.convert_to_numpy(conv.kernel)[1, 2])  # (a, c) = (0, 1)


@pytest.mark.parametrize("options", [dict(padding="same"), dict(padding="valid", strides=2), dict(dilation_rate=2)])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_round_trip_recovers_the_kernel(k, options):
    conv = _conv(k, 3, 4, **options)
    back = conversion.attention_to_conv(conversion.conv_to_attention(conv))
    np.testing.assert_array_equal(ops.convert_to_numpy(back.kernel), ops.convert_to_numpy(conv.kernel))
    np.testing.assert_array_equal(ops.convert_to_numpy(back.bias), ops.convert_to_numpy(conv.bias))
    for key in ("strides", "padding", "dilation_rate", "kernel_size"):
        assert back.get_config()[key] == conv.get_config()[key], key


def test_round_trip_from_a_bare_attention_layer_with_shuffled_heads():
    conv = _conv(3, 2, 2)
    layer = conversion.conv_to_attention(conv)
    attention = layer.attention
    perm = RNG.permutation(9)
    enc = attention.position_encoding
    centers = ops.convert_to_numpy(enc.centers)[perm]
    w = ops.convert_to_numpy(attention.value_dense.kernel).reshape(9, 2, 2)[perm].reshape(18, 2)
    enc.centers.assign(centers)
    attention.value_dense.kernel.assign(w)
    back = conversion.attention_to_conv(attention)
    np.testing.assert_array_equal(ops.convert_to_numpy(back.kernel), ops.convert_to_numpy(conv.kernel))


def _bare(heads=9, centers=None, spread=None):
    layer = MultiHeadSelfAttention2D(heads, encoding="quadratic")
    layer.build((None, 8, 8, 2))
    if centers is not None:
        layer.position_encoding.centers.assign(np.asarray(centers, np.float32))
    layer.position_encoding.spreads.assign(np.full(heads, 9.0 if spread is None else spread, np.float32))
    return layer


def test_attention_to_conv_errors():
    grid = conversion.shifts(3)
    with pytest.raises(ValueError, match="Head 0 is not concentrated.*alpha = 0.5"):
        conversion.attention_to_conv(_bare(centers=grid, spread=1.0))
    off = grid.copy()
    off[4] = [0.3, 0.0]
    with pytest.raises(ValueError, match="Head 4's center .* not an integer shift"):
        conversion.attention_to_conv(_bare(centers=off, spread=30.0))
    dup = grid.copy()
    dup[8] = dup[0]
    with pytest.raises(ValueError, match="Heads 0 and 8 share the center"):
        conversion.attention_to_conv(_bare(centers=dup))
    with pytest.raises(ValueError, match="do not form a 3x3 grid"):
        conversion.attention_to_conv(_bare(centers=grid + np.array([0, 3], np.float32)))
    with pytest.raises(ValueError, match="odd KxK"):
        conversion.attention_to_conv(_bare(heads=4, centers=conversion.shifts(3)[:4]))
    learned = MultiHeadSelfAttention2D(9, encoding="learned")
    learned.build((None, 4, 4, 2))
    with pytest.raises(ValueError, match="encoding='quadratic'"):
        conversion.attention_to_conv(learned)


def test_conv_to_attention_errors():
    with pytest.raises(ValueError, match="kernel_size 2 is even"):
        conversion.conv_to_attention(_conv(2, 2, 2))
    grouped = keras.layers.Conv2D(4, 3, groups=2)
    grouped.build((None, None, None, 4))
    with pytest.raises(ValueError, match="groups=2"):
        conversion.conv_to_attention(grouped)
    with pytest.raises(ValueError, match="not built"):
        conversion.conv_to_attention(keras.layers.Conv2D(2, 3))
    with pytest.raises(ValueError, match="equal strides"):
        conversion.conv_to_attention(_conv(3, 2, 2, strides=(1, 2)))
    with pytest.raises(ValueError, match="Expected a keras.layers.Conv2D"):
        conversion.conv_to_attention(keras.layers.Dense(3))
    with pytest.raises(ValueError, match="kernel must have shape"):
        conversion.conv_to_attention(kernel=np.zeros((3, 2, 1, 1)))
    layer = conversion.conv_to_attention(_conv(3, 2, 2))
    assert layer.compute_output_shape((None, 9, 7, 2)) == (None, 7, 5, 2)  # "valid", as the convolution
    with pytest.raises(ValueError, match="needs a static height and width; got input shape \\(None, None, 9, 2\\)"):
        keras.Sequential([keras.Input((None, 9, 2)), layer])  # formerly a TypeError on None - 3


def test_conversions_keep_the_layers_dtype_policy():
    conv = keras.layers.Conv2D(4, 3, padding="same", dtype="mixed_bfloat16")
    conv.build((None, None, None, 2))
    layer = conversion.conv_to_attention(conv)
    assert layer.dtype_policy.name == layer.attention.dtype_policy.name == "mixed_bfloat16"  # formerly float32
    layer(np.zeros((1, 6, 6, 2), np.float32))
    assert conversion.attention_to_conv(layer).dtype_policy.name == "mixed_bfloat16"
    assert conversion.conv_to_attention(_conv(3, 2, 2)).dtype_policy.name == "float32"


def test_serialization_of_the_converted_layer(tmp_path):
    conv = _conv(3, 2, 3, padding="same", strides=2, activation="relu")
    layer = conversion.conv_to_attention(conv)
    inputs = keras.Input((8, 8, 2))
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    x = RNG.normal(size=(2, 8, 8, 2)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(x, verbose=0), restored.predict(x, verbose=0))
    np.testing.assert_allclose(restored.predict(x, verbose=0), ops.convert_to_numpy(conv(x)), atol=TOLERANCE)


def test_whole_cnn_becomes_all_attention_with_the_same_predictions(real_images):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3), name="image")
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 5, padding="valid", dilation_rate=1, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10)(x)
    cnn = keras.Model(inputs, outputs)
    # A few training steps so the predictions are not those of random weights.
    cnn.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = real_images.astype(np.float32)
    cnn.fit(images, np.arange(len(images)) % 10, epochs=3, verbose=0)
    attention = conversion.convert_model(cnn)
    assert not any(type(layer) is keras.layers.Conv2D for layer in attention.layers)
    assert sum(isinstance(layer, conversion.AttentionConv2D) for layer in attention.layers) == 3
    a, b = cnn.predict(images, verbose=0), attention.predict(images, verbose=0)
    np.testing.assert_allclose(a, b, atol=TOLERANCE)
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    with pytest.raises(ValueError, match=r"'\w+' \(AttentionConv2D\) gives no attention scores.*"
                       r"call its `\.attention` layer"):
        sa_conv.attention_probabilities(attention, images[:2])


def test_example_script_writes_the_figure(tmp_path):
    import importlib.util

    pytest.importorskip("matplotlib", reason="the example draws with the plots extra (not in the layers-only venv)")

    from tests.conftest import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("example", PROJECT_ROOT / "examples" / "conv_to_attention.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "fig.png"
    errors = example.main(str(out))
    values = list(errors.values())
    assert all(a > b for a, b in zip(values[:-2], values[1:-1])) and values[-1] < TOLERANCE
    import matplotlib.image

    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (600, 600)
    # One saturated red pixel per head: dark red cells are present in the figure.
    red = (image[..., 0] > 0.35) & (image[..., 0] < 0.5) & (image[..., 1] < 0.05)
    assert red.sum() > 9 * 50
