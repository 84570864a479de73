"""Frozen encodings: what serves a trained encoding in inference, its input-independent part held
as constants computed once from the trained weights (`RelativeEncoding.frozen_constants`).

Each class is a serving form (`register_frozen_form`), named by the trained encodings it serves
(their ``serving_form``); ``get_encoding("frozen:NAME")`` is the frozen encoding of ``NAME``, so a
serving copy's attention is a `sa_conv.MultiHeadSelfAttention2D` with
``encoding="frozen:NAME"`` (`sa_conv.serving` builds it and sets the constants). The constants are
float32 and never autocast; the grid is the one the layer is built on. Frozen encodings serve only
(``serves_only``: the layer refuses ``training=True``).
"""

import math

import keras
from keras import ops

from sa_conv import aggregation
from sa_conv.encodings.base import RelativeEncoding, get_encoding, register_frozen_form

__all__ = ["FrozenEncoding", "FrozenGated", "FrozenPositionBias", "FrozenProbabilities", "QueryMajor"]


class FrozenEncoding(RelativeEncoding):
    """The constants of a serving form on one ``H x W`` grid (`constant_shapes`), set once by
    `set_constants` from the trained encoding's ``frozen_constants``.

    Args:
      num_heads: ``N_h``.
      trained: the name of the trained encoding it serves.
      query_dim: per-head query size of content forms (None: the layer's input channels).
    """

    serves_only = True

    def __init__(self, num_heads, trained, query_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.trained = get_encoding(trained).name
        if query_dim is not None:
            self.query_dim = int(query_dim)

    @classmethod
    def serving_form(cls, **options):
        return None  # it is one

    @property
    def options(self):
        return {"trained": self.trained}

    @classmethod
    def from_attention(cls, attention, input_dim, trained, **trained_options):
        return cls(attention.num_heads, trained, name="position_encoding")

    def constant_shapes(self, height, width) -> dict:
        raise NotImplementedError

    def build(self, input_shape=None):
        height, width = (None, None) if input_shape is None else tuple(input_shape[1:3])
        if height is None or width is None:
            raise ValueError(f"{self.name} serves constants for one grid: give the model input a fixed spatial shape "
                             f"(got {None if input_shape is None else tuple(input_shape)}).")
        self.grid = (int(height), int(width))
        self.constants = {name: self.add_weight(name=f"constant_{name}", shape=shape, initializer="zeros",
                                                trainable=False, autocast=False)
                          for name, shape in self.constant_shapes(*self.grid).items()}

    def set_constants(self, values: dict) -> None:
        """Assigns ``values`` (by name, each of its `constant_shapes`) as float32."""
        for name, value in values.items():
            self.constants[name].assign(ops.cast(value, "float32"))

    def _check_grid(self, height, width):
        if (height, width) != self.grid:
            raise ValueError(f"{self.name}'s constants are for a {self.grid} grid, got {(height, width)}.")

    def logits(self, height, width, queries=None, keys=None):
        raise ValueError(f"{type(self).__name__} holds probabilities (probabilities()), not logits.")

    def factor_logits(self, height, width):
        raise ValueError(f"{type(self).__name__} holds probabilities, not logits.")

    def get_config(self):
        config = {**super().get_config(), "num_heads": self.num_heads, "trained": self.trained}
        return {**config, "query_dim": self.query_dim} if hasattr(self, "query_dim") else config


@keras.saving.register_keras_serializable(package="sa_conv")
@register_frozen_form("probabilities")
class FrozenProbabilities(FrozenEncoding):
    """Position-only attention from its probabilities ``P`` of Eq. (5), computed once: dense
    ``probabilities`` ``(heads, N, N)``, or where the layer sums separably (its
    ``fast_position_attention`` is True and the trained logits separate) the row and column
    factors ``(heads, H, H)``, ``(heads, W, W)``. The layer then computes Eq. (6) only."""

    def __init__(self, num_heads, trained, factored=False, **kwargs):
        super().__init__(num_heads, trained, **kwargs)
        self.factored = bool(factored)

    @classmethod
    def from_attention(cls, attention, input_dim, trained, **trained_options):
        if attention.fast_position_attention not in (True, False):
            raise ValueError(f"A layer with a frozen encoding sums densely or separably, decided when it was frozen: "
                             f"fast_position_attention must be True or False, got "
                             f"{attention.fast_position_attention!r}.")
        factored = attention.fast_position_attention is True and get_encoding(trained).separable
        return cls(attention.num_heads, trained, factored, name="position_encoding")

    @classmethod
    def is_separable(cls, trained, **options):
        return get_encoding(trained).separable

    def get_config(self):
        return {**super().get_config(), "factored": self.factored}

    def constant_shapes(self, height, width):
        if self.factored:
            return {"row_probabilities": (self.num_heads, height, height),
                    "col_probabilities": (self.num_heads, width, width)}
        n = height * width
        return {"probabilities": (self.num_heads, n, n)}

    def probability_constants(self):
        return list(self.constants.values())

    def factor_probabilities(self, height, width):
        """The constant factors ``(row (heads, H, H), col (heads, W, W))``."""
        self._check_grid(height, width)
        if not self.factored:
            raise ValueError(f"{self.name} holds dense probabilities, not row and column factors.")
        return aggregation.Factors(self.constants["row_probabilities"], self.constants["col_probabilities"])

    def probabilities(self, height, width, queries=None, keys=None):
        """``(heads, N, N)``: the constant, or the factors multiplied out."""
        self._check_grid(height, width)
        if not self.factored:
            return self.constants["probabilities"]
        return aggregation.multiplied_out(self.factor_probabilities(height, width))


class QueryMajor(FrozenEncoding):
    """A content form that computes in the ``(batch, query, heads, key)`` layout
    (`sa_conv.aggregation.QueryMajorSum`): queries ``(batch, N, heads, d)`` need no transpose, and
    its ``(N, heads, N)`` constants are the trained ``(heads, N, N)`` ones transposed once."""

    position_only = False
    query_major = True

    def set_constants(self, values):
        super().set_constants({name: ops.transpose(value, (1, 0, 2)) if len(value.shape) == 3 else value
                               for name, value in values.items()})


@keras.saving.register_keras_serializable(package="sa_conv")
@register_frozen_form("position_bias")
class FrozenPositionBias(QueryMajor):
    """Content logits plus a position-only term, served from one query-key map and the term
    ``b_h`` as a constant ``position_logits`` ``(N, heads, N)`` (query, head, key)::

        logits_h[q, k] = (x_q M_h + u_h) . x_k / sqrt(D) + b_h[q, k]

    The layer's query map is the folded ``M_h = Wq_h Wk_h^T``, ``u_h = Wk_h bq_h``
    (`sa_conv.serving.fold_query_key`) and it maps no keys (``maps_keys``): the keys are the input
    pixels ``(batch, N, D)``. The logits differ from the trained ones by a constant per query, which
    the softmax of Eq. (5) removes."""

    maps_keys = False

    @classmethod
    def from_attention(cls, attention, input_dim, trained, **trained_options):
        return cls(attention.num_heads, trained, query_dim=input_dim, name="position_encoding")

    def constant_shapes(self, height, width):
        n = height * width
        return {"position_logits": (n, self.num_heads, n)}

    def logits(self, height, width, queries=None, keys=None):
        """``(batch, N, heads, N)`` from queries ``(batch, N, heads, D)`` and the input pixels
        ``(batch, N, D)`` as keys."""
        self._check_grid(height, width)
        n, heads, d = queries.shape[1:]
        # One batched product (batch, N heads, D) x (batch, D, N), not an einsum: runtimes read it
        # as one MatMul (OpenVINO's CPU plugin computes an Einsum through transposes, slower).
        content = ops.matmul(ops.reshape(queries, (-1, n * heads, d)), ops.transpose(keys, (0, 2, 1)))
        content = ops.reshape(ops.cast(content, "float32"), (-1, n, heads, keys.shape[1])) / math.sqrt(d)
        return content + self.constants["position_logits"][None]


@keras.saving.register_keras_serializable(package="sa_conv")
@register_frozen_form("gated")
class FrozenGated(QueryMajor):
    """Gated attention with its positional half computed once::

        P_h = (1 - g_h) softmax_k(q_h . k_h / sqrt(d)) + C_h

    ``positional`` ``C_h = g_h softmax_k(-alpha_h ||delta - Delta_h||^2)`` ``(N, heads, N)`` and
    ``content_weights`` ``1 - g_h`` ``(heads,)`` are constants; the queries and keys are the trained
    maps' (``d`` channels per head: folding them into one ``D x D`` map per head would cost more
    than it saves)."""

    @classmethod
    def from_attention(cls, attention, input_dim, trained, query_dim=None, **trained_options):
        return cls(attention.num_heads, trained, query_dim=query_dim or max(1, input_dim // attention.num_heads),
                   name="position_encoding")

    def constant_shapes(self, height, width):
        n = height * width
        return {"positional": (n, self.num_heads, n), "content_weights": (self.num_heads,)}

    def probability_constants(self):
        return [self.constants["positional"]]

    def gates(self):
        """``g_h``, ``(heads,)``: what the trained encoding's gates were."""
        return 1.0 - self.constants["content_weights"]

    def probabilities(self, height, width, queries=None, keys=None):
        """The mixture ``P`` for queries and keys ``(batch, N, heads, d)``: ``(batch, N, heads, N)``."""
        self._check_grid(height, width)
        content = ops.cast(ops.einsum("bqhd,bkhd->bqhk", queries, keys), "float32") / math.sqrt(queries.shape[-1])
        weights = ops.reshape(self.constants["content_weights"], (1, 1, -1, 1))
        return weights * ops.softmax(content, axis=-1) + self.constants["positional"][None]

