"""Relative positional encodings for self-attention over a 2-D grid.

Pixels of an ``H x W`` grid are flattened row-major: pixel ``(i, j)`` has index ``i * W + j``.
For a query pixel ``q`` and a key pixel ``k`` the relative offset is
``delta = k - q = (dy, dx)`` (row offset, column offset), in pixels of the grid.

Position-only encodings (`QuadraticEncoding`, `LearnedRelativeEncoding`) give attention logits
of shape ``(heads, H*W, H*W)`` that do not depend on the input. `LearnedContentEncoding` gives
the ``q . r_delta`` term of content-based attention, of shape ``(batch, heads, H*W, H*W)``.

These layers are built by `sa_conv.attention.MultiHeadSelfAttention2D`, which owns them. They
compute in float32 (their ``dtype`` policy is pinned and their weights are never autocast) so
that logits and softmax stay in float32 under mixed precision.
"""

import keras
import numpy as np
from keras import ops


def relative_offsets(height, width):
    """Offsets ``k - q`` between all grid pixels.

    Returns:
      ``(dy, dx)``: two float32 numpy arrays of shape ``(H*W, H*W)``, indexed
      ``[query, key]``.
    """
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    rows, cols = rows.reshape(-1), cols.reshape(-1)
    dy = rows[None, :] - rows[:, None]
    dx = cols[None, :] - cols[:, None]
    return dy.astype(np.float32), dx.astype(np.float32)


def relative_indices(size, max_size):
    """``(size, size)`` int32 table of ``k - q + max_size - 1`` for 1-D positions, in
    ``[0, 2 * max_size - 2]``: the row of an embedding table of length ``2 * max_size - 1``."""
    positions = np.arange(size)
    return (positions[None, :] - positions[:, None] + max_size - 1).astype(np.int32)


def _check_grid(height, width, max_grid_size, layer):
    if height > max_grid_size or width > max_grid_size:
        raise ValueError(
            f"{layer}: the attention grid is {height}x{width} but the learned relative "
            f"embedding tables cover offsets up to max_grid_size={max_grid_size} pixels. Build "
            f"the layer with max_grid_size >= {max(height, width)}."
        )


class _Encoding(keras.layers.Layer):
    def __init__(self, **kwargs):
        kwargs["dtype"] = "float32"  # logits and softmax in float32, also under mixed precision
        super().__init__(**kwargs)


@keras.saving.register_keras_serializable(package="sa_conv")
class QuadraticEncoding(_Encoding):
    """Gaussian (quadratic) relative encoding, paper Eq. (9).

    For head ``h`` with center ``Delta_h`` (2-vector ``(row, col)`` in grid pixels) and inverse
    covariance ``Sigma_h^-1``::

        logit_h(q, k) = -1/2 (delta - Delta_h)^T Sigma_h^-1 (delta - Delta_h),  delta = k - q.

    * ``covariance="isotropic"``: ``Sigma_h^-1 = s_h^2 I``, i.e. the paper's
      ``-alpha_h ||delta - Delta_h||^2`` with ``alpha_h = s_h^2 / 2``. ``s_h`` starts at
      ``1 + N(0, spread_init_std^2)``, so alpha starts near 0.5.
    * ``covariance="full"``: ``Sigma_h^-1 = A_h A_h^T`` (positive semi-definite by
      construction), ``A_h`` starting at ``I + N(0, spread_init_std^2)``.

    Centers start at ``N(0, center_init_std^2)``. Weights: ``centers (heads, 2)``, ``spreads``
    ``(heads,)`` or ``(heads, 2, 2)``. Neither should receive weight decay.
    """

    COVARIANCES = ("isotropic", "full")

    def __init__(
        self,
        num_heads,
        covariance="isotropic",
        center_init_std=2.0,
        spread_init_std=0.01,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if covariance not in self.COVARIANCES:
            raise ValueError(f"covariance must be one of {self.COVARIANCES}, got {covariance!r}.")
        self.num_heads = int(num_heads)
        self.covariance = covariance
        self.center_init_std = float(center_init_std)
        self.spread_init_std = float(spread_init_std)
        self.seed = seed

    def build(self, input_shape=None):
        h = self.num_heads
        self.centers = self.add_weight(
            name="centers",
            shape=(h, 2),
            initializer=keras.initializers.RandomNormal(0.0, self.center_init_std, seed=self.seed),
            autocast=False,
        )
        noise = keras.initializers.RandomNormal(0.0, self.spread_init_std, seed=self.seed)
        if self.covariance == "isotropic":
            init = lambda shape, dtype=None: 1.0 + noise(shape, dtype)  # noqa: E731
            shape = (h,)
        else:
            init = lambda shape, dtype=None: ops.eye(2, dtype=dtype) + noise(shape, dtype)  # noqa: E731
            shape = (h, 2, 2)
        self.spreads = self.add_weight(name="spreads", shape=shape, initializer=init, autocast=False)

    def inverse_covariance(self):
        """``Sigma_h^-1`` as its entries ``(a, b, c)`` of ``[[a, b], [b, c]]``, each ``(heads,)``."""
        if self.covariance == "isotropic":
            a = ops.square(self.spreads)
            return a, ops.zeros_like(a), a
        inv = ops.einsum("hij,hkj->hik", self.spreads, self.spreads)  # A A^T
        return inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]

    def logits(self, height, width):
        """Attention logits ``(heads, H*W, H*W)`` for an ``H x W`` grid."""
        dy, dx = relative_offsets(height, width)
        a, b, c = (ops.reshape(t, (-1, 1, 1)) for t in self.inverse_covariance())
        ey = dy[None] - ops.reshape(self.centers[:, 0], (-1, 1, 1))
        ex = dx[None] - ops.reshape(self.centers[:, 1], (-1, 1, 1))
        return -0.5 * (a * ey * ey + 2.0 * b * ey * ex + c * ex * ex)

    @property
    def separable(self):
        """Isotropic logits split into a row term plus a column term (no cross term)."""
        return self.covariance == "isotropic"

    def factor_logits(self, height, width):
        """The isotropic logits as ``row (heads, H, H)`` + ``col (heads, W, W)``, indexed
        ``[head, query row, key row]`` and ``[head, query col, key col]``:
        ``logit(q, k) = row[qi, ki] + col[qj, kj]``."""
        if not self.separable:
            raise ValueError("Full-covariance logits have a cross term and do not separate.")
        half_s2 = 0.5 * ops.reshape(ops.square(self.spreads), (-1, 1, 1))
        rows = np.arange(height, dtype=np.float32)
        cols = np.arange(width, dtype=np.float32)
        dy = rows[None, :] - rows[:, None]  # [query, key]
        dx = cols[None, :] - cols[:, None]
        ey = dy[None] - ops.reshape(self.centers[:, 0], (-1, 1, 1))
        ex = dx[None] - ops.reshape(self.centers[:, 1], (-1, 1, 1))
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


@keras.saving.register_keras_serializable(package="sa_conv")
class LearnedRelativeEncoding(_Encoding):
    """Learned 2-D relative encoding, position only.

    Separate row and column embedding tables of ``2 P - 1`` rows (offsets ``-(P-1)..(P-1)``,
    ``P = max_grid_size``) and ``embedding_dim`` columns; each head has a row key ``w_h^row``
    and a column key ``w_h^col``::

        logit_h(q, k) = w_h^row . e_row[dy] + w_h^col . e_col[dx].

    Weights: ``row_embeddings``, ``col_embeddings`` ``(2P-1, E)``; ``row_head_keys``,
    ``col_head_keys`` ``(E, heads)``.
    """

    def __init__(self, num_heads, max_grid_size, embedding_dim, initializer_range=0.02, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.max_grid_size = int(max_grid_size)
        self.embedding_dim = int(embedding_dim)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        if self.max_grid_size < 1 or self.embedding_dim < 1:
            raise ValueError("max_grid_size and embedding_dim must be positive.")

    def build(self, input_shape=None):
        n, e = 2 * self.max_grid_size - 1, self.embedding_dim
        init = keras.initializers.RandomNormal(0.0, self.initializer_range, seed=self.seed)
        self.row_embeddings = self.add_weight(name="row_embeddings", shape=(n, e), initializer=init, autocast=False)
        self.col_embeddings = self.add_weight(name="col_embeddings", shape=(n, e), initializer=init, autocast=False)
        self.row_head_keys = self.add_weight(name="row_head_keys", shape=(e, self.num_heads), initializer=init, autocast=False)
        self.col_head_keys = self.add_weight(name="col_head_keys", shape=(e, self.num_heads), initializer=init, autocast=False)

    separable = True

    def factor_logits(self, height, width):
        """``row (heads, H, H)`` and ``col (heads, W, W)`` with ``logit(q, k) = row[qi, ki] +
        col[qj, kj]``, indexed ``[head, query, key]``."""
        _check_grid(height, width, self.max_grid_size, type(self).__name__)
        p = self.max_grid_size
        # (2P-1, heads) per-offset scores, then gathered to [query row, key row, head].
        row = ops.take(ops.matmul(self.row_embeddings, self.row_head_keys), relative_indices(height, p), axis=0)
        col = ops.take(ops.matmul(self.col_embeddings, self.col_head_keys), relative_indices(width, p), axis=0)
        return ops.transpose(row, (2, 0, 1)), ops.transpose(col, (2, 0, 1))

    def logits(self, height, width):
        """Attention logits ``(heads, H*W, H*W)`` for an ``H x W`` grid."""
        row, col = self.factor_logits(height, width)
        n = height * width
        return ops.reshape(row[:, :, None, :, None] + col[:, None, :, None, :], (self.num_heads, n, n))

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "max_grid_size": self.max_grid_size,
            "embedding_dim": self.embedding_dim,
            "initializer_range": self.initializer_range,
            "seed": self.seed,
        }


@keras.saving.register_keras_serializable(package="sa_conv")
class LearnedContentEncoding(_Encoding):
    """The relative term ``q . r_delta`` of content-based 2-D attention (Ramachandran et al.,
    2019), as in the paper's "learned embedding + content" model.

    The query of each head, of size ``d``, is split in a row half and a column half::

        q . r_delta = q[:d/2] . e_row[dy] + q[d/2:] . e_col[dx],

    with row and column tables ``(2P - 1, d / 2)`` shared by all heads.
    """

    def __init__(self, max_grid_size, query_dim, initializer_range=0.02, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.max_grid_size = int(max_grid_size)
        self.query_dim = int(query_dim)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        if self.query_dim % 2:
            raise ValueError(
                f"learned_content splits each query in a row half and a column half, so the "
                f"query size (the layer's input channels) must be even, got {self.query_dim}."
            )

    def build(self, input_shape=None):
        n, e = 2 * self.max_grid_size - 1, self.query_dim // 2
        init = keras.initializers.RandomNormal(0.0, self.initializer_range, seed=self.seed)
        self.row_embeddings = self.add_weight(name="row_embeddings", shape=(n, e), initializer=init, autocast=False)
        self.col_embeddings = self.add_weight(name="col_embeddings", shape=(n, e), initializer=init, autocast=False)

    def logits(self, queries):
        """``q . r_delta`` of shape ``(batch, heads, H*W, H*W)`` for queries
        ``(batch, heads, H, W, d)``."""
        _, heads, height, width, d = queries.shape
        _check_grid(height, width, self.max_grid_size, type(self).__name__)
        p, half = self.max_grid_size, d // 2
        queries = ops.cast(queries, "float32")
        r_row = ops.take(self.row_embeddings, relative_indices(height, p), axis=0)  # (Hq, Hk, d/2)
        r_col = ops.take(self.col_embeddings, relative_indices(width, p), axis=0)  # (Wq, Wk, d/2)
        row = ops.einsum("bhijd,ikd->bhijk", queries[..., :half], r_row)
        col = ops.einsum("bhijd,jld->bhijl", queries[..., half:], r_col)
        scores = row[..., :, None] + col[..., None, :]  # (b, heads, Hq, Wq, Hk, Wk)
        n = height * width
        return ops.reshape(scores, (-1, heads, n, n))

    def get_config(self):
        return {
            **super().get_config(),
            "max_grid_size": self.max_grid_size,
            "query_dim": self.query_dim,
            "initializer_range": self.initializer_range,
            "seed": self.seed,
        }

