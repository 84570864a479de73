"""The interface every relative positional encoding implements, and the registry of encodings.

Pixels of an ``H x W`` grid are flattened row-major: pixel ``(i, j)`` has index ``i * W + j``.
For a query pixel ``q`` and a key pixel ``k`` the relative offset is
``delta = k - q = (dy, dx)`` (row offset, column offset), in pixels of the grid.

An encoding is a `RelativeEncoding` subclass registered under a name with `register_encoding`;
`MultiHeadSelfAttention2D(encoding=NAME)`, the presets, the FLOP counts, the trainer's XLA
default, the plots and the separable fast path all ask the registered class, never its name.
Adding an encoding is one class in one file plus its ``@register_encoding`` line.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping

import keras
import numpy as np
from keras import ops

from sa_conv import aggregation


def relative_offsets(height, width):
    """Offsets ``k - q`` between all grid pixels.

    Returns:
      ``(dy, dx)``: two float32 numpy arrays of shape ``(H*W, H*W)``, indexed ``[query, key]``.
    """
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    rows, cols = rows.reshape(-1), cols.reshape(-1)
    dy = rows[None, :] - rows[:, None]
    dx = cols[None, :] - cols[:, None]
    return dy.astype(np.float32), dx.astype(np.float32)


def axis_offsets(size):
    """``(size, size)`` float32 offsets ``k - q`` of 1-D positions, indexed ``[query, key]``."""
    positions = np.arange(size, dtype=np.float32)
    return positions[None, :] - positions[:, None]


def relative_indices(size, max_size):
    """``(size, size)`` int32 table of ``k - q + max_size - 1`` for 1-D positions, in
    ``[0, 2 * max_size - 2]``: the row of an embedding table of length ``2 * max_size - 1``."""
    positions = np.arange(size)
    return (positions[None, :] - positions[:, None] + max_size - 1).astype(np.int32)


def check_table_bound(height, width, max_grid_size, layer):
    """Raises ValueError when a grid has offsets beyond a learned table of ``2P - 1`` rows."""
    if height > max_grid_size or width > max_grid_size:
        raise ValueError(
            f"{layer}: the attention grid is {height}x{width} but the learned relative "
            f"embedding tables cover offsets up to max_grid_size={max_grid_size} pixels. Build "
            f"the layer with max_grid_size >= {max(height, width)}."
        )


class RelativeEncoding(keras.layers.Layer):
    """Base class of the relative positional encodings of `MultiHeadSelfAttention2D`.

    What every encoding provides:

    * ``logits(height, width, queries=None, keys=None)``: the attention logits. Position-only
      encodings (``position_only = True``) ignore ``queries`` and ``keys`` and
      return ``(heads, H*W, H*W)``, shared by the batch. Content-based encodings take the
      per-head queries and keys ``(batch, heads, H*W, d)`` that the attention layer computes
      (it builds its ``query`` and ``key`` maps only for them) and return
      ``(batch, heads, H*W, H*W)``, content term and scaling included. Separable encodings
      may leave it out: the default builds it from ``factor_logits``.
    * ``separable`` and ``factor_logits(height, width)``: whether the logits are a row term
      plus a column term, ``logit(q, k) = row[h, qi, ki] + col[h, qj, kj]``, and those terms
      ``(heads, H, H)``, ``(heads, W, W)``. The exact separable attention path uses them.
    * ``has_position_bias`` and ``position_logits(height, width)``: whether the logits of a
      content encoding are ``q . k / sqrt(d)`` plus a position-only term, and that term
      ``(heads, H*W, H*W)``. A layer frozen for serving then holds the term as a constant and
      folds its query and key maps into one (the ``position_bias`` serving form).
    * ``logits_flops(height, width, num_heads, input_dim, **options)`` (classmethod): the
      FLOPs per example of the logits that depend on the input (0 for position-only ones,
      whose logits are computed once per batch).
    * ``gaussian()``: ``(centers (heads, 2), precision (heads, 2, 2))`` for encodings that are
      a Gaussian around a center per head (plots draw them), else None.
    * ``convolutional_init`` and ``initialize_convolutional(shifts, strength, max_offset)``:
      whether the encoding can start as Theorem 1's convolution, and setting its weights so that
      head ``h``'s logits start as ``-strength ||delta - shifts[h]||^2`` for offsets up to
      ``max_offset`` pixels (`sa_conv.attention_init.ConvolutionalInit`).
    * ``probabilities(height, width, queries=None, keys=None)``: Eq. (5)'s softmax of `logits`
      over keys; an encoding that mixes probabilities (the gated one) overrides it instead.
    * ``gates()``: per-head gates in ``[0, 1]`` of an encoding that mixes two attentions, ``(heads,)``
      (the locality table and TensorBoard show them), else None.
    * ``serving_form(**options)`` (classmethod) and ``frozen_constants(height, width, factored)``:
      the name of the frozen encoding that serves this one (`register_frozen_form`; None: served
      as trained) and the constants it holds, computed once from the trained weights. Position-only
      encodings are served by ``"probabilities"`` (Eq. 5's probabilities, dense or as the row and
      column factors), content logits with a position bias by ``"position_bias"`` (the bias as a
      constant, the query and key maps folded into one); `get_encoding("frozen:NAME")` is the
      frozen encoding of ``NAME`` (`sa_conv.encodings.frozen`).
    * ``maps_keys``, ``serves_only`` and ``query_major``: whether the attention layer maps the
      keys (False: the keys are the input pixels, as a folded query-key map reads them), whether
      the encoding is a frozen one, which serves and does not train, and whether it takes queries
      and keys ``(batch, N, heads, d)`` and returns probabilities ``(batch, N, heads, N)``
      (query, head, key: `sa_conv.aggregation.QueryMajorSum` sums them without a transpose).
    * ``factor_probabilities(height, width)``: the softmax of each of `factor_logits`; for an
      encoding that ``mixes``, ``factor_probabilities(height, width, queries, keys)``: its
      probabilities as a `sa_conv.aggregation.Mixture` of a per-example and a shared part
      (`sa_conv.aggregation.MixtureSum` sums them without forming ``P``).
    * ``probability_constants()``: a frozen encoding's variables that hold attention probabilities
      (the int8 ONNX route keeps their products float32); none for the others.
    * ``build(input_shape)``: Keras's; the attention layer passes its input shape
      ``(batch, H, W, D)`` (frozen encodings size their constants by its grid).
    * ``no_weight_decay()``: the encoding's variables that take no weight decay (default none;
      what `sa_conv.no_weight_decay` collects for the trainer, as timm's ``no_weight_decay()``).
    * ``from_attention(attention, input_dim, **options)`` (classmethod): the encoding for an
      attention layer, from its hyperparameters (``options``: the registered ones plus the
      layer's ``encoding_options``); ``check_model(...)`` (classmethod): raises
      ValueError for a model configuration the encoding cannot serve (with ``offset_tables``, an
      encoding whose weights are tables over offsets up to ``max_grid_size``: a larger grid).

    An encoding's weights and position terms are float32: its ``dtype`` policy is pinned and its
    weights are never autocast, so the position-only logits and softmax stay in float32 under mixed
    precision. The per-example content logits take the queries' dtype (the attention layer's
    compute dtype).
    """

    position_only = True
    convolutional_init = False
    maps_keys = True
    serves_only = False
    query_major = False
    mixes = False
    offset_tables = False

    def __init__(self, **kwargs):
        kwargs["dtype"] = "float32"  # position terms in float32, also under mixed precision
        super().__init__(**kwargs)

    # ---------------------------------------------------------------- the interface

    @classmethod
    def from_attention(cls, attention, input_dim, **options):
        raise NotImplementedError

    @classmethod
    def check_model(cls, *, grid_size, hidden_size, max_grid_size, **options) -> None:
        """Raises ValueError naming the fix when a model of this shape cannot use the encoding."""
        if cls.offset_tables and grid_size > max_grid_size:
            raise ValueError(f"The attention grid is {grid_size}x{grid_size} but max_grid_size is {max_grid_size}; "
                             f"set max_grid_size >= {grid_size}.")

    @classmethod
    def is_separable(cls, **options) -> bool:
        return False

    @classmethod
    def is_position_bias(cls, **options) -> bool:
        return False

    @classmethod
    def logits_flops(cls, height, width, num_heads, input_dim, **options) -> int:
        return 0

    @classmethod
    def serving_form(cls, **options):
        if cls.position_only:
            return "probabilities"
        return "position_bias" if cls.is_position_bias(**options) else None

    @property
    def separable(self) -> bool:
        return type(self).is_separable(**self.options)

    @property
    def has_position_bias(self) -> bool:
        return type(self).is_position_bias(**self.options)

    @property
    def options(self) -> dict:
        """The registered options this instance was made with (see `EncodingSpec`)."""
        return {}

    def logits(self, height, width, queries=None, keys=None):
        """Separable encodings get their dense logits from their factors:
        ``logit(q, k) = row[qi, ki] + col[qj, kj]``, ``(heads, H*W, H*W)``."""
        if not self.separable:
            raise NotImplementedError(f"{type(self).__name__} must define logits().")
        row, col = self.factor_logits(height, width)
        n = height * width
        return ops.reshape(row[:, :, None, :, None] + col[:, None, :, None, :], (-1, n, n))

    def factor_logits(self, height, width):
        raise ValueError(f"{type(self).__name__} logits do not separate into row and column terms.")

    def probabilities(self, height, width, queries=None, keys=None):
        """Eq. (5): the softmax over keys of `logits`, in their dtype."""
        return ops.softmax(self.logits(height, width, queries, keys), axis=-1)

    def factor_probabilities(self, height, width):
        """The probabilities of a separable encoding as ``(row (heads, H, H), col (heads, W, W))``:
        each 1-D softmax of `factor_logits` (exact: ``P = row[qi, ki] col[qj, kj]``)."""
        return aggregation.softmax(aggregation.Factors(*self.factor_logits(height, width)))

    def frozen_constants(self, height, width, factored=False) -> dict:
        """What the serving form holds, by name: for position-only encodings ``probabilities``
        ``(heads, N, N)``, or with ``factored`` ``row_probabilities`` ``(heads, H, H)`` and
        ``col_probabilities`` ``(heads, W, W)``; for content logits with a position bias the bias,
        ``position_logits`` ``(heads, N, N)``."""
        if self.has_position_bias:
            return {"position_logits": self.position_logits(height, width)}
        if not self.position_only:
            raise ValueError(f"{type(self).__name__} is served as trained: it has no frozen constants.")
        if factored:
            return dict(zip(("row_probabilities", "col_probabilities"), self.factor_probabilities(height, width)))
        return {"probabilities": self.probabilities(height, width)}

    def initialize_convolutional(self, shifts, strength, max_offset):
        raise ValueError(f"{type(self).__name__} has no convolutional initialization.")

    def gates(self):
        return None

    def position_logits(self, height, width):
        raise ValueError(f"{type(self).__name__} logits are not content logits plus a position-only term.")

    def gaussian(self):
        return None

    def gaussian_weights(self) -> list:
        """The variables of the Gaussian heads, each indexed by head first (centers, spreads): what
        `sa_conv.reset_heads` redraws; none here."""
        return []

    def no_weight_decay(self) -> list:
        return []

    def probability_constants(self) -> list:
        """The variables of a frozen encoding that hold attention probabilities (none here)."""
        return []


@dataclasses.dataclass(frozen=True)
class EncodingSpec:
    """A registered encoding: its name, class and the fixed options the name stands for."""

    name: str
    cls: type
    options: Mapping = dataclasses.field(default_factory=dict)

    @property
    def position_only(self) -> bool:
        return self.cls.position_only

    @property
    def separable(self) -> bool:
        return self.cls.is_separable(**self.options)

    @property
    def has_position_bias(self) -> bool:
        return self.cls.is_position_bias(**self.options)

    def create(self, attention, input_dim) -> RelativeEncoding:
        """The encoding of ``attention``, with its ``encoding_options`` (e.g. the MLP's width)."""
        extra = dict(getattr(attention, "encoding_options", None) or {})
        clash = sorted(set(extra) & set(self.options))
        if clash:
            raise ValueError(f"encoding_options {clash} are fixed by the encoding name {self.name!r}.")
        try:
            return self.cls.from_attention(attention, input_dim, **self.options, **extra)
        except TypeError as exc:
            raise ValueError(f"encoding {self.name!r} does not take encoding_options {sorted(extra)} ({exc}).") from None

    def check_model(self, **shape) -> None:
        self.cls.check_model(**shape, **self.options)

    def logits_flops(self, height, width, num_heads, input_dim) -> int:
        return self.cls.logits_flops(height, width, num_heads, input_dim, **self.options)

    @property
    def serving_form(self):
        """The name of the frozen encoding that serves this one, or None (served as trained)."""
        return self.cls.serving_form(**self.options)

    @property
    def query_major(self) -> bool:
        return self.cls.query_major

    @property
    def serves_only(self) -> bool:
        return self.cls.serves_only

    @property
    def mixes(self) -> bool:
        return self.cls.mixes


FROZEN_PREFIX = "frozen:"
_FROZEN_FORMS: dict[str, type] = {}
FROZEN_FORMS: Mapping[str, type] = MappingProxyType(_FROZEN_FORMS)
"""The frozen encodings by serving form (`register_frozen_form`; read-only)."""


def register_frozen_form(form: str):
    """Class decorator: registers a frozen encoding class as the serving form ``form`` (what a
    trained encoding's ``serving_form`` names)."""

    def register(cls):
        if form in _FROZEN_FORMS and _FROZEN_FORMS[form] is not cls:
            raise ValueError(f"A serving form named {form!r} is already registered ({_FROZEN_FORMS[form].__name__}).")
        _FROZEN_FORMS[form] = cls
        return cls

    return register


def _frozen_spec(trained_name: str) -> EncodingSpec:
    trained = get_encoding(trained_name)
    form = trained.serving_form
    if form is None:
        raise ValueError(f"Encoding {trained.name!r} is served as trained: it has no frozen form.")
    if form not in _FROZEN_FORMS:
        raise ValueError(f"Encoding {trained.name!r} names the serving form {form!r}, which is not registered.")
    return EncodingSpec(FROZEN_PREFIX + trained.name, _FROZEN_FORMS[form], MappingProxyType({"trained": trained.name}))


_REGISTRY: dict[str, EncodingSpec] = {}
ENCODINGS: Mapping[str, EncodingSpec] = MappingProxyType(_REGISTRY)
"""Every registered encoding by name (read-only; `register_encoding` adds to it)."""


def register_encoding(name: str, **options):
    """Class decorator: registers ``cls`` under ``name`` with fixed ``options`` (passed to
    ``from_attention`` and the class's other hooks). A class may be registered under several names
    with different options."""

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, RelativeEncoding)):
            raise TypeError(f"{cls!r} is not a RelativeEncoding subclass.")
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"An encoding named {name!r} is already registered ({_REGISTRY[name].cls.__name__}).")
        _REGISTRY[name] = EncodingSpec(name, cls, MappingProxyType(dict(options)))
        return cls

    return register


def unregister_encoding(name: str) -> None:
    """Removes the encoding registered as ``name`` (e.g. one a test registered); KeyError if none."""
    if name not in _REGISTRY:
        raise KeyError(f"No encoding named {name!r} is registered.")
    del _REGISTRY[name]


def get_encoding(name: str) -> EncodingSpec:
    """The registered encoding ``name``, or ``"frozen:NAME"``: the frozen encoding that serves
    ``NAME`` (its serving form, not in `ENCODINGS`); ValueError listing the known names otherwise."""
    if isinstance(name, str) and name.startswith(FROZEN_PREFIX):
        return _frozen_spec(name[len(FROZEN_PREFIX):])
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown encoding {name!r}; choose one of {', '.join(_REGISTRY)}.") from None


def convolutional_logits(shifts, strength, offsets):
    """``-strength * (offsets - shift)^2`` for each head, float64 ``(heads,) + offsets.shape``:
    one axis of the pattern (``shifts`` ``(heads,)``); the 2-D logits are the row term plus the
    column term."""
    shifts = np.asarray(shifts, np.float64).reshape((-1,) + (1,) * np.ndim(offsets))
    return -float(strength) * np.square(np.asarray(offsets, np.float64)[None] - shifts)
