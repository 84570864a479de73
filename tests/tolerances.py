"""Tolerances derived from a computation's precision and depth: the one place the suite takes
them from when it compares floating-point results computed on different machines or kernels.

A recorded fixture holds one machine's rounding. Another CPU (AVX2 or AVX-512 kernels), or the
other kernel set of TensorFlow (oneDNN or Eigen), sums in another order; a CPU with AVX512_BF16 or
AMX computes bfloat16 natively where another emulates it. A comparison therefore allows what any
correct evaluation of the same computation may differ by, and no more:

* **float32** (unit roundoff ``u = 2**-24``): a sum of ``K`` terms evaluated in any order differs
  from the exact one by about ``sqrt(K) u sum|terms|`` (the typical size of the probabilistic
  analysis of Higham and Mary, SIAM J. Sci. Comput. 2019; the worst case is ``K u``). Its margin
  is in the rest: errors counted at every one of ``D`` sums, against the output's largest
  magnitude, twice; the differences measured are 1/20 (an attention map on an AVX-512 CPU) to
  1/1000 (logits) of the bound. A result
  ``D`` such sums deep carries up to ``D`` of them, each relative to the scale of the values it
  sums, which layer normalization and batch normalization keep near the output's scale:
  ``D sqrt(K) u scale``. Two float32 evaluations (a fixture and a recomputation) may each be that
  far from the exact value, so a comparison between them allows twice it.
* **float64** (``u = 2**-53``): the same analysis; `gradient_relative` adds float32's bound for
  the logits layer, which stays float32.
* **bfloat16** (8 significant bits, ``u = 2**-8``): each rounding of an activation along the depth
  moves it by up to ``u`` of its value, and to first order the ``D`` roundings add:
  ``D u scale`` between a bfloat16 evaluation and the float32 one.

``D`` and ``K`` come from the model's configuration (`depth`, `terms`). `tests/test_golden.py`
shows each bound failing on a real change (a weight moved by 1e-3 of itself, a dropped term).
"""

from __future__ import annotations

import numpy as np

FLOAT32_UNIT = 2.0 ** -24
FLOAT64_UNIT = 2.0 ** -53
BFLOAT16_UNIT = 2.0 ** -8

# Roundings along one transformer block: attention's projections, logits, probabilities, weighted
# sum and output projection (5), the encoding's own (up to 2: the MLP encoding's layers), two
# residual additions, two layer normalizations (a normalization and a scale each) and the MLP's
# two matmuls and activation (3).
ROUNDINGS_PER_BLOCK = 5 + 2 + 2 + 4 + 3
# Outside the blocks: the pixel normalization, the pooling and embedding, the pooled head's logits.
ROUNDINGS_OUTSIDE_BLOCKS = 4
# The logits layer, float32 whatever the model's policy: the cast of its input, its matmul, bias
# and the log-softmax of the cross-entropy.
HEAD_ROUNDINGS = 4
# ResNet18: 17 convolutions, each with its batch normalization and activation, 8 residual additions.
RESNET18_ROUNDINGS = 17 * 3 + 8 + ROUNDINGS_OUTSIDE_BLOCKS


def depth(config, blocks: int | None = None) -> int:
    """Sequential roundings from the input to an output of a model with ``config``
    (`sa_conv.ModelConfig`): through all of its blocks, or its first ``blocks`` of them (block 0's
    attention probabilities: ``blocks=1``)."""
    if config.architecture == "resnet18":
        return RESNET18_ROUNDINGS
    blocks = config.num_layers if blocks is None else blocks
    return ROUNDINGS_PER_BLOCK * blocks + ROUNDINGS_OUTSIDE_BLOCKS


def terms(config, batch: int = 1) -> int:
    """The longest sum a forward pass (``batch=1``) or a training step over ``batch`` images (a
    weight's gradient sums over the batch and the pixels) computes: its ``K``."""
    if config.architecture == "resnet18":
        return max(3 * 3 * 512, batch * config.image_size ** 2)
    tokens = config.grid_size ** 2
    return max(config.hidden_size, config.mlp_size, tokens * batch)


def float32_relative(config, blocks: int | None = None, batch: int = 1, backward: bool = False) -> float:
    """The allowed difference between two float32 evaluations, relative to the output's scale;
    a gradient's path is the forward pass and the backward pass (``backward=True``)."""
    d = depth(config, blocks) * (2 if backward else 1)
    return 2 * d * np.sqrt(terms(config, batch)) * FLOAT32_UNIT


def gradient_relative(config, dtype: str, batch: int) -> float:
    """The allowed difference between two evaluations of one training step's gradients over
    ``batch`` images, the model's variables in ``dtype``, relative to the step's gradient scale.

    In float64 the logits layer stays float32 (the models keep their logits float32 whatever the
    policy): its roundings, forward and backward, are float32's (sums no longer than the model's
    longest, `terms`), and reach the float64 backward pass below it relative to the step's
    gradient scale, as the float32 bound assumes of every rounding, since the gradient is linear in
    the logits' gradient. The rest of the step adds float64's bound of the whole depth."""
    if dtype == "float32":
        return float32_relative(config, batch=batch, backward=True)
    if dtype != "float64":
        raise ValueError(f"no gradient bound for dtype {dtype!r}: float32 or float64")
    head = 2 * (2 * HEAD_ROUNDINGS) * np.sqrt(terms(config, batch)) * FLOAT32_UNIT
    body = float32_relative(config, batch=batch, backward=True) * (FLOAT64_UNIT / FLOAT32_UNIT)
    return head + body


def bfloat16_relative(config) -> float:
    """The allowed difference between a bfloat16 evaluation and the float32 one, relative to the
    output's scale."""
    return depth(config) * BFLOAT16_UNIT


def assert_close_to_scale(got, want, relative: float, err_msg: str = "") -> None:
    """``|got - want| <= relative * max|want|`` entrywise: a difference measured against the
    output's scale, as rounding errors are (not against each entry, which may be near zero)."""
    want = np.asarray(want, np.float64)
    scale = np.abs(want).max()
    assert scale > 0, f"{err_msg}: the reference is all zeros, nothing to compare"
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=relative * scale, err_msg=err_msg)
