"""Gaussian (quadratic) relative encodings, the paper's Eq. (9) and its full-covariance form."""

import math

import keras
from keras import ops

from sa_conv.encodings.base import RelativeEncoding, axis_offsets, register_encoding, relative_offsets


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("quadratic_full", covariance="full")
@register_encoding("quadratic", covariance="isotropic")
class QuadraticEncoding(RelativeEncoding):
    """Gaussian (quadratic) relative encoding, paper Eq. (9).

    For head ``h`` with center ``Delta_h`` (2-vector ``(row, col)`` in grid pixels) and inverse
    covariance ``Sigma_h^-1``::

        logit_h(q, k) = -1/2 (delta - Delta_h)^T Sigma_h^-1 (delta - Delta_h),  delta = k - q.

    * ``covariance="isotropic"`` (``"quadratic"``): ``Sigma_h^-1 = s_h^2 I``, i.e. the paper's
      ``-alpha_h ||delta - Delta_h||^2`` with ``alpha_h = s_h^2 / 2`` (`alphas`). ``s_h``
      starts at ``1 + N(0, spread_init_std^2)``, so alpha starts near 0.5. Separable.
    * ``covariance="full"`` (``"quadratic_full"``): ``Sigma_h^-1 = A_h A_h^T`` (positive
      semi-definite by construction), ``A_h`` starting at ``I + N(0, spread_init_std^2)``.

    Centers start at ``N(0, center_init_std^2)``. Weights: ``centers (heads, 2)``, ``spreads``
    ``(heads,)`` or ``(heads, 2, 2)``. Neither takes weight decay (`no_weight_decay`), as in the
    reference implementation: decay would pull every head's center to the query pixel and flatten
    its Gaussian.
    """

    COVARIANCES = ("isotropic", "full")
    convolutional_init = True

    def __init__(self, num_heads, covariance="isotropic", center_init_std=2.0, spread_init_std=0.01,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        if covariance not in self.COVARIANCES:
            raise ValueError(f"covariance must be one of {self.COVARIANCES}, got {covariance!r}.")
        self.num_heads = int(num_heads)
        self.covariance = covariance
        self.center_init_std = float(center_init_std)
        self.spread_init_std = float(spread_init_std)
        self.seed = seed

    @classmethod
    def from_attention(cls, attention, input_dim, covariance="isotropic"):
        return cls(attention.num_heads, covariance=covariance, center_init_std=attention.center_init_std,
                   spread_init_std=attention.spread_init_std, seed=attention.sublayer_seed(0),
                   name="position_encoding")

    @classmethod
    def is_separable(cls, covariance="isotropic"):
        return covariance == "isotropic"

    @property
    def options(self):
        return {"covariance": self.covariance}

    def build(self, input_shape=None):
        h = self.num_heads
        seed = self.seed
        self.centers = self.add_weight(
            name="centers", shape=(h, 2),
            initializer=keras.initializers.RandomNormal(0.0, self.center_init_std, seed=seed),
            autocast=False,
        )
        noise = keras.initializers.RandomNormal(0.0, self.spread_init_std, seed=None if seed is None else seed + 1)
        if self.covariance == "isotropic":
            init = lambda shape, dtype=None: 1.0 + noise(shape, dtype)  # noqa: E731
            shape = (h,)
        else:
            init = lambda shape, dtype=None: ops.eye(2, dtype=dtype) + noise(shape, dtype)  # noqa: E731
            shape = (h, 2, 2)
        self.spreads = self.add_weight(name="spreads", shape=shape, initializer=init, autocast=False)

    def no_weight_decay(self):
        return [self.centers, self.spreads]

    def gaussian_weights(self):
        return [self.centers, self.spreads]

    # ---------------------------------------------------------------- public accessors

    def inverse_covariance(self):
        """``Sigma_h^-1`` as its entries ``(a, b, c)`` of ``[[a, b], [b, c]]``, each ``(heads,)``."""
        if self.covariance == "isotropic":
            a = ops.square(self.spreads)
            return a, ops.zeros_like(a), a
        inv = ops.einsum("hij,hkj->hik", self.spreads, self.spreads)  # A A^T
        return inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]

    def alphas(self):
        """The paper's ``alpha_h`` of the isotropic encoding, ``(heads,)``: ``s_h^2 / 2``."""
        self._require_isotropic("alphas")
        return 0.5 * ops.square(self.spreads)

    def set_alphas(self, alphas):
        """Sets every head's ``alpha_h`` (positive; a scalar or ``(heads,)``)."""
        self._require_isotropic("set_alphas")
        alphas = ops.broadcast_to(ops.convert_to_tensor(alphas, "float32"), (self.num_heads,))
        if not bool(ops.all(alphas > 0)):
            raise ValueError("alpha must be positive.")
        self.spreads.assign(ops.sqrt(2.0 * alphas))

    def set_centers(self, centers):
        """Sets the centers ``Delta_h``, ``(heads, 2)`` as (row, col) offsets."""
        self.centers.assign(ops.convert_to_tensor(centers, "float32"))

    def initialize_convolutional(self, shifts, strength, max_offset=None):
        """Theorem 1's construction: centers at the ``shifts`` ``(heads, 2)``, ``Sigma_h^-1 =
        2 strength I`` (``alpha_h = strength``), exact at every offset."""
        self.set_centers(shifts)
        root = math.sqrt(2.0 * float(strength))
        if self.covariance == "isotropic":
            self.spreads.assign(ops.full((self.num_heads,), root))
        else:
            self.spreads.assign(ops.broadcast_to(root * ops.eye(2), (self.num_heads, 2, 2)))

    def gaussian(self):
        a, b, c = self.inverse_covariance()
        precision = ops.stack([ops.stack([a, b], -1), ops.stack([b, c], -1)], -2)
        return self.centers, precision

    def _require_isotropic(self, what):
        if self.covariance != "isotropic":
            raise ValueError(f"{what} needs the isotropic encoding; this one has a full covariance.")

    # ---------------------------------------------------------------- logits

    def logits(self, height, width, queries=None, keys=None):
        """Attention logits ``(heads, H*W, H*W)`` for an ``H x W`` grid."""
        dy, dx = relative_offsets(height, width)
        a, b, c = (ops.reshape(t, (-1, 1, 1)) for t in self.inverse_covariance())
        ey = ops.convert_to_tensor(dy)[None] - ops.reshape(self.centers[:, 0], (-1, 1, 1))
        ex = ops.convert_to_tensor(dx)[None] - ops.reshape(self.centers[:, 1], (-1, 1, 1))
        return -0.5 * (a * ey * ey + 2.0 * b * ey * ex + c * ex * ex)

    def factor_logits(self, height, width):
        """The isotropic logits as ``row (heads, H, H)`` + ``col (heads, W, W)``, indexed
        ``[head, query row, key row]`` and ``[head, query col, key col]``."""
        if not self.separable:
            raise ValueError("Full-covariance logits have a cross term and do not separate.")
        half_s2 = 0.5 * ops.reshape(ops.square(self.spreads), (-1, 1, 1))
        ey = ops.convert_to_tensor(axis_offsets(height))[None] - ops.reshape(self.centers[:, 0], (-1, 1, 1))
        ex = ops.convert_to_tensor(axis_offsets(width))[None] - ops.reshape(self.centers[:, 1], (-1, 1, 1))
        return -half_s2 * ey * ey, -half_s2 * ex * ex

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "covariance": self.covariance,
            "center_init_std": self.center_init_std,
            "spread_init_std": self.spread_init_std,
            "seed": self.seed,
        }
