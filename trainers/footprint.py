"""Estimated activation memory of a training step: what the backward pass keeps alive.

`training_activation_bytes` decides ``--remat=auto`` in the trainer. It counts the tensors a
transformer block saves for its gradient, per example, in float32 (4 bytes; mixed precision
saves some in 16 bits, which the estimate ignores, erring high):

- attention probabilities ``(heads, N, N)``, when they are per example: content logits
  (``queries``/``keys`` depend on the input) or attention dropout in training (counted as 3
  tensors: the dropped weights, the boolean keep-mask and the backward pass's gradient of the
  weights, a transient of the same size);
  content encodings also keep their queries and keys ``2 x (N, heads * D)``;
- the heads' mixed values ``(N, heads * D)`` before the value map, on the dense path; the
  separable path keeps three tensors of that size (the value-mapped input, its transpose and the
  column pass), except in rematerialized blocks, where its gradient keeps only its input and
  recomputes the rest head by head (`sa_conv.separable`, ``recompute_gradient``);
- ``N x D`` tensors: block input, attention output, its dropout, the residual sums and the two
  LayerNorms' inputs and outputs (about 10), and ``N x M`` ones for the MLP (its input and GELU's
  intermediates, about 4).

With ``remat``, one block's activations are alive at a time, plus every block's input (and its
attention's output, for position-only encodings with attention dropout: their attention is not
recomputed, only the rest of the block, see `TransformerBlock`). The
figure is an estimate for deciding, not a measurement: measured peaks are in
``benchmarks/results/vs_reference.json``.
"""

from __future__ import annotations

from sa_conv import aggregation
from sa_conv.config import ModelConfig
from sa_conv.encodings import get_encoding

_FLOAT_BYTES = 4


def trains_separable(config: ModelConfig, attention_dropout: float | None = None) -> bool:
    """Whether the attention of ``config`` trains through the separable path
    (`sa_conv.separable`): a position-only encoding whose logits separate, no attention dropout
    (its masks are per probability, which only the dense path has; ``attention_dropout``: None =
    ``config``'s) and ``fast_position_attention`` True, or ``"auto"`` on a grid where it pays."""
    dropout = config.attention_dropout if attention_dropout is None else attention_dropout
    encoding = get_encoding(config.encoding)
    chosen = aggregation.choose(encoding, config.fast_position_attention, (config.grid_size, config.grid_size), dropout)
    return encoding.position_only and chosen.takes_factors(dropout=dropout > 0)


def attention_dropout_bytes(config: ModelConfig) -> int:
    """Bytes per example and layer of the ``(heads, N, N)`` float32 tensors that attention dropout
    adds to a training step on a position-only encoding (three: see the module doc); 0 without
    attention dropout."""
    n = config.grid_size ** 2
    return 3 * config.num_heads * n * n * _FLOAT_BYTES if config.attention_dropout > 0 else 0


def block_activation_floats(config: ModelConfig, remat: bool | None = None) -> int:
    """Floats one transformer block keeps for its backward pass, per example (see module doc;
    ``remat``: whether the block is rematerialized, None = ``config.remat``)."""
    g = config.grid_size
    n, h, d, m = g * g, config.num_heads, config.hidden_size, config.mlp_size
    encoding = get_encoding(config.encoding)
    dropout = config.attention_dropout > 0
    floats = 10 * n * d + 4 * n * m
    if not encoding.position_only:
        floats += 2 * n * h * d + (3 if dropout else 2) * h * n * n
    elif dropout:
        floats += 3 * h * n * n
    if not trains_separable(config):
        floats += n * h * d
    elif not (config.remat if remat is None else remat):
        floats += 3 * n * h * d
    return floats


def over_budget(config: ModelConfig, batch_size: int, memory_budget_gb: float) -> float | None:
    """The estimated GB of activations a training step of ``batch_size`` examples keeps without
    remat (`training_activation_bytes`) when they exceed ``memory_budget_gb``, else None."""
    gb = training_activation_bytes(config, batch_size, remat=False) / 2**30
    return gb if gb > memory_budget_gb else None


def training_activation_bytes(config: ModelConfig, batch_size: int, remat: bool | None = None) -> int:
    """Estimated bytes of activations a training step of ``batch_size`` examples keeps for its
    backward pass (``remat``: None = ``config.remat``). ResNet18 is not estimated (0)."""
    if not config.is_attention:
        return 0
    remat = config.remat if remat is None else remat
    g = config.grid_size
    block = block_activation_floats(config, remat)
    encoding = get_encoding(config.encoding)
    kept_per_block = 2 if encoding.position_only and config.attention_dropout > 0 else 1
    block_input = kept_per_block * g * g * config.hidden_size
    layers = config.num_layers
    per_example = (block + layers * block_input) if remat else layers * block
    return int(per_example * batch_size * _FLOAT_BYTES)
