"""The exact separable path of position-only attention, ``O(N (H + W))`` per head and channel.

For an encoding whose logit is a row term plus a column term, ``s(q, k) = r(qi, ki) + c(qj, kj)``
(``"quadratic"``, ``"learned"``, ``"sinusoidal"``), the softmax over all keys of the paper's
Eq. (5) factorizes exactly::

    P(q, k) = softmax_ki(r(qi, .))[ki] * softmax_kj(c(qj, .))[kj]

(each 1-D softmax subtracts its own maximum, so large spreads do not underflow). The sum of
Eq. (6), ``sum_h sum_k P_h(q, k) x_k W^(h)``, is then two 1-D passes, over key columns and then
key rows, with no truncation. `sa_conv.aggregation.SeparableSum` takes this path (chosen by
`sa_conv.aggregation.choose` where `separable_pays`, and when no attention dropout is active); it
gives the dense sum's output to float32 rounding.
Measured speed-ups: ``benchmarks/results/throughput.json``.

Memory: `separable_sum` computes all heads at once, with three ``(batch, N, heads * out)``
intermediates, which autodiff keeps for the gradient (the fastest order). With
``recompute_gradient=True`` (what a rematerialized `TransformerBlock` asks for),
`separable_sum` goes head by head with a custom gradient (`keras.ops.custom_gradient`, on
the TensorFlow and JAX backends) that keeps only its inputs and recomputes each head's two cheap
1-D passes in the backward pass, so neither pass holds more than a few ``(batch, N, max(D, out))``
tensors at a time: slower steps for a peak that grows far less with the grid (measured:
``benchmarks/results/scaling.json``).
"""

import keras
from keras import ops

__all__ = ["separable_pays", "separable_sum"]


def separable_pays(height, width, threshold=4):
    """Whether ``fast_position_attention="auto"`` takes the separable path on an ``H x W`` grid:
    when ``H * W >= threshold * (H + W)``. The default 4 (8x8 and larger) is the size from which
    the separable path measured faster than the dense one in training
    (``benchmarks/results/throughput.json``); a caller whose dense path is cheaper sets its own."""
    return height * width >= threshold * (height + width)


def separable_pays_with_constants(height, width):
    """Whether the separable sum pays on an ``H x W`` grid when the probabilities are constants
    (a serving copy): ``H * W >= 6 (H + W)`` (12x12 and larger). Precomputed probabilities make the
    dense sum cheaper than in training (no logits, no softmax per call), so it pays from a larger
    grid (``benchmarks/results/serving_aggregation.json``)."""
    return separable_pays(height, width, threshold=6)


def _columns(p, v):
    """The column pass: ``p`` ``(Wq, Wk)``, ``v`` ``(batch, H, Wk, C)`` -> ``(batch, H, Wq, C)``."""
    return ops.matmul(p, v)


def _rows(p, v):
    """The row pass: ``p`` ``(Hq, Hk)``, ``v`` ``(batch, Hk, W, C)`` -> ``(batch, Hq, W, C)``."""
    _, height, width, channels = v.shape
    return ops.reshape(ops.matmul(p, ops.reshape(v, (-1, height, width * channels))), (-1, p.shape[0], width, channels))


def _per_head_sum(x, p_row, p_col, kernel):
    """``sum_h R_h (C_h x) W^(h)`` for ``x`` ``(batch, H, W, D)``, ``p_row`` ``(heads, H, H)``,
    ``p_col`` ``(heads, W, W)``, ``kernel`` ``(heads * D, out)``; its gradient keeps only these
    arguments. With ``u_h = C_h x``, ``z_h = R_h u_h``, ``y = sum_h z_h W^(h)`` and ``g = dL/dy``:
    ``dz_h = g W^(h)T``, ``dW^(h) = z_h^T g``, ``dR_h = sum dz_h u_h^T``, ``du_h = R_h^T dz_h``,
    ``dC_h = sum du_h x^T``, ``dx = sum_h C_h^T du_h``. Returns ``(y, grad)`` for
    `keras.ops.custom_gradient`, which wraps it per call (the PyTorch backend has none, so not at
    import)."""
    heads, d = p_row.shape[0], x.shape[-1]
    out = kernel.shape[-1]
    height, width = x.shape[1], x.shape[2]
    maps = [kernel[h * d:(h + 1) * d] for h in range(heads)]
    y = None
    for h in range(heads):
        term = ops.matmul(_rows(p_row[h], _columns(p_col[h], x)), maps[h])
        y = term if y is None else y + term

    def grad(*args, upstream=None):
        g = args[0] if upstream is None else upstream
        g_flat = ops.reshape(g, (-1, out))
        x_t = ops.transpose(x, (0, 1, 3, 2))  # (batch, H, D, W)
        dx, d_rows, d_cols, d_maps = None, [], [], []
        for h in range(heads):
            u = _columns(p_col[h], x)
            z = _rows(p_row[h], u)
            d_maps.append(ops.matmul(ops.transpose(ops.reshape(z, (-1, d))), g_flat))
            dz = ops.matmul(g, ops.transpose(maps[h]))
            d_rows.append(ops.sum(ops.matmul(ops.reshape(dz, (-1, height, width * d)),
                                             ops.transpose(ops.reshape(u, (-1, height, width * d)), (0, 2, 1))), 0))
            du = _rows(ops.transpose(p_row[h]), dz)
            d_cols.append(ops.sum(ops.matmul(du, x_t), (0, 1)))
            dx_h = _columns(ops.transpose(p_col[h]), du)
            dx = dx_h if dx is None else dx + dx_h
        return dx, ops.stack(d_rows), ops.stack(d_cols), ops.concatenate(d_maps, 0)

    return y, grad


def separable_sum(inputs, row_probabilities, col_probabilities, kernel, bias=None, dtype=None,
                  recompute_gradient=False):
    """``sum_h sum_k P_h(q, k) x_k W^(h) + b`` with ``P_h`` = row factor x column factor.

    Args:
      inputs: ``x``, ``(batch, H, W, D)``.
      row_probabilities, col_probabilities: ``(heads, H, H)`` and ``(heads, W, W)``, indexed
        ``[head, query, key]``: the softmax over keys of the encoding's ``factor_logits``.
      kernel: the heads' value maps stacked, ``(heads * D, out)``, rows ordered ``[head, channel]``.
      bias: ``(out,)`` or None.
      dtype: the compute dtype (default: the inputs').
      recompute_gradient: False: all heads at once, differentiated by the backend's autodiff;
        True: head by head, ``y += R_h (C_h x) W^(h)`` with the custom gradient of
        `_per_head_sum`, which keeps only the arguments (see the module doc; on backends without
        ``custom_gradient``, PyTorch, the former).

    Returns:
      ``(batch, H, W, out)``.
    """
    dtype = dtype or inputs.dtype
    if recompute_gradient and keras.backend.backend() in ("tensorflow", "jax"):
        outputs = ops.custom_gradient(_per_head_sum)(ops.cast(inputs, dtype), ops.cast(row_probabilities, dtype),
                                                     ops.cast(col_probabilities, dtype), ops.cast(kernel, dtype))
        return outputs if bias is None else outputs + ops.cast(bias, dtype)
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
