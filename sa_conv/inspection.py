"""Looking inside attention: maps for one query pixel, and locality metrics per layer and head.

Attention probabilities are ``(batch, heads, N, N)`` arrays indexed ``[b, h, query, key]`` with
the ``N = H * W`` grid pixels flattened row-major (what `MultiHeadSelfAttention2D` returns). The
functions here are numpy only.
"""

from __future__ import annotations

import numpy as np


def _as_numpy(x):
    try:
        from keras import ops

        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # already numpy
        return np.asarray(x)


def query_index(query, grid):
    """Flat index of the query pixel ``(row, col)`` on a ``(H, W)`` grid, with a clear error."""
    (row, col), (height, width) = query, grid
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(f"query pixel {tuple(query)} is outside the {height}x{width} attention grid.")
    return int(row) * int(width) + int(col)


def query_maps(probabilities, grid, query):
    """The attention of one query pixel over the key grid.

    Args:
      probabilities: ``(batch, heads, N, N)``.
      grid: ``(H, W)`` with ``H * W = N``.
      query: ``(row, col)``.

    Returns:
      ``(batch, heads, H, W)``: row ``query`` of every head's probabilities, reshaped.
    """
    p = _as_numpy(probabilities)
    height, width = grid
    if p.ndim != 4 or p.shape[-1] != height * width or p.shape[-2] != height * width:
        raise ValueError(f"probabilities of shape {p.shape} do not fit a {height}x{width} grid.")
    return p[:, :, query_index(query, grid), :].reshape(p.shape[0], p.shape[1], height, width)


def interior_queries(grid, margin=None):
    """Flat indices of the pixels at least ``margin`` (default a quarter of the shorter side)
    from every border: where a head's offset target is not cut off by the border."""
    height, width = grid
    margin = min(height, width) // 4 if margin is None else margin
    rows = np.arange(margin, height - margin)
    cols = np.arange(margin, width - margin)
    if not rows.size or not cols.size:
        raise ValueError(f"margin {margin} leaves no query on a {height}x{width} grid.")
    return (rows[:, None] * width + cols[None, :]).reshape(-1)


def locality_metrics(probabilities, grid, queries=None, gates=None):
    """Per head: mean attention distance, mass near the most attended pixel, entropy.

    Args:
      probabilities: ``(batch, heads, N, N)`` of one layer.
      grid: ``(H, W)``.
      queries: flat query indices to average over (default `interior_queries`).
      gates: the layer's per-head gates ``(heads,)`` (`sa_conv.heads.head_gates`), or None.

    Returns:
      A list (one dict per head) with

      * ``mean_distance``: ``sum_k p(k|q) ||k - q||`` in grid pixels;
      * ``mass_3x3``: probability inside the 3x3 neighbourhood of the head's most attended pixel
        (1 for a head that attends to one pixel, like a convolution tap);
      * ``entropy``: ``-sum_k p log p`` in nats (0 for one pixel, ``log N`` for uniform);
      * ``peak_offset``: the mean offset (row, col) of the most attended pixel from the query;
      * ``gate`` (with ``gates``): the head's weight on its positional attention;

      each averaged over the batch and the queries.
    """
    p = _as_numpy(probabilities).astype(np.float64)
    height, width = grid
    queries = interior_queries(grid) if queries is None else np.asarray(queries)
    rows, cols = np.divmod(np.arange(height * width), width)
    q_rows, q_cols = rows[queries], cols[queries]
    p = p[:, :, queries, :]  # (b, heads, Q, N)
    distance = np.sqrt((rows[None, :] - q_rows[:, None]) ** 2 + (cols[None, :] - q_cols[:, None]) ** 2)
    mean_distance = (p * distance).sum(-1)
    entropy = -(p * np.log(np.clip(p, 1e-30, None))).sum(-1)
    peak = p.argmax(-1)  # (b, heads, Q)
    near = (np.abs(rows[peak][..., None] - rows) <= 1) & (np.abs(cols[peak][..., None] - cols) <= 1)
    mass = (p * near).sum(-1)
    offset_rows = (rows[peak] - q_rows).mean(axis=(0, 2))
    offset_cols = (cols[peak] - q_cols).mean(axis=(0, 2))
    if gates is not None and len(gates) != p.shape[1]:
        raise ValueError(f"{len(gates)} gates for {p.shape[1]} heads.")
    return [
        {
            "head": h,
            "mean_distance": float(mean_distance[:, h].mean()),
            "mass_3x3": float(mass[:, h].mean()),
            "entropy": float(entropy[:, h].mean()),
            "peak_offset": [float(offset_rows[h]), float(offset_cols[h])],
            **({} if gates is None else {"gate": float(gates[h])}),
        }
        for h in range(p.shape[1])
    ]


def format_metrics(per_layer) -> str:
    """A text table: one row per (layer, head), with a ``gate`` column when the metrics have gates."""
    gated = any("gate" in m for heads in per_layer for m in heads)
    lines = [f"{'layer':>5} {'head':>4} {'distance':>9} {'mass 3x3':>9} {'entropy':>8} {'peak offset':>13}"
             + (f" {'gate':>6}" if gated else "")]
    for layer, heads in enumerate(per_layer):
        for m in heads:
            dy, dx = m["peak_offset"]
            gate = (f" {m['gate']:>6.3f}" if "gate" in m else f" {'-':>6}") if gated else ""
            lines.append(
                f"{layer:>5} {m['head']:>4} {m['mean_distance']:>9.3f} {m['mass_3x3']:>9.3f} "
                f"{m['entropy']:>8.3f} {f'({dy:+.1f}, {dx:+.1f})':>13}{gate}"
            )
    return "\n".join(lines)
