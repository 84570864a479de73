"""Relative positional encodings of `sa_conv.MultiHeadSelfAttention2D` and their registry.

`ENCODINGS` maps every registered name to its `EncodingSpec`; `register_encoding` adds one
(see `sa_conv.encodings.base` for the interface). The built-in encodings:

* ``quadratic``, ``quadratic_full``: `QuadraticEncoding` (paper Eq. 9, isotropic or full covariance).
* ``learned``: `LearnedRelativeEncoding` (learned row and column tables, position only).
* ``content_plus_learned_bias`` (the reference's "learned embedding w/ content", the paper
  presets'): `ContentPlusLearnedBiasEncoding`, content logits plus the ``learned`` encoding's
  logits; ``content_with_relative_keys`` (Ramachandran et al.'s):
  `ContentWithRelativeKeysEncoding`, relative embeddings against each head's query. Both derive from `ContentEncoding`.
* ``sinusoidal``: `SinusoidalRelativeEncoding` (fixed sinusoidal features of each axis offset,
  learned per-head vectors).
* ``mlp``: `MLPRelativeEncoding` (a small MLP of the continuous offset).
* ``gated``: `GatedPositionalEncoding` (ConViT's gated positional self-attention: per head, a
  learned gate mixes content attention and the quadratic encoding's positional attention).

Each encoding names its serving form (`FROZEN_FORMS`, `sa_conv.encodings.frozen`): the frozen
encoding ``"frozen:NAME"`` that serves it with its input-independent part computed once.
"""

from sa_conv.encodings.base import (
    ENCODINGS, FROZEN_FORMS, EncodingSpec, RelativeEncoding, axis_offsets, check_table_bound,
    get_encoding, register_encoding, register_frozen_form, relative_indices, relative_offsets, unregister_encoding,
)
# Registration order is the order of `ENCODINGS`.
from sa_conv.encodings.quadratic import QuadraticEncoding  # isort: skip
from sa_conv.encodings.learned import LearnedRelativeEncoding  # isort: skip
from sa_conv.encodings.content import (  # isort: skip
    ContentEncoding, ContentPlusLearnedBiasEncoding, ContentWithRelativeKeysEncoding,
)
from sa_conv.encodings.sinusoidal import SinusoidalRelativeEncoding  # isort: skip
from sa_conv.encodings.mlp import MLPRelativeEncoding  # isort: skip
from sa_conv.encodings.gated import GatedPositionalEncoding  # isort: skip
from sa_conv.encodings.frozen import FrozenEncoding, FrozenGated, FrozenPositionBias, FrozenProbabilities  # isort: skip

__all__ = [
    "ContentEncoding", "ContentPlusLearnedBiasEncoding", "ContentWithRelativeKeysEncoding",
    "ENCODINGS", "EncodingSpec", "FROZEN_FORMS", "FrozenEncoding", "FrozenGated",
    "FrozenPositionBias", "FrozenProbabilities", "GatedPositionalEncoding", "LearnedRelativeEncoding", "MLPRelativeEncoding", "QuadraticEncoding",
    "RelativeEncoding", "SinusoidalRelativeEncoding", "axis_offsets", "check_table_bound", "get_encoding", "register_encoding",
    "register_frozen_form", "relative_indices", "relative_offsets", "unregister_encoding",
]
