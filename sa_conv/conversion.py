"""Theorem 1 as code: a KxK convolution as multi-head self-attention, and back.

The paper's Lemma 1 and Lemma 2 are constructive: an MHSA layer with ``K*K`` heads and the
quadratic relative encoding reproduces any ``KxK`` convolution. Head ``h`` is given one shift
``(a, c)`` in ``{-r..r}^2`` (``r = floor(K/2)``), the center ``Delta_h = (a, c)`` and a large
``alpha``: its softmax over keys then puts (almost) all its mass on the pixel ``q + Delta_h``.
The head's slice ``W^(h)`` of the merged value map is the kernel slice ``W[a + r, c + r]``
(``D_in x D_out``), and the output bias is the convolution's bias::

    MHSA(X)_q = sum_h X_{q + Delta_h} W^(h) + b = Conv(X)_q.

**How the error falls with alpha.** A head at distance 1 from its target gives
``exp(-alpha)`` of its mass (relative) to each neighbour, so the error is about
``4 exp(-alpha) max|X W|``. Measured for a random 3x3 convolution on unit-normal inputs: 4.1e-3
at alpha = 8, 1.9e-6 at 16, 1.2e-7 at 20, and exactly 0 in float32 at the default ``alpha = 40``
(the softmax subtracts its largest logit, so a large alpha never overflows).

**Padding.** Attention has no padding: near the border a head whose target falls outside the
grid moves its mass to the nearest pixels inside, so plain attention converges to an
*edge-padded* convolution. `AttentionConv2D` reproduces ``padding="same"`` (zero padding) exactly
by attending over the input padded with ``dilation * floor(K/2)`` zeros and cropping back;
``padding="valid"`` needs no padding and crops. Dilation ``d`` puts the centers on the dilated
grid ``(d a, d c)``; a stride ``s > 1`` is attention followed by subsampling.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from sa_conv.attention_init import grid_shifts
from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.encodings import QuadraticEncoding

DEFAULT_ALPHA = 40.0


def _pair(value, name):
    if isinstance(value, int):
        return value, value
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value}.")
    return value


def shifts(kernel_size: int, dilation: int = 1) -> np.ndarray:
    """The ``K*K`` head centers ``(d a, d c)`` of an odd ``K``, heads ordered row-major over
    ``(a, c)``: `sa_conv.attention_init.grid_shifts`, which the convolutional initialization uses."""
    return grid_shifts(kernel_size * kernel_size, dilation)


@keras.saving.register_keras_serializable(package="sa_conv")
class AttentionConv2D(keras.layers.Layer):
    """A convolution computed by a quadratic `MultiHeadSelfAttention2D` with ``K*K`` heads.

    Built by `conv_to_attention`. Input ``(batch, H, W, D_in)`` with static H and W; output the shape the
    convolution gives: ``(batch, H', W', D_out)``. The attention layer is ``self.attention``.

    Args:
      filters: output channels ``D_out``.
      kernel_size: odd ``K``.
      strides, padding (``"same"`` or ``"valid"``), dilation_rate: as `keras.layers.Conv2D`.
      activation: applied after the attention, as the convolution's.
      alpha: spread of every head (larger is closer to the convolution).
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", dilation_rate=1,
                 activation=None, alpha=DEFAULT_ALPHA, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.kernel_size = int(kernel_size)
        self.strides = int(strides)
        self.padding = padding
        self.dilation_rate = int(dilation_rate)
        self.activation = keras.activations.get(activation)
        self.alpha = float(alpha)
        if self.kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size {self.kernel_size} is even: Theorem 1's construction centers one head "
                "on each shift of an odd KxK kernel."
            )
        if padding not in ("same", "valid"):
            raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}.")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha}.")
        self.attention = MultiHeadSelfAttention2D(
            self.kernel_size**2, output_dim=self.filters, encoding="quadratic", name="attention",
            dtype=self.dtype_policy,
        )

    @property
    def _pad(self):
        return self.dilation_rate * (self.kernel_size // 2) if self.padding == "same" else 0

    def build(self, input_shape):
        self.attention.build(tuple(input_shape[:1]) + (None, None, input_shape[-1]))
        encoding = self.attention.position_encoding
        encoding.set_centers(shifts(self.kernel_size, self.dilation_rate))
        encoding.set_alphas(self.alpha)

    def _output_window(self, size):
        """(start index in the attention output, output size) along one axis."""
        k_eff = self.dilation_rate * (self.kernel_size - 1) + 1
        r = self.dilation_rate * (self.kernel_size // 2)
        s = self.strides
        if self.padding == "valid":
            return r, (size - k_eff) // s + 1
        out = -(-size // s)
        pad_before = max((out - 1) * s + k_eff - size, 0) // 2
        return self._pad + r - pad_before, out

    def call(self, inputs):
        _, h, w, _ = inputs.shape
        p = self._pad
        x = ops.pad(inputs, [[0, 0], [p, p], [p, p], [0, 0]]) if p else inputs
        y = self.attention(x)
        (top, out_h), (left, out_w) = self._output_window(h), self._output_window(w)
        s = self.strides
        y = y[:, top: top + s * (out_h - 1) + 1: s, left: left + s * (out_w - 1) + 1: s, :]
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        if h is None or w is None:  # as its attention layer needs (`MultiHeadSelfAttention2D`)
            raise ValueError(f"AttentionConv2D needs a static height and width; got input shape {tuple(input_shape)}. "
                             "Give the model input a fixed spatial shape.")
        return (b, self._output_window(h)[1], self._output_window(w)[1], self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
            "padding": self.padding, "dilation_rate": self.dilation_rate,
            "activation": keras.activations.serialize(self.activation), "alpha": self.alpha,
        }


def conv_to_attention(conv=None, *, kernel=None, bias=None, strides=1, padding="same",
                      dilation_rate=1, activation=None, alpha=DEFAULT_ALPHA, name=None) -> AttentionConv2D:
    """Returns a built `AttentionConv2D` that computes the same function as a convolution.

    Args:
      conv: a built `keras.layers.Conv2D` (its kernel, bias, strides, padding, dilation,
        activation and dtype policy are used), or None to give ``kernel`` and the options explicitly.
      kernel: ``(K, K, D_in, D_out)`` with ``K`` odd; bias: ``(D_out,)`` or None.
      alpha: every head's spread (default 40, exact to float32 rounding).

    Raises:
      ValueError: for even ``K``, ``groups != 1``, ``channels_first``, unequal strides or
        dilations along the two axes, or a padding other than same/valid.
    """
    if conv is not None:
        if not isinstance(conv, keras.layers.Conv2D) or isinstance(conv, keras.layers.Conv2DTranspose):
            raise ValueError(f"Expected a keras.layers.Conv2D, got {type(conv).__name__}.")
        if not conv.built:
            raise ValueError(f"Conv2D {conv.name!r} is not built: call it on an input first.")
        config = conv.get_config()
        if config.get("groups", 1) != 1:
            raise ValueError(f"Conv2D {conv.name!r} has groups={config['groups']}; only groups=1 is supported.")
        if config.get("data_format") == "channels_first":
            raise ValueError(f"Conv2D {conv.name!r} is channels_first; only channels_last is supported.")
        kernel = ops.convert_to_numpy(conv.kernel)
        bias = ops.convert_to_numpy(conv.bias) if conv.use_bias else None
        strides, padding = config["strides"], config["padding"]
        dilation_rate, activation = config["dilation_rate"], config["activation"]
        name = name or f"{conv.name}_as_attention"
    dtype = conv.dtype_policy if conv is not None else None
    kernel = np.asarray(kernel, np.float32)
    if kernel.ndim != 4 or kernel.shape[0] != kernel.shape[1]:
        raise ValueError(f"kernel must have shape (K, K, D_in, D_out), got {kernel.shape}.")
    sy, sx = _pair(strides, "strides")
    dy, dx = _pair(dilation_rate, "dilation_rate")
    if sy != sx or dy != dx:
        raise ValueError(f"Only equal strides and dilations along both axes are supported, got "
                         f"strides={strides}, dilation_rate={dilation_rate}.")
    if sy > 1 and dy > 1:
        raise ValueError("Keras Conv2D does not combine strides > 1 with dilation > 1.")
    k, _, d_in, d_out = kernel.shape
    layer = AttentionConv2D(d_out, k, strides=sy, padding=padding, dilation_rate=dy,
                            activation=activation, alpha=alpha, name=name, dtype=dtype)
    layer.build((None, None, None, d_in))
    # W^(h) = W[a + r, c + r], heads ordered as `shifts`: (a, c) row-major.
    layer.attention.set_value_map(kernel.reshape(k * k, d_in, d_out), bias)
    return layer


def _grid_for(centers):
    reach = int(np.ceil(np.abs(centers).max())) if centers.size else 0
    return 2 * reach + 3


def attention_to_conv(layer, threshold: float = 0.99, tolerance: float = 1e-3) -> keras.layers.Conv2D:
    """Returns the `keras.layers.Conv2D` equivalent to a concentrated quadratic attention layer.

    Args:
      layer: an `AttentionConv2D` (its padding, strides and activation are kept), or a built
        `MultiHeadSelfAttention2D` with ``encoding="quadratic"`` (giving ``padding="same"``,
        stride 1: the convolution it equals away from the borders).
      threshold: every head's largest attention probability (for a query far from borders)
        must exceed it.
      tolerance: how far from an integer a center may be.

    Raises:
      ValueError: naming the head, when a head is not concentrated (spread too small), a center
        is not an integer shift, two heads share a center, or the centers do not form a full
        ``KxK`` (dilated) grid.
    """
    wrapper = layer if isinstance(layer, AttentionConv2D) else None
    attention = wrapper.attention if wrapper else layer
    if not isinstance(attention, MultiHeadSelfAttention2D):
        raise ValueError("attention_to_conv needs an AttentionConv2D or a MultiHeadSelfAttention2D "
                         "with encoding='quadratic'.")
    if not attention.built:
        raise ValueError("The attention layer is not built.")
    encoding = attention.position_encoding
    if not (isinstance(encoding, QuadraticEncoding) and encoding.covariance == "isotropic"):
        raise ValueError("attention_to_conv needs an AttentionConv2D or a MultiHeadSelfAttention2D "
                         "with encoding='quadratic'.")
    centers = ops.convert_to_numpy(encoding.centers)
    heads = attention.num_heads
    # Concentration: probabilities of the grid's center query.
    g = _grid_for(centers)
    probs = ops.convert_to_numpy(ops.softmax(encoding.logits(g, g), axis=-1))[:, (g // 2) * g + g // 2]
    for h in range(heads):
        if probs[h].max() <= threshold:
            alpha = float(ops.convert_to_numpy(encoding.alphas())[h])
            raise ValueError(
                f"Head {h} is not concentrated: its largest attention probability is "
                f"{probs[h].max():.4f} <= {threshold} (alpha = {alpha:.3g} is too small)."
            )
    rounded = np.round(centers)
    off = np.abs(centers - rounded).max(axis=1)
    for h in np.where(off > tolerance)[0]:
        raise ValueError(f"Head {h}'s center {centers[h].tolist()} is not an integer shift.")
    k = int(round(math.sqrt(heads)))
    if k * k != heads or k % 2 == 0:
        raise ValueError(f"{heads} heads do not form an odd KxK kernel.")
    seen = {}
    for h, c in enumerate(map(tuple, rounded.astype(int))):
        if c in seen:
            raise ValueError(f"Heads {seen[c]} and {h} share the center {list(c)}.")
        seen[c] = h
    nonzero = np.abs(rounded[rounded != 0]).astype(int)
    dilation = int(np.gcd.reduce(nonzero)) if nonzero.size else 1
    if wrapper is not None:
        dilation = wrapper.dilation_rate  # known (for K = 1 the centers cannot tell)
    expected = {tuple(map(int, c)) for c in shifts(k, dilation)}
    if set(seen) != expected:
        raise ValueError(
            f"The head centers {sorted(seen)} do not form a {k}x{k} grid of shifts with dilation {dilation}."
        )
    d_in = attention.input_dim
    w = ops.convert_to_numpy(attention.value_kernel_per_head())
    r = k // 2
    kernel = np.zeros((k, k, d_in, w.shape[-1]), np.float32)
    for (a, c), h in seen.items():
        kernel[a // dilation + r, c // dilation + r] = w[h]
    bias = ops.convert_to_numpy(attention.value_dense.bias)
    conv = keras.layers.Conv2D(
        w.shape[-1], k,
        strides=wrapper.strides if wrapper else 1,
        padding=wrapper.padding if wrapper else "same",
        dilation_rate=dilation,
        activation=wrapper.activation if wrapper else None,
        name=(wrapper or attention).name + "_as_conv",
        dtype=(wrapper or attention).dtype_policy,
    )
    conv.build((None, None, None, d_in))
    conv.kernel.assign(kernel)
    conv.bias.assign(bias)
    return conv


def convert_model(model: keras.Model, alpha: float = DEFAULT_ALPHA) -> keras.Model:
    """A copy of ``model`` with every `keras.layers.Conv2D` replaced by its `AttentionConv2D`.

    Other layers are cloned with their weights. The result computes the same function (to
    float32 rounding at the default alpha). Its attention needs a fixed height and width: a
    ``model`` whose input has unknown ones raises ValueError.
    """
    converted = {}

    def clone(layer):
        if type(layer) is keras.layers.Conv2D:
            new = conv_to_attention(layer, alpha=alpha)
            converted[layer.name] = new
            return new
        return layer.__class__.from_config(layer.get_config())

    copy = keras.models.clone_model(model, clone_function=clone)
    for old, new in zip(model.layers, copy.layers):
        if old.name not in converted and old.weights:
            new.set_weights(old.get_weights())
    if not converted:
        raise ValueError(f"Model {model.name!r} has no Conv2D layer to convert.")
    return copy
