"""A relative encoding computed by a small MLP of the continuous offset ``(dy, dx)``: one logit
per head for any offset, so it needs no table and works on grids larger than any seen in
training. Not separable (the MLP mixes the two axes): attention takes the dense path."""

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

    def logits(self, height, width, queries=None, keys=None):
        dy, dx = relative_offsets(height, width)
        return ops.transpose(self.offset_logits(np.stack([dy, dx], -1)), (2, 0, 1))

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "hidden_units": self.hidden_units,
                "depth": self.depth, "scale": self.scale, "seed": self.seed}
