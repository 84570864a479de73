"""Figures of attention: maps per layer and head, centers of attention, locality metrics.
The command line is ``sa-conv-visualize`` (`programs.visualize`).

The figures, each a matplotlib `Figure` (PNG bytes: `figure_png`); ``sa-conv-visualize``
(`programs.visualize.write_figures`) writes them to its output folder:

* ``attention_image<i>.png``: one row per layer, one column per head, each cell the attention
  probabilities of the query pixel over the key grid (query marked), with the input image and
  the query's pixels marked beside them; ``attention_mean.png``: the same averaged over images
  (for position-only encodings every image gives the same maps).
* ``centers.png`` (Gaussian encodings, those whose ``gaussian()`` is not None): per layer, each head's center ``Delta_h`` around the
  query pixel and its 50% and 90% probability-mass contours (the paper's Figure 3).
* ``locality.json`` and a printed table: per layer and head, the mean attention distance, the
  mass in the 3x3 neighbourhood of the most attended pixel, and the entropy.
"""

from __future__ import annotations

import io

# matplotlib's object-oriented API (Figure, not pyplot): no backend to choose, so importing this
# module leaves the process's matplotlib backend alone, and figures render without a display.
import matplotlib
import matplotlib.patches as mpatches
import numpy as np
from keras import ops
from matplotlib.figure import Figure

from sa_conv.models import attention_blocks, attention_grid, attention_probabilities

CELL_INCHES = 1.6
DPI = 80
# A map's colour scale tops at its peak, but at no less than this many times its mean (uniform
# attention's 1/N for probabilities): scaled to its own peak, a flat map would be drawn saturated, as
# if the head attended to every key strongly.
SCALE_FLOOR = 4.0
# Below this many times its mean at its peak, a head attends nowhere in particular (a wide Gaussian
# of the paper's Eq. 9 peaks at several times 1/N over a 16x16 grid; one with alpha near 0 at 1/N).
NEAR_UNIFORM = 2.0


def scale_top(query_map) -> float:
    """The top of ``query_map``'s colour scale (``(H, W)`` probabilities of one query, summing to 1
    up to their rounding): its peak, or `SCALE_FLOOR` times its mean if higher."""
    query_map = np.asarray(query_map)
    return float(max(query_map.max(), SCALE_FLOOR * query_map.mean(), 1e-9))


def near_uniform(query_map) -> bool:
    """Whether ``query_map`` (``(H, W)`` probabilities of one query) peaks below `NEAR_UNIFORM`
    times its mean (uniform attention's 1/N; the mean, not 1/N, so that maps rounded to a few
    decimals are judged on their own level): a head with no place it attends to, whose drawn
    center (a Gaussian's ``Delta_h``) says nothing about where it looks."""
    query_map = np.asarray(query_map)
    return bool(query_map.max() < NEAR_UNIFORM * query_map.mean())


def model_attention(model, images):
    """Per layer ``(batch, heads, N, N)`` numpy probabilities."""
    return [np.asarray(ops.convert_to_numpy(p)) for p in attention_probabilities(model, images)]


def attention_grid_figure(maps, query, image=None, pooling=1, title=""):
    """Rows = layers, columns = heads (+ a first column with the input image). Each head's map
    is drawn from 0 to `scale_top` (its peak, or `SCALE_FLOOR` times its mean for a map that
    peaks lower, then drawn pale), its peak probability written under it.

    Args:
      maps: ``(layers, heads, H, W)`` probabilities of the query pixel.
      query: ``(row, col)`` on the attention grid.
      image: optional uint8 ``(H * pooling, W * pooling, 3)``.
    """
    maps = np.asarray(maps)
    layers, heads, height, width = maps.shape
    cols = heads + 1
    fig = Figure(figsize=(CELL_INCHES * cols, CELL_INCHES * layers + 0.6), dpi=DPI)
    axes = fig.subplots(layers, cols, squeeze=False)
    for layer in range(layers):
        ax = axes[layer, 0]
        ax.axis("off")
        if image is not None and layer == 0:
            ax.imshow(image if image.shape[-1] == 3 else image[..., 0], cmap=None if image.shape[-1] == 3 else "gray")
            r, c = query
            ax.add_patch(mpatches.Rectangle((c * pooling - 0.5, r * pooling - 0.5), pooling, pooling,
                                            fill=False, edgecolor="red", linewidth=1.5))
            ax.set_title("input, query", fontsize=8)
        for head in range(heads):
            ax = axes[layer, head + 1]
            ax.imshow(maps[layer, head], cmap="Blues", vmin=0, vmax=scale_top(maps[layer, head]))
            ax.scatter([query[1]], [query[0]], marker="s", s=18, facecolors="none", edgecolors="red", linewidths=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel(f"peak {maps[layer, head].max():.2g}", fontsize=7, labelpad=2)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.suptitle(title or f"attention of query pixel {tuple(query)} (red square) over keys", fontsize=10)
    fig.tight_layout()
    return fig


def contour_ellipse(center, inverse_covariance, mass):
    """Ellipse (as a patch) holding ``mass`` of a 2-D Gaussian with precision matrix
    ``inverse_covariance`` (rows, cols): ``(d - c)^T S^-1 (d - c) = -2 ln(1 - mass)``."""
    radius2 = -2.0 * np.log(1.0 - mass)
    covariance = np.linalg.pinv(inverse_covariance + 1e-9 * np.eye(2))
    values, vectors = np.linalg.eigh(covariance)
    values = np.clip(values, 1e-12, None)
    # Plot coordinates are (x = col, y = row).
    angle = np.degrees(np.arctan2(vectors[0, 1], vectors[1, 1]))
    return mpatches.Ellipse((center[1], center[0]), 2 * np.sqrt(radius2 * values[1]), 2 * np.sqrt(radius2 * values[0]),
                            angle=angle, fill=False)


def has_centers(model) -> bool:
    """Whether every attention layer of ``model`` has Gaussian heads with centers to draw."""
    blocks = attention_blocks(model)
    return bool(blocks) and all(b.attention.position_encoding.gaussian() is not None for b in blocks)


def centers_figure(model, query):
    """Per layer: every head's center of attention around ``query`` with its 50% and 90%
    probability-mass contours (the continuous Gaussian's), for Gaussian encodings."""
    if not has_centers(model):
        raise ValueError("centers_figure needs a model whose encodings have centers (quadratic encodings).")
    blocks = attention_blocks(model)
    gaussians = [b.attention.position_encoding.gaussian() for b in blocks]
    (height, width), _ = attention_grid(model)
    fig = Figure(figsize=(3.0 * len(blocks), 3.4), dpi=DPI)
    axes = fig.subplots(1, len(blocks), squeeze=False)
    colors = matplotlib.colormaps["tab10"]
    for layer, (ax, (centers, precisions)) in enumerate(zip(axes[0], gaussians)):
        centers = np.asarray(ops.convert_to_numpy(centers))
        precisions = np.asarray(ops.convert_to_numpy(precisions))
        ax.add_patch(mpatches.Rectangle((-0.5, -0.5), width, height, fill=False, edgecolor="0.7"))
        for h, center in enumerate(centers):
            target = np.array(query, float) + center
            color = colors(h % 10)
            precision = precisions[h]
            for mass, style in ((0.5, "-"), (0.9, ":")):
                patch = contour_ellipse(target, precision, mass)
                patch.set_edgecolor(color)
                patch.set_linestyle(style)
                ax.add_patch(patch)
            ax.plot(target[1], target[0], "o", color=color, markersize=4, label=f"head {h}")
        ax.plot(query[1], query[0], "kx", markersize=8)
        ax.set_xlim(-1.5, width + 0.5)
        ax.set_ylim(height + 0.5, -1.5)  # rows grow downwards, as in images
        ax.set_aspect("equal")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("column", fontsize=8)
        ax.set_ylabel("row", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, -1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"centers of attention around query {tuple(query)} (x); contours: 50% (solid), 90% (dotted) mass",
                 fontsize=9)
    fig.tight_layout()
    return fig


def image_grid_figure(images, titles, columns: int = 8, title=""):
    """A grid of ``images`` (``(n, H, W, C)`` pixels in [0, 255], uint8 or float), each with its
    title (e.g. its label), ``columns`` to a row."""
    rows = -(-len(images) // columns)
    fig = Figure(figsize=(1.6 * columns, 1.8 * rows))
    for i, (image, caption) in enumerate(zip(images, titles)):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.imshow(np.clip(np.asarray(image, np.float32), 0, 255).astype(np.uint8).squeeze())
        ax.set_title(caption, fontsize=7)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def figure_png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
