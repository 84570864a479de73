"""Relative positional encodings of `sa_conv.MultiHeadSelfAttention2D` and their registry.

`ENCODINGS` maps every registered name to its `EncodingSpec`; `register_encoding` adds one
(see `sa_conv.encodings.base` for the interface). The built-in encodings:

* ``quadratic``, ``quadratic_full``: `QuadraticEncoding` (paper Eq. 9, isotropic or full covariance).
* ``learned``: `LearnedRelativeEncoding` (learned row and column tables, position only).
* ``learned_plus_content`` (the reference's, the paper presets') and ``learned_content``
  (Ramachandran et al.'s): `LearnedContentEncoding`, content plus a learned relative term.
* ``sinusoidal``: `SinusoidalRelativeEncoding` (fixed sinusoidal features of each axis offset,
  learned per-head vectors).
* ``mlp``: `MLPRelativeEncoding` (a small MLP of the continuous offset).
"""

from sa_conv.encodings.base import (
    ENCODINGS, EncodingSpec, RelativeEncoding, axis_offsets, check_table_bound, get_encoding,
    register_encoding, relative_indices, relative_offsets, unregister_encoding,
)
# Registration order is the order of `ENCODINGS`.
from sa_conv.encodings.quadratic import QuadraticEncoding  # isort: skip
from sa_conv.encodings.learned import LearnedRelativeEncoding  # isort: skip
from sa_conv.encodings.content import LearnedContentEncoding  # isort: skip
from sa_conv.encodings.sinusoidal import SinusoidalRelativeEncoding  # isort: skip
from sa_conv.encodings.mlp import MLPRelativeEncoding  # isort: skip

__all__ = [
    "ENCODINGS", "EncodingSpec", "LearnedContentEncoding", "LearnedRelativeEncoding", "MLPRelativeEncoding", "QuadraticEncoding",
    "RelativeEncoding", "SinusoidalRelativeEncoding", "axis_offsets", "check_table_bound", "get_encoding", "register_encoding",
    "relative_indices", "relative_offsets", "unregister_encoding",
]
