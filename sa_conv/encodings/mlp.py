"""A relative encoding computed by a small MLP of the continuous offset ``(dy, dx)``: one logit
per head for any offset, so it needs no table and works on grids larger than any seen in
training. Not separable (the MLP mixes the two axes): attention takes the dense path."""

import math

import keras
import numpy as np
from keras import ops

from sa_conv.encodings.base import RelativeEncoding, register_encoding, relative_offsets


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("mlp")
class MLPRelativeEncoding(RelativeEncoding):
    """``logit_h(q, k) = MLP(delta / scale)_h`` with ``delta = k - q = (dy, dx)``.

    The MLP has ``depth`` hidden layers of ``hidden_units`` ReLU units and a linear output of
    ``heads`` units; offsets are divided by ``scale`` (default 8 grid pixels) so the first
    layer sees values of order one. Weights: ``kernel_i``, ``bias_i`` per layer.
    """

    convolutional_init = True

    def __init__(self, num_heads, hidden_units=32, depth=2, scale=8.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(hidden_units) < 1 or int(depth) < 1 or float(scale) <= 0:
            raise ValueError(f"hidden_units and depth must be positive and scale > 0, got "
                             f"{hidden_units}, {depth}, {scale}.")
        self.num_heads = int(num_heads)
        self.hidden_units = int(hidden_units)
        self.depth = int(depth)
        self.scale = float(scale)
        self.seed = seed

    @classmethod
    def from_attention(cls, attention, input_dim, hidden_units=32, depth=2, scale=8.0):
        return cls(attention.num_heads, hidden_units, depth, scale, seed=attention.sublayer_seed(0),
                   name="position_encoding")

    def build(self, input_shape=None):
        sizes = [2] + [self.hidden_units] * self.depth + [self.num_heads]
        self.kernels, self.biases = [], []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            seed = None if self.seed is None else self.seed + i
            self.kernels.append(self.add_weight(name=f"kernel_{i}", shape=(fan_in, fan_out), autocast=False,
                                                initializer=keras.initializers.GlorotUniform(seed=seed)))
            self.biases.append(self.add_weight(name=f"bias_{i}", shape=(fan_out,), initializer="zeros",
                                               autocast=False))

    def offset_logits(self, offsets):
        """Per-head logits ``(..., heads)`` of offsets ``(..., 2)`` (row, col) in grid pixels."""
        x = ops.convert_to_tensor(np.asarray(offsets, np.float32) / self.scale)
        for i, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
            x = ops.matmul(x, kernel) + bias
            if i < len(self.kernels) - 1:
                x = ops.relu(x)
        return x

    def initialize_convolutional(self, shifts, strength, max_offset=None):
        """A ReLU MLP cannot be a quadratic, but on the integer offsets it can be exact up to a
        radius: each head's logits start as ``-strength (huber_R(dy - shift_y) + huber_R(dx -
        shift_x))``, the quadratic within ``R`` pixels of the head's shift on each axis and
        linear beyond (slope at least ``(2R - 1) strength``; with ``R >= 2`` a head puts less than
        ``e^(-3 strength)`` on any pixel beyond, relative to its peak).

        Construction: the first layer's units are hinges ``relu(d - k)`` at the integer knots
        ``k`` of ``[min shift - R, max shift + R]`` and one ``relu(k_min - d)`` per axis, any
        further hidden layer passes them on (identity), and the output layer sums each head's
        piecewise-linear interpolation of its target through those knots. ``R`` is the largest
        the hidden units allow, ``(hidden_units - (spread_y + 1) - (spread_x + 1)) // 4`` for
        shifts spanning ``spread`` pixels on each axis (6 for 32 units and a 3 x 3 grid); the units left over keep their initialization, with zero
        weight into the output.
        """
        shifts = np.asarray(shifts, np.float64)
        knots, units = [], 0
        for axis in range(2):
            low, high = math.floor(shifts[:, axis].min()), math.ceil(shifts[:, axis].max())
            knots.append((low, high))
            units += high - low + 1
        radius = (self.hidden_units - units) // 4
        if radius < 1:
            raise ValueError(f"The convolutional initialization of the mlp encoding needs hidden_units >= {units + 4} "
                             f"for these shifts, got {self.hidden_units}.")
        first = [np.array(ops.convert_to_numpy(self.kernels[0])), np.array(ops.convert_to_numpy(self.biases[0]))]
        out_kernel = np.zeros((self.hidden_units, self.num_heads))
        out_bias = np.zeros(self.num_heads)
        unit = 0
        for axis, (low, high) in enumerate(knots):
            points = np.arange(low - radius, high + radius + 1)  # the integer knots
            distance = np.abs(points[None] - shifts[:, axis:axis + 1])  # (heads, knots)
            target = -strength * np.where(distance <= radius, distance ** 2, radius ** 2 + 2 * radius * (distance - radius))
            slopes = np.diff(target, axis=1)  # (heads, knots - 1): slope on [k, k + 1]
            # relu(k_min - d): the left extension, continuing the first slope.
            first[0][:, unit] = 0.0
            first[0][axis, unit] = -self.scale
            first[1][unit] = points[0]
            out_kernel[unit] = -slopes[:, 0]
            unit += 1
            changes = np.concatenate([slopes[:, :1], np.diff(slopes, axis=1)], axis=1)
            for k, change in zip(points[:-1], changes.T):  # relu(d - k)
                first[0][:, unit] = 0.0
                first[0][axis, unit] = self.scale
                first[1][unit] = -k
                out_kernel[unit] = change
                unit += 1
            out_bias += target[:, 0]
        used = np.arange(unit)
        self.kernels[0].assign(first[0].astype(np.float32))
        self.biases[0].assign(first[1].astype(np.float32))
        for kernel, bias in zip(self.kernels[1:-1], self.biases[1:-1]):  # identity on the used units
            values, offsets = np.array(ops.convert_to_numpy(kernel)), np.array(ops.convert_to_numpy(bias))
            values[:, used] = 0.0
            values[used, used] = 1.0
            offsets[used] = 0.0
            kernel.assign(values)
            bias.assign(offsets)
        self.kernels[-1].assign(out_kernel.astype(np.float32))
        self.biases[-1].assign(out_bias.astype(np.float32))

    def logits(self, height, width, queries=None, keys=None):
        dy, dx = relative_offsets(height, width)
        return ops.transpose(self.offset_logits(np.stack([dy, dx], -1)), (2, 0, 1))

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "hidden_units": self.hidden_units,
                "depth": self.depth, "scale": self.scale, "seed": self.seed}
