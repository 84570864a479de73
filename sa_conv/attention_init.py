"""How attention starts: one object per initialization, applied once when a layer is built.

* `RandomInit` (``"random"``): the encodings' own initializers, as before.
* `ConvolutionalInit` (``"convolutional"``): Theorem 1's construction as an initialization. Head
  ``h`` of ``N_h`` starts attending to one shift ``Delta_h`` of the ``K x K`` grid
  (``K = ceil(sqrt(N_h))``, `grid_shifts`) with logits ``-alpha ||delta - Delta_h||^2`` (Eq. 9 with
  the centers on the grid, ``alpha`` the *locality strength*): at a large ``alpha`` each head
  attends to the one pixel at its shift, so the layer computes a ``K x K`` convolution whose
  taps are the heads' value maps (Lemma 1). ConViT's "locality strength" initialization
  (d'Ascoli et al., 2021) is this with ``alpha = 1``. Every position-only encoding takes it
  through its ``initialize_convolutional`` hook: set exactly where its weights can represent
  the pattern (quadratic, learned tables, sinusoidal features), fitted where they cannot (the
  MLP's, see `MLPRelativeEncoding.initialize_convolutional`).
* `MimeticInit` (``"mimetic"``): Trockman & Kolter (ICML 2023): each head's query-key product
  ``W_q,h W_k,h^T`` starts at ``alpha Z + beta I`` (``Z ~ N(0, 1/D)``), so content attention
  starts near "attend to pixels like me" instead of uniform; for encodings with query and key
  maps (content attention). The layer has no per-head value map, so their value-projection half
  does not apply.

`get_attention_init` is the one place a name becomes an object; `MultiHeadSelfAttention2D`
applies it at the end of ``build`` (and a `.keras` file's weights then replace it on load).
"""

from __future__ import annotations

import math
import random

import numpy as np
from keras import ops

from sa_conv.encodings import ENCODINGS
# The encodings own the pattern they are set to; it is named here too, beside the initialization.
from sa_conv.encodings.base import convolutional_logits

__all__ = ["ATTENTION_INITS", "AttentionInit", "ConvolutionalInit", "MimeticInit", "RandomInit", "convolutional_logits",
           "get_attention_init", "grid_shifts"]

ATTENTION_INITS = ("random", "convolutional", "mimetic")


def grid_shifts(num_heads: int, spacing: float = 1.0) -> np.ndarray:
    """The shifts ``Delta_h`` of a ``K x K`` convolution, ``K = ceil(sqrt(num_heads))``, as
    ``(num_heads, 2)`` float32 (row, col) offsets in grid pixels times ``spacing``, heads in
    row-major order of the grid. When ``num_heads`` is not a square, the heads take the
    ``num_heads`` grid points nearest its middle.

    >>> grid_shifts(9)[:3].tolist()
    [[-1.0, -1.0], [-1.0, 0.0], [-1.0, 1.0]]
    """
    if int(num_heads) < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}.")
    size = math.isqrt(int(num_heads) - 1) + 1
    axis = np.arange(size) - (size - 1) // 2
    points = np.array([(i, j) for i in axis for j in axis], np.float64)
    distance = np.abs(points - (axis[0] + axis[-1]) / 2).sum(-1)
    nearest = np.sort(np.argsort(distance, kind="stable")[:num_heads])
    return (points[nearest] * spacing).astype(np.float32)


class AttentionInit:
    """An initialization of `MultiHeadSelfAttention2D`: ``check(spec)`` raises ValueError for an
    encoding it cannot start (naming what can), ``apply(layer)`` sets a built layer's weights."""

    name = "random"

    def check(self, spec) -> None:
        """Raises ValueError when the encoding ``spec`` (an `EncodingSpec`) cannot start this way."""

    def apply(self, layer) -> None:
        """Sets the weights of the built ``layer``."""


class RandomInit(AttentionInit):
    """The encodings' and maps' own initializers."""


class ConvolutionalInit(AttentionInit):
    """Every head at one shift of the ``K x K`` grid (`grid_shifts` times ``spacing``) with
    locality strength ``strength`` (the ``alpha`` of Eq. 9), through the encoding's
    ``initialize_convolutional(shifts, strength, max_offset)``."""

    name = "convolutional"

    def __init__(self, strength: float = 1.0, spacing: float = 1.0):
        if not float(strength) > 0:
            raise ValueError(f"locality_strength must be positive, got {strength}.")
        if not float(spacing) > 0:
            raise ValueError(f"locality_distance must be positive, got {spacing}.")
        self.strength, self.spacing = float(strength), float(spacing)

    def check(self, spec):
        if not spec.cls.convolutional_init:
            able = [name for name, s in ENCODINGS.items() if s.cls.convolutional_init]
            raise ValueError(f"attention_init='convolutional' needs an encoding with a positional pattern to set; "
                             f"{spec.name!r} has none. Use one of {', '.join(able)}, or attention_init='random'"
                             + (" or 'mimetic'" if not spec.position_only else "") + ".")

    def apply(self, layer):
        shifts = grid_shifts(layer.num_heads, self.spacing)
        layer.position_encoding.initialize_convolutional(shifts, self.strength, max_offset=layer.max_grid_size - 1)


class MimeticInit(AttentionInit):
    """``W_q,h W_k,h^T = alpha Z_h + beta I`` per head (Trockman & Kolter's Eq. 2, their
    ``alpha = beta = 0.7``), from the SVD ``U S V^T`` of the target: ``W_q,h = U sqrt(S)``,
    ``W_k,h = V sqrt(S)`` (their first ``d`` columns when a head's queries have ``d < D``
    channels: the best rank-``d`` product)."""

    name = "mimetic"

    def __init__(self, alpha: float = 0.7, beta: float = 0.7, seed=None):
        self.alpha, self.beta, self.seed = float(alpha), float(beta), seed

    def check(self, spec):
        if spec.position_only:
            raise ValueError(f"attention_init='mimetic' starts the query and key maps of content attention; "
                             f"{spec.name!r} is position only and has none. Use 'convolutional' or 'random'.")

    def apply(self, layer):
        dim, heads = layer.input_dim, layer.num_heads
        d = layer.query_dense.units // heads
        # Unseeded, as Keras's initializers: a seed from Python's random, which
        # keras.utils.set_random_seed sets.
        rng = np.random.default_rng(self.seed if self.seed is not None else random.randint(1, 10**9))
        queries, keys = [], []
        for _ in range(heads):
            target = self.alpha * rng.normal(0.0, 1.0 / math.sqrt(dim), (dim, dim)) + self.beta * np.eye(dim)
            u, s, vt = np.linalg.svd(target)
            root = np.sqrt(s[:d])
            queries.append(u[:, :d] * root)
            keys.append(vt.T[:, :d] * root)
        for dense, kernels in ((layer.query_dense, queries), (layer.key_dense, keys)):
            dense.kernel.assign(ops.cast(np.concatenate(kernels, axis=1), dense.kernel.dtype))
            if dense.use_bias:
                dense.bias.assign(np.zeros(dense.bias.shape, np.float32))


def get_attention_init(name: str = "random", locality_strength: float = 1.0, locality_distance: float = 1.0,
                       seed=None) -> AttentionInit:
    """The initialization named ``name`` (`ATTENTION_INITS`); ValueError listing them otherwise."""
    if name == "random":
        return RandomInit()
    if name == "convolutional":
        return ConvolutionalInit(locality_strength, locality_distance)
    if name == "mimetic":
        return MimeticInit(seed=seed)
    raise ValueError(f"attention_init must be one of {', '.join(ATTENTION_INITS)}, got {name!r}.")
