"""Learned 2-D relative encoding, position only (the paper's "SA learned embedding")."""

import keras
import numpy as np
from keras import ops

from sa_conv.encodings.base import (RelativeEncoding, check_table_bound, convolutional_logits, register_encoding,
                                    relative_indices)
from sa_conv.initializers import FanInUniform


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("learned")
class LearnedRelativeEncoding(RelativeEncoding):
    """Learned 2-D relative encoding, position only.

    Separate row and column embedding tables of ``2 P - 1`` rows (offsets ``-(P-1)..(P-1)``,
    ``P = max_grid_size``) and ``embedding_dim`` columns; each head has a row key ``w_h^row``
    and a column key ``w_h^col``::

        logit_h(q, k) = w_h^row . e_row[dy] + w_h^col . e_col[dx].

    Weights: ``row_embeddings``, ``col_embeddings`` ``(2P-1, E)``; ``row_head_keys``,
    ``col_head_keys`` ``(E, heads)``. Separable: a row term plus a column term. Initialization:
    ``N(0, initializer_range)`` for all four, or with ``initialization="reference"`` the reference
    implementation's (PyTorch's ``Embedding`` and ``Linear``): tables ``N(0, 1)``, keys
    ``U(+-1/sqrt(E))``, which makes the initial logits about 100 times larger.
    """

    convolutional_init = True
    offset_tables = True

    def __init__(self, num_heads, max_grid_size, embedding_dim, initializer_range=0.02, seed=None,
                 initialization=None, **kwargs):
        super().__init__(**kwargs)
        self.initialization = initialization
        self.num_heads = int(num_heads)
        self.max_grid_size = int(max_grid_size)
        self.embedding_dim = int(embedding_dim)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        if self.max_grid_size < 1 or self.embedding_dim < 1:
            raise ValueError("max_grid_size and embedding_dim must be positive.")

    @classmethod
    def from_attention(cls, attention, input_dim):
        return cls(attention.num_heads, attention.max_grid_size, attention.position_embedding_dim or input_dim,
                   initializer_range=attention.initializer_range, seed=attention.sublayer_seed(0),
                   initialization=getattr(attention, "initialization", None), name="position_encoding")

    @classmethod
    def is_separable(cls):
        return True

    def build(self, input_shape=None):
        n, e = 2 * self.max_grid_size - 1, self.embedding_dim
        for i, (name, shape) in enumerate((("row_embeddings", (n, e)), ("col_embeddings", (n, e)),
                                           ("row_head_keys", (e, self.num_heads)),
                                           ("col_head_keys", (e, self.num_heads)))):
            # A fresh initializer per weight: one unseeded object returns the same values on
            # every call.
            seed = None if self.seed is None else self.seed + i
            if self.initialization == "reference":
                init = keras.initializers.RandomNormal(0.0, 1.0, seed=seed) if i < 2 else FanInUniform(seed=seed)
            else:
                init = keras.initializers.RandomNormal(0.0, self.initializer_range, seed=seed)
            setattr(self, name, self.add_weight(name=name, shape=shape, initializer=init, autocast=False))

    def initialize_convolutional(self, shifts, strength, max_offset=None):
        """Row and column scores per offset ``e[d] . w_h = -strength (d - shift_h)^2`` for every
        offset of the tables: the first ``heads`` columns of each table hold the scores and the
        head keys select them (exact; the other columns keep their initialization and the keys
        start at zero there). Needs ``embedding_dim >= heads``."""
        if self.embedding_dim < self.num_heads:
            raise ValueError(f"The convolutional initialization of {type(self).__name__} writes one table column per "
                             f"head: embedding_dim {self.embedding_dim} < {self.num_heads} heads. Raise "
                             f"position_embedding_dim.")
        offsets = np.arange(-(self.max_grid_size - 1), self.max_grid_size)
        keys = np.eye(self.embedding_dim, self.num_heads, dtype=np.float32)
        for axis, (table, head_keys) in enumerate(((self.row_embeddings, self.row_head_keys),
                                                   (self.col_embeddings, self.col_head_keys))):
            values = np.array(ops.convert_to_numpy(table))
            values[:, :self.num_heads] = convolutional_logits(np.asarray(shifts)[:, axis], strength, offsets).T
            table.assign(values)
            head_keys.assign(keys)

    def factor_logits(self, height, width):
        """``row (heads, H, H)`` and ``col (heads, W, W)`` with ``logit(q, k) = row[qi, ki] +
        col[qj, kj]``, indexed ``[head, query, key]``."""
        check_table_bound(height, width, self.max_grid_size, type(self).__name__)
        p = self.max_grid_size
        # (2P-1, heads) per-offset scores, then gathered to [query row, key row, head].
        row = ops.take(ops.matmul(self.row_embeddings, self.row_head_keys), relative_indices(height, p), axis=0)
        col = ops.take(ops.matmul(self.col_embeddings, self.col_head_keys), relative_indices(width, p), axis=0)
        return ops.transpose(row, (2, 0, 1)), ops.transpose(col, (2, 0, 1))

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "max_grid_size": self.max_grid_size,
            "embedding_dim": self.embedding_dim,
            "initializer_range": self.initializer_range,
            "seed": self.seed,
            "initialization": self.initialization,
        }
