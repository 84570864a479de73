"""The exact separable path of position-only attention, ``O(N (H + W))`` per head and channel.

For an encoding whose logit is a row term plus a column term, ``s(q, k) = r(qi, ki) + c(qj, kj)``
(``"quadratic"``, ``"learned"``, ``"sinusoidal"``), the softmax over all keys of the paper's
Eq. (5) factorizes exactly::

    P(q, k) = softmax_ki(r(qi, .))[ki] * softmax_kj(c(qj, .))[kj]

(each 1-D softmax subtracts its own maximum, so large spreads do not underflow). The sum of
Eq. (6), ``sum_h sum_k P_h(q, k) x_k W^(h)``, is then two 1-D passes, over key columns and then
key rows, with no truncation. `MultiHeadSelfAttention2D` takes this path when `separable_pays`
and no attention dropout is active; it gives its dense path's output to float32 rounding.
Measured speed-ups: ``benchmarks/results/throughput.json``.
"""

from keras import ops

__all__ = ["separable_attention", "separable_pays", "separable_sum"]


def separable_pays(height, width, constants=False):
    """Whether ``fast_position_attention="auto"`` takes the separable path on an ``H x W`` grid:
    when ``H * W >= 4 * (H + W)`` (8x8 and larger), the size from which the separable path
    measured faster than the dense one in training (``benchmarks/results/throughput.json``).
    With ``constants`` (inference from precomputed probabilities, which makes the dense path
    cheaper): when ``H * W >= 6 * (H + W)`` (12x12 and larger); at 8x8 the dense path measured
    faster at batch 1 and 100 alike (``benchmarks/results/serving_aggregation.json``)."""
    return height * width >= (6 if constants else 4) * (height + width)


def separable_attention(inputs, row_logits, col_logits, kernel, bias=None, dtype=None):
    """``sum_h sum_k P_h(q, k) x_k W^(h) + b`` with ``P_h`` = row factor x column factor.

    Args:
      inputs: ``x``, ``(batch, H, W, D)``.
      row_logits, col_logits: ``(heads, H, H)`` and ``(heads, W, W)``, float32 (the encoding's
        ``factor_logits``), indexed ``[head, query, key]``.
      kernel: the heads' value maps stacked, ``(heads * D, out)``, rows ordered ``[head, channel]``.
      bias: ``(out,)`` or None.
      dtype: the compute dtype (default: the inputs').

    Returns:
      ``(batch, H, W, out)``.

    The order keeps every step a plain (batched) matrix product: the heads' value maps first,
    ``y_h = x W^(h)``; then the column pass for every head; then the row pass with the sum over
    heads folded into its contraction (``K = H * heads``).
    """
    return separable_sum(inputs, ops.softmax(row_logits, axis=-1), ops.softmax(col_logits, axis=-1), kernel, bias,
                         dtype)


def separable_sum(inputs, row_probabilities, col_probabilities, kernel, bias=None, dtype=None):
    """`separable_attention` from the factors' probabilities (softmax of the row and column
    logits over keys, ``(heads, H, H)`` and ``(heads, W, W)``): what inference uses when the
    probabilities are precomputed constants. Same arguments and result otherwise."""
    dtype = dtype or inputs.dtype
    _, height, width, d = inputs.shape
    heads = row_probabilities.shape[0]
    out = kernel.shape[-1]
    p_row = ops.cast(row_probabilities, dtype)  # (heads, Hq, Hk)
    p_col = ops.cast(col_probabilities, dtype)  # (heads, Wq, Wk)
    batch = ops.shape(inputs)[0]
    # W^(h) side by side: (D, heads * out), columns ordered [head, channel].
    kernel = ops.cast(kernel, dtype)
    kernel = ops.reshape(ops.transpose(ops.reshape(kernel, (heads, d, out)), (1, 0, 2)), (d, heads * out))
    y = ops.matmul(ops.reshape(inputs, (-1, d)), kernel)
    y = ops.transpose(ops.reshape(y, (-1, height, width, heads, out)), (0, 1, 3, 2, 4))  # [b, ki, h, kj, e]
    # Columns: (Wq, Wk) @ (Wk, out) for every (example, key row, head).
    t = ops.matmul(ops.broadcast_to(p_col, (batch, height, heads, width, width)), y)  # [b, ki, h, qj, e]
    # Rows and heads in one contraction: [qi, (ki, h)] @ [(ki, h), (qj, e)].
    r = ops.reshape(ops.transpose(p_row, (1, 2, 0)), (height, height * heads))
    outputs = ops.matmul(ops.broadcast_to(r, (batch, height, height * heads)),
                         ops.reshape(t, (-1, height * heads, width * out)))
    outputs = ops.reshape(outputs, (-1, height, width, out))
    if bias is not None:
        outputs = outputs + ops.cast(bias, dtype)
    return outputs
