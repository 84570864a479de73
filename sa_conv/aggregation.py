"""How attention's weighted sum, the paper's Eq. (6), is computed: one object per layer.

``MHSA(X)_q = sum_h sum_k P_h[q, k] X_k W^(h) + b``. `MultiHeadSelfAttention2D` computes the
probabilities ``P`` and hands them to the aggregation `choose` picked when the layer was built:

* `DenseSum`: ``P`` as ``(heads, N, N)`` (position only, shared by the batch) or
  ``(batch, heads, N, N)``. Without dropout, one contraction over keys and one value map of the
  concatenated heads; with attention dropout, a keep-mask drawn from a seed
  (`sa_conv.seeded_dropout`) and the sum taken head by head (no ``(batch, N, heads * D)``
  concatenation). With ``recompute_gradient`` and probabilities shared by the batch, the
  dropped sum's gradient draws the mask again and recomputes one product per head
  (`seeded_dropout.seeded_sum_over_heads`): what a rematerialized block asks for.
* `SeparableSum`: ``P`` as its row and column factors (`Factors`) for encodings whose logits
  separate: the exact ``O(N (H + W))`` sum of `sa_conv.separable`, its gradient by autodiff or,
  with ``recompute_gradient``, recomputed head by head. Attention dropout has masks per
  probability, which only the dense form has: with a dropout seed it takes `DenseSum`'s.
* `ConstantSum`: ``P`` as a serving copy's dense constant ``(heads, N, N)``, the sum one product
  with ``P`` as its right operand, the form runtimes read as a weight: OpenVINO's plugin computes
  it in its own precision (an ``Einsum`` of a constant broadcast over the batch it computes in
  float32), TFLite's dynamic range quantizes it per row of ``P``.
* `MixtureSum`: ``P`` as a `Mixture` (gated attention): ``(1 - g_h) C_h X + G_h X``, a content
  half per example and a positional half shared by the batch, summed without forming the batch's
  ``(batch, heads, N, N)`` mixture (whose gradient reduces that tensor over the batch and for the
  gates); with attention dropout, `DenseSum`'s dropped sum of the mixture.
* `QueryMajorSum`: ``P`` as ``(batch, query, heads, key)``, for encodings that compute in that
  layout (``query_major``: the content serving forms, whose queries then need no transpose).

`choose` is the one rule for which; the layer and the trainer's memory estimate both ask it, and a
serving copy asks it with its own break-even grid (`separable_with_constants`).
"""

from __future__ import annotations

from typing import NamedTuple

from keras import ops

from sa_conv import seeded_dropout, separable

__all__ = ["Aggregation", "ConstantSum", "DenseSum", "Factors", "Mixture", "MixtureSum", "QueryMajorSum",
           "SeparableSum", "choose", "dense_probabilities", "heads_times_pixels", "mixed_out", "multiplied_out",
           "separable_with_constants", "softmax"]


class Factors(NamedTuple):
    """Separable logits or probabilities: ``row`` ``(heads, H, H)`` and ``col`` ``(heads, W, W)``,
    indexed ``[head, query, key]``; ``P[h, (qi, qj), (ki, kj)] = row[h, qi, ki] col[h, qj, kj]``."""

    row: object
    col: object


class Mixture(NamedTuple):
    """Probabilities ``P_h = w_h C_h + G_h`` as their parts: ``content`` ``C`` ``(batch, heads, N, N)``,
    its weights ``content_weights`` ``w`` ``(heads,)`` and ``positional`` ``G`` ``(heads, N, N)``,
    shared by the batch (gated attention: ``w = 1 - g``, ``G = g`` times the positional softmax)."""

    content: object
    content_weights: object
    positional: object


def mixed_out(mixture):
    """A `Mixture` as dense ``(batch, heads, N, N)`` probabilities, in the content part's dtype."""
    content, weights, positional = mixture
    weights, positional = (ops.cast(part, content.dtype) for part in (weights, positional))
    return ops.reshape(weights, (-1, 1, 1)) * content + positional[None]


def softmax(logits):
    """Softmax over keys (Eq. 5) of dense logits, or of each factor: exact for separable logits,
    each 1-D softmax subtracting its own maximum."""
    if isinstance(logits, Factors):
        return Factors(ops.softmax(logits.row, axis=-1), ops.softmax(logits.col, axis=-1))
    return ops.softmax(logits, axis=-1)


def multiplied_out(factors):
    """Separable probabilities `Factors` as dense ``(heads, N, N)``:
    ``P[h, (qi, qj), (ki, kj)] = row[h, qi, ki] col[h, qj, kj]``."""
    row, col = factors
    n = row.shape[1] * col.shape[1]
    return ops.reshape(row[:, :, None, :, None] * col[:, None, :, None, :], (-1, n, n))


def dense_probabilities(probabilities, batch):
    """``(batch, heads, N, N)`` probabilities from any form: factors multiplied out, shared ones
    broadcast over the ``batch``."""
    if isinstance(probabilities, Factors):
        probabilities = multiplied_out(probabilities)
    if isinstance(probabilities, Mixture):
        probabilities = mixed_out(probabilities)
    if len(probabilities.shape) == 3:
        probabilities = ops.broadcast_to(probabilities[None], (batch,) + tuple(probabilities.shape))
    return probabilities


def heads_times_pixels(weights, x):
    """``sum_k P_h[q, k] X_k`` for every head, ``(batch, N, heads, D)``, from ``weights`` ``P``
    ``(batch, heads, N, N)`` (or ``(heads, N, N)``, shared by the batch) and pixels ``X``
    ``(batch, N, D)``: one matrix product with heads and queries as rows. Its gradients are
    products too; an ``einsum`` of the 4-D operands had TensorFlow transpose ``P`` in the
    gradient for the pixels."""
    heads, n, d = weights.shape[-3], weights.shape[-1], x.shape[-1]
    if len(weights.shape) == 4:
        mixed = ops.matmul(ops.reshape(weights, (-1, heads * n, n)), x)  # (batch, heads * N, D)
        return ops.transpose(ops.reshape(mixed, (-1, heads, n, d)), (0, 2, 1, 3))
    pixels = ops.reshape(ops.transpose(x, (1, 0, 2)), (n, -1))  # (N, batch * D)
    mixed = ops.matmul(ops.reshape(weights, (heads * n, n)), pixels)  # (heads * N, batch * D)
    return ops.transpose(ops.reshape(mixed, (heads, n, -1, d)), (2, 1, 0, 3))


def float_kernel(dense):
    """``dense``'s kernel, the float weights its call multiplies by; ValueError for a layer that
    Keras quantized (`keras.Model.quantize`), whose kernel is stored in another form that only
    its own call reads: the paths that take the value map's kernel by hand would compute with it
    unscaled."""
    if dense.quantization_mode is not None:
        raise ValueError(f"{dense.path} is quantized ({dense.quantization_mode}, by keras.Model.quantize): sa_conv's "
                         "attention reads its float kernel. Quantize an exported file instead (sa-conv-export "
                         "--precision=int8).")
    return dense.kernel


def _on_grid(outputs, value_dense, dtype, height, width):
    """Products with the value map's kernel, taken by hand (``out`` channels last), plus its bias, as
    ``(batch, H, W, out)``."""
    if value_dense.use_bias:
        outputs = outputs + ops.cast(value_dense.bias, dtype)
    return ops.reshape(outputs, (-1, height, width, value_dense.units))


class Aggregation:
    """Eq. (6) for a layer: ``__call__(inputs, probabilities, value_dense, dtype, dropout_seed)``
    with ``inputs`` ``(batch, H, W, D)``, ``value_dense`` the heads' stacked value maps (a Dense
    ``heads * D -> out``, rows ordered ``[head, channel]``), and ``dropout_seed`` None or the
    seed of the attention-dropout mask; returns ``(batch, H, W, out)``."""

    #: Whether the rematerialized block may leave the attention out of its recomputation: its
    #: gradient with dropout recomputes what it needs by itself.
    recomputes_dropout_gradient = False

    def takes_factors(self, dropout: bool) -> bool:
        """Whether the probabilities come as `Factors` (``dropout``: a dropout seed is given)."""
        return False

    def scores(self, probabilities, batch):
        """The probabilities as ``return_attention_scores`` gives them, ``(batch, heads, N, N)``."""
        return dense_probabilities(probabilities, batch)

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        raise NotImplementedError


class DenseSum(Aggregation):
    """``sum_h Dropout(P_h) X W^(h) + b`` from dense probabilities (see the module doc)."""

    def __init__(self, dropout_rate=0.0, recompute_gradient=False, shared=True):
        self.rate = float(dropout_rate)
        self.recomputes_dropout_gradient = bool(recompute_gradient and shared and self.rate > 0)

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        _, height, width, d = inputs.shape
        if dropout_seed is None:
            x = ops.reshape(inputs, (-1, height * width, d))
            weights = ops.cast(probabilities, dtype)
            mixed = ops.reshape(heads_times_pixels(weights, x), (-1, height, width, weights.shape[-3] * d))
            return value_dense(mixed)
        x = ops.reshape(ops.cast(inputs, dtype), (-1, height * width, d))
        kernel = ops.cast(float_kernel(value_dense), dtype)
        if self.recomputes_dropout_gradient:
            outputs = seeded_dropout.seeded_sum_over_heads(x, probabilities, kernel, dropout_seed, self.rate, dtype)
        else:
            n = height * width
            keep = seeded_dropout.draw_keep_mask((ops.shape(x)[0], probabilities.shape[-3], n, n), dropout_seed,
                                                 self.rate)
            outputs = seeded_dropout.sum_over_heads(x, probabilities, kernel, keep, self.rate, dtype)
        return _on_grid(outputs, value_dense, dtype, height, width)


class ConstantSum(Aggregation):
    """``sum_h P_h X W^(h) + b`` from a serving copy's constant probabilities ``(heads, N, N)``:
    the pixels ``(batch * D, N)`` times ``P`` key-major, ``(N, heads * N)`` (columns ``[head,
    query]``), one product whose right operand is the constant, then the value map (no dropout)."""

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        if dropout_seed is not None:
            raise ValueError("Constant probabilities serve; they take no attention dropout.")
        _, height, width, d = inputs.shape
        heads, n = probabilities.shape[0], height * width
        x = ops.reshape(ops.transpose(ops.reshape(ops.cast(inputs, dtype), (-1, n, d)), (0, 2, 1)), (-1, n))
        key_major = ops.reshape(ops.transpose(ops.cast(probabilities, dtype), (2, 0, 1)), (n, heads * n))
        mixed = ops.transpose(ops.reshape(ops.matmul(x, key_major), (-1, d, heads, n)), (0, 3, 2, 1))
        return value_dense(ops.reshape(mixed, (-1, height, width, heads * d)))


class MixtureSum(Aggregation):
    """``sum_h (w_h C_h + G_h) X W^(h) + b`` from a `Mixture`: ``(C_h X) (w_h W^(h)) + (G_h X)
    W^(h)``, the content product per example, the positional one shared by the batch; with a
    dropout seed, `DenseSum`'s dropped sum of the mixture."""

    def __init__(self, dropout_rate=0.0, recompute_gradient=False):
        self.dropped = DenseSum(dropout_rate, recompute_gradient, shared=False)

    def takes_factors(self, dropout):
        return not dropout

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        if dropout_seed is not None:
            return self.dropped(inputs, probabilities, value_dense, dtype, dropout_seed)
        _, height, width, d = inputs.shape
        content, weights, positional = (ops.cast(part, dtype) for part in probabilities)
        heads = positional.shape[0]
        x = ops.reshape(ops.cast(inputs, dtype), (-1, height * width, d))
        kernel = ops.cast(float_kernel(value_dense), dtype)
        # w_h scales head h's rows of the value map: its gradient is then a sum over the kernel,
        # not over every pixel of the batch.
        scaled = ops.reshape(ops.reshape(kernel, (heads, d, -1)) * ops.reshape(weights, (-1, 1, 1)), (heads * d, -1))
        outputs = (ops.matmul(ops.reshape(heads_times_pixels(content, x), (-1, heads * d)), scaled)
                   + ops.matmul(ops.reshape(heads_times_pixels(positional, x), (-1, heads * d)), kernel))
        return _on_grid(outputs, value_dense, dtype, height, width)


class QueryMajorSum(Aggregation):
    """``sum_h P_h X W^(h) + b`` from probabilities ``(batch, query, heads, key)``: the layout in
    which a content form computes its logits from untransposed queries ``(batch, N, heads, d)``
    and the sum needs no transpose either (a serving copy: no dropout)."""

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        if dropout_seed is not None:
            raise ValueError("Query-major probabilities serve; they take no attention dropout.")
        _, height, width, d = inputs.shape
        _, n, heads, keys = probabilities.shape
        x = ops.reshape(ops.cast(inputs, dtype), (-1, height * width, d))
        # (batch, N heads, N) x (batch, N, D), one MatMul for runtimes (OpenVINO's CPU plugin
        # computes an einsum through transposes, slower).
        mixed = ops.matmul(ops.reshape(ops.cast(probabilities, dtype), (-1, n * heads, keys)), x)
        return value_dense(ops.reshape(mixed, (-1, height, width, heads * d)))

    def scores(self, probabilities, batch):
        return ops.transpose(probabilities, (0, 2, 1, 3))


class SeparableSum(Aggregation):
    """The exact separable sum from `Factors` of the probabilities (`sa_conv.separable`); with a
    dropout seed, `DenseSum`'s dropped sum from the factors multiplied out."""

    def __init__(self, dropout_rate=0.0, recompute_gradient=False):
        self.recompute_gradient = bool(recompute_gradient)
        self.dropped = DenseSum(dropout_rate, recompute_gradient)
        self.recomputes_dropout_gradient = self.dropped.recomputes_dropout_gradient

    def takes_factors(self, dropout):
        return not dropout

    def __call__(self, inputs, probabilities, value_dense, dtype, dropout_seed=None):
        if dropout_seed is not None:
            return self.dropped(inputs, probabilities, value_dense, dtype, dropout_seed)
        bias = value_dense.bias if value_dense.use_bias else None
        return separable.separable_sum(inputs, *probabilities, float_kernel(value_dense), bias, dtype,
                                       recompute_gradient=self.recompute_gradient)


def separable_with_constants(encoding, fast_position_attention, grid) -> bool:
    """Whether attention with the registered ``encoding`` sums separably on ``grid`` ``(H, W)`` once
    its probabilities are constants (a serving copy): `choose`'s rule with
    `separable.separable_pays_with_constants`. ValueError for a grid that is not static."""
    if grid is None or None in tuple(grid):
        raise ValueError(f"A serving copy holds constants for one grid: give the model input a fixed spatial shape "
                         f"(got a {grid} grid).")
    return choose(encoding, fast_position_attention, tuple(grid),
                  pays=separable.separable_pays_with_constants).takes_factors(dropout=False)


def choose(encoding, fast_position_attention="auto", grid=None, dropout_rate=0.0, recompute_gradient=False,
           pays=separable.separable_pays) -> Aggregation:
    """The aggregation of attention with the registered ``encoding`` (its spec) on a ``grid``
    ``(H, W)`` (None: assume the separable sum pays): `SeparableSum` for a position-only encoding
    whose logits separate, with ``fast_position_attention`` True, or ``"auto"`` where ``pays(H, W)``
    (default `separable.separable_pays`, measured in training); `ConstantSum` for other frozen
    position-only probabilities; `QueryMajorSum` for an encoding that computes query-major;
    `MixtureSum` for one whose probabilities are a `Mixture`; `DenseSum` otherwise."""
    if encoding.query_major:
        return QueryMajorSum()
    separable_form = (bool(fast_position_attention) and encoding.position_only and encoding.separable
                      and not (fast_position_attention == "auto" and grid is not None and not pays(*grid)))
    if separable_form:
        return SeparableSum(dropout_rate, recompute_gradient)
    if encoding.serves_only and encoding.position_only:
        return ConstantSum()
    if encoding.mixes:
        return MixtureSum(dropout_rate, recompute_gradient)
    return DenseSum(dropout_rate, recompute_gradient, shared=encoding.position_only)
