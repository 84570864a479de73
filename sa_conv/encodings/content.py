"""Content-based attention with learned 2-D relative embeddings, two encodings over one base
(`ContentEncoding`): the paper's "SA learned embedding w/ content" as the reference implements it
(`ContentPlusLearnedBiasEncoding`) and Ramachandran et al.'s (2019,
`ContentWithRelativeKeysEncoding`)."""

import math

import keras
from keras import ops

from sa_conv.encodings.base import RelativeEncoding, check_table_bound, register_encoding, relative_indices
from sa_conv.encodings.learned import LearnedRelativeEncoding


class ContentEncoding(RelativeEncoding):
    """Content logits ``q . k / sqrt(d)`` and a learned relative term: what the two content
    encodings share. The queries and keys ``(batch, heads, N, d)`` come from the attention layer's
    ``query`` and ``key`` maps. Not position-only: the logits are ``(batch, heads, N, N)``."""

    position_only = False
    offset_tables = True

    def __init__(self, max_grid_size, query_dim, initializer_range=0.02, seed=None, initialization=None, **kwargs):
        super().__init__(**kwargs)
        self.max_grid_size = int(max_grid_size)
        self.query_dim = int(query_dim)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        self.initialization = initialization

    @classmethod
    def from_attention(cls, attention, input_dim, **extra):
        return cls(attention.max_grid_size, input_dim, initializer_range=attention.initializer_range,
                   seed=attention.sublayer_seed(0), name="position_encoding",
                   initialization=getattr(attention, "initialization", None), **extra)

    @staticmethod
    def content_logits(queries, keys):
        """``q . k`` (unscaled), ``(batch, heads, N, N)``, for queries and keys ``(batch, heads, N,
        d)``, in their dtype: under mixed precision the logits and their softmax stay in the compute
        dtype, as Keras's MultiHeadAttention's do (oneDNN's softmax sums in float32 inside); a float32
        copy of the four ``(batch, heads, N, N)`` tensors, forward and backward, cost more than the
        softmax itself."""
        if queries is None or keys is None:
            raise ValueError("content-based logits depend on the input: pass queries and keys.")
        return ops.einsum("bhqd,bhkd->bhqk", queries, keys)

    @staticmethod
    def scaled(queries):
        """``q / sqrt(d)``: the logits' scale applied to the ``(batch, heads, N, d)`` queries, not to
        the ``(batch, heads, N, N)`` logits (``N / d`` times fewer products, forward and backward)."""
        return queries * ops.cast(1.0 / math.sqrt(queries.shape[-1]), queries.dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "max_grid_size": self.max_grid_size,
            "query_dim": self.query_dim,
            "initializer_range": self.initializer_range,
            "seed": self.seed,
            "initialization": self.initialization,
        }


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("content_plus_learned_bias")
class ContentPlusLearnedBiasEncoding(ContentEncoding):
    """``q . k / sqrt(d) + logit_h(delta)``: content logits plus the position-only logits of the
    ``learned`` encoding (`LearnedRelativeEncoding`: tables ``(2P - 1, E)`` and per-head keys
    ``(E, heads)``), unscaled, added to every example's content logits. The reference
    implementation's ``Learned2DRelativeSelfAttention`` with ``use_attention_data``, from which
    the paper's Table 1 row "SA learned embedding w/ content" comes.

    The position term is a position bias (`has_position_bias`): a serving copy holds it as a
    constant and folds the query and key maps into one (`sa_conv.serving`).
    """

    relative = "head_keys"

    def __init__(self, max_grid_size, query_dim, num_heads, embedding_dim, initializer_range=0.02, seed=None,
                 initialization=None, **kwargs):
        super().__init__(max_grid_size, query_dim, initializer_range, seed, initialization, **kwargs)
        self.num_heads = int(num_heads)
        self.embedding_dim = int(embedding_dim)
        self.position = LearnedRelativeEncoding(
            self.num_heads, self.max_grid_size, self.embedding_dim, initializer_range=self.initializer_range,
            seed=seed, initialization=initialization, name="position")

    @classmethod
    def from_attention(cls, attention, input_dim):
        return super().from_attention(attention, input_dim, num_heads=attention.num_heads,
                                      embedding_dim=attention.position_embedding_dim or input_dim)

    @classmethod
    def is_position_bias(cls):
        return True

    @classmethod
    def logits_flops(cls, height, width, num_heads, input_dim):
        n, d = height * width, input_dim
        # The two maps D -> heads * D and the content logits; the position term is input-independent.
        return 2 * (2 * n * d * num_heads * d) + 2 * num_heads * n * n * d

    def build(self, input_shape=None):
        self.position.build()

    def position_logits(self, height, width):
        """The position-only term ``logit_h(delta)``, ``(heads, H*W, H*W)``."""
        return self.position.logits(height, width)

    def logits(self, height, width, queries=None, keys=None):
        """``q . k / sqrt(d) + logit_h(delta)``, ``(batch, heads, N, N)``, in the queries' dtype."""
        content = self.content_logits(self.scaled(queries), keys)
        return content + ops.cast(self.position_logits(height, width), content.dtype)[None]

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "embedding_dim": self.embedding_dim}


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("content_with_relative_keys")
class ContentWithRelativeKeysEncoding(ContentEncoding):
    """``(q . k + q . r_delta) / sqrt(d)`` (Ramachandran et al., 2019): the query of each head
    (size ``d``) split in a row half and a column half,
    ``q . r_delta = q[:d/2] . e_row[dy] + q[d/2:] . e_col[dx]``, with row and column tables
    ``(2P - 1, d / 2)`` shared by all heads, drawn ``N(0, initializer_range)`` under either
    ``initialization``: the reference implementation, whose defaults ``"reference"`` follows, has
    no such encoding."""

    relative = "query"

    def __init__(self, max_grid_size, query_dim, initializer_range=0.02, seed=None, initialization=None, **kwargs):
        super().__init__(max_grid_size, query_dim, initializer_range, seed, initialization, **kwargs)
        if self.query_dim % 2:
            raise ValueError(
                f"content_with_relative_keys splits each query in a row half and a column half, so the "
                f"query size (the layer's input channels) must be even, got {self.query_dim}."
            )

    @classmethod
    def check_model(cls, *, grid_size, hidden_size, max_grid_size):
        if hidden_size % 2:
            raise ValueError(
                f"content_with_relative_keys splits each head's query in row and column halves: hidden_size "
                f"must be even, got {hidden_size}."
            )
        super().check_model(grid_size=grid_size, hidden_size=hidden_size, max_grid_size=max_grid_size)

    @classmethod
    def logits_flops(cls, height, width, num_heads, input_dim):
        n, d = height * width, input_dim
        return 2 * (2 * n * d * num_heads * d) + 2 * num_heads * n * n * d + 2 * num_heads * n * (height + width) * (d // 2)

    def build(self, input_shape=None):
        n, e = 2 * self.max_grid_size - 1, self.query_dim // 2
        for i, name in enumerate(("row_embeddings", "col_embeddings")):
            seed = None if self.seed is None else self.seed + i
            init = keras.initializers.RandomNormal(0.0, self.initializer_range, seed=seed)
            setattr(self, name, self.add_weight(name=name, shape=(n, e), initializer=init, autocast=False))

    def relative_logits(self, queries):
        """``q . r_delta`` of shape ``(batch, heads, H*W, H*W)`` for queries
        ``(batch, heads, H, W, d)``, in their dtype."""
        _, heads, height, width, d = queries.shape
        check_table_bound(height, width, self.max_grid_size, type(self).__name__)
        p, half = self.max_grid_size, d // 2
        r_row, r_col = (ops.cast(ops.take(table, relative_indices(side, p), axis=0), queries.dtype)  # (side, side, d/2)
                        for table, side in ((self.row_embeddings, height), (self.col_embeddings, width)))
        row = ops.einsum("bhijd,ikd->bhijk", queries[..., :half], r_row)
        col = ops.einsum("bhijd,jld->bhijl", queries[..., half:], r_col)
        scores = row[..., :, None] + col[..., None, :]  # (b, heads, Hq, Wq, Hk, Wk)
        n = height * width
        return ops.reshape(scores, (-1, heads, n, n))

    def logits(self, height, width, queries=None, keys=None):
        """``(q . k + q . r_delta) / sqrt(d)``, ``(batch, heads, N, N)``, in the queries' dtype."""
        queries = self.scaled(queries)
        relative = self.relative_logits(ops.reshape(queries, (-1, queries.shape[1], height, width, queries.shape[-1])))
        return self.content_logits(queries, keys) + relative
