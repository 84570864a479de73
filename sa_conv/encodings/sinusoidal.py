"""Fixed sinusoidal features of the row and column offsets, mapped to per-head logits by learned
vectors: a relative encoding that is a *function* of the offset (Transformer-XL's relative
encoding, one set of features per axis), so offsets 14 and 15 get similar logits and any grid
size works."""

import keras
import numpy as np
from keras import ops

from sa_conv.encodings.base import RelativeEncoding, axis_offsets, convolutional_logits, register_encoding


def sinusoid_features(offsets, dim):
    """``[sin(d w_k), cos(d w_k)]_k`` of the offsets ``d``, ``w_k = 10000^(-2k / dim)``:
    float32 ``offsets.shape + (dim,)`` (``dim`` even)."""
    inverse_frequency = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    angles = np.asarray(offsets, np.float64)[..., None] * inverse_frequency
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("sinusoidal")
class SinusoidalRelativeEncoding(RelativeEncoding):
    """``logit_h(q, k) = u_h^row . f(dy) + u_h^col . f(dx)`` with the fixed sinusoidal features
    ``f`` of `sinusoid_features` (``feature_dim`` of them per axis) and learned per-head vectors.

    Weights: ``row_head_keys``, ``col_head_keys`` ``(feature_dim, heads)``. Position only and
    separable (a row term plus a column term), no bound on the grid size.
    """

    convolutional_init = True

    def __init__(self, num_heads, feature_dim, initializer_range=0.02, seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(feature_dim) < 2 or int(feature_dim) % 2:
            raise ValueError(f"feature_dim must be a positive even number, got {feature_dim}.")
        self.num_heads = int(num_heads)
        self.feature_dim = int(feature_dim)
        self.initializer_range = float(initializer_range)
        self.seed = seed

    @classmethod
    def from_attention(cls, attention, input_dim):
        dim = attention.position_embedding_dim or input_dim
        return cls(attention.num_heads, dim + dim % 2, initializer_range=attention.initializer_range,
                   seed=attention.sublayer_seed(0), name="position_encoding")

    @classmethod
    def is_separable(cls):
        return True

    def build(self, input_shape=None):
        for i, name in enumerate(("row_head_keys", "col_head_keys")):
            init = keras.initializers.RandomNormal(0.0, self.initializer_range,
                                                   seed=None if self.seed is None else self.seed + i)
            setattr(self, name, self.add_weight(name=name, shape=(self.feature_dim, self.num_heads),
                                                initializer=init, autocast=False))

    def initialize_convolutional(self, shifts, strength, max_offset):
        """Per-head vectors fitted by least squares so that ``u_h . f(d) = -strength (d -
        shift_h)^2`` for the offsets ``|d| <= max_offset`` (exact when ``feature_dim`` is at least
        their ``2 max_offset + 1``: the features of distinct offsets are independent). Beyond
        ``max_offset`` the logits are whatever the sinusoids give: fit the largest grid."""
        offsets = np.arange(-int(max_offset), int(max_offset) + 1)
        features = sinusoid_features(offsets, self.feature_dim).astype(np.float64)
        for axis, head_keys in enumerate((self.row_head_keys, self.col_head_keys)):
            target = convolutional_logits(np.asarray(shifts)[:, axis], strength, offsets).T  # (offsets, heads)
            head_keys.assign(np.linalg.lstsq(features, target, rcond=None)[0].astype(np.float32))

    def factor_logits(self, height, width):
        """``row (heads, H, H)`` and ``col (heads, W, W)``, indexed ``[head, query, key]``."""
        row = ops.matmul(sinusoid_features(axis_offsets(height), self.feature_dim), self.row_head_keys)
        col = ops.matmul(sinusoid_features(axis_offsets(width), self.feature_dim), self.col_head_keys)
        return ops.transpose(row, (2, 0, 1)), ops.transpose(col, (2, 0, 1))

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "feature_dim": self.feature_dim,
                "initializer_range": self.initializer_range, "seed": self.seed}
