"""Dropout from seeds, for memory-lean training of `TransformerBlock` (and its ``remat``).

A dropout keep-mask drawn from a seed tensor (`draw_keep_mask`) can be drawn again from the same
seed: a backward pass keeps the seed, not the mask. The pieces:

* `draw_keep_mask`, `apply_keep_mask`: boolean masks and inverted dropout with ``where`` (the
  backward pass keeps booleans, not float masks).
* `after`: ties a seed to a tensor, so that a mask is drawn when it is needed.
* `sum_over_heads`: the paper's Eq. (6) with dropped probabilities, one head at a time,
  ``sum_h (Dropout(P_h) X) W^(h)``: no ``(batch, N, heads * D)`` concatenation.
* `seeded_sum_over_heads`: the same from the seed of the mask, with a gradient that draws the
  mask again and recomputes one product per head, keeping no ``(batch, N, N)`` tensor.
* `rematerialize`: `keras.remat` over a function whose arguments may be None (absent seeds).
* `stochastic_depth_rates`: the drop rate of each residual block under stochastic depth.
"""

import keras
from keras import ops

__all__ = ["GivenSeed", "after", "apply_keep_mask", "draw_keep_mask", "rematerialize", "seeded_sum_over_heads",
           "stochastic_depth_rates", "sum_over_heads"]


def stochastic_depth_rates(rate: float, blocks: int) -> list[float]:
    """Stochastic depth's drop rate of each of ``blocks`` residual blocks, in order: rising
    linearly from 0 at the first to ``rate`` at the last (as timm's ViTs and ResNets)."""
    return [rate * i / max(blocks - 1, 1) for i in range(blocks)]


class GivenSeed(keras.random.SeedGenerator):
    """A seed tensor handed to `keras.random` functions (which accept only seed generators and
    ints). Deliberately skips ``SeedGenerator.__init__``: it owns no state variable."""

    def __init__(self, seed):  # pylint: disable=super-init-not-called
        self._seed = seed

    def next(self, ordered=True):
        return self._seed


def draw_keep_mask(shape, seed, rate):
    """Boolean keep-mask of dropout at ``rate`` drawn from a seed tensor (a seed generator's
    ``next()``): the same seed gives the same mask."""
    return keras.random.uniform(shape, seed=GivenSeed(seed)) >= rate


def after(seed, tensor):
    """``seed`` unchanged, with a data dependency on ``tensor``. The runtime runs an op as soon
    as its inputs are ready; a mask drawn from a seed alone would be drawn at the start of the
    step, every block's at once. Tied to ``tensor``, it is drawn when ``tensor`` exists.

    The added term is ``where(isnan(t), 0, 0)`` of ``tensor``'s first element: zero for every
    value, NaN included (``0 * t`` would not be), and not a constant the graph can fold."""
    first = ops.reshape(tensor, (-1,))[:1]
    return seed + ops.cast(ops.where(ops.isnan(first), 0.0, 0.0)[0], seed.dtype)


def apply_keep_mask(x, keep, rate):
    """Inverted dropout from a boolean keep-mask: ``x / (1 - rate)`` where ``keep``, else 0;
    ``x`` unchanged when ``keep`` is None."""
    if keep is None:
        return x
    return ops.where(keep, x * ops.cast(1.0 / (1.0 - rate), x.dtype), ops.zeros((), x.dtype))


def _dropped_weights(probs, keep, h, rate, dtype):
    """Head ``h``'s dropped, rescaled probabilities, ``(batch, N, N)`` in ``dtype``; ``probs`` is
    ``(heads, N, N)`` (shared by the batch) or ``(batch, heads, N, N)``."""
    p = probs[h] if len(probs.shape) == 3 else probs[:, h]
    return ops.cast(apply_keep_mask(p, keep[:, h], rate), dtype)


def sum_over_heads(x, probs, kernel, keep, rate, dtype=None):
    """``sum_h (Dropout(P_h) X) W^(h)``, one head at a time.

    Args:
      x: ``(batch, N, D)``.
      probs: ``(heads, N, N)`` (position only: broadcast against the mask without a per-example
        copy) or ``(batch, heads, N, N)``.
      kernel: ``(heads * D, out)``, rows ordered ``[head, channel]``.
      keep: boolean keep-mask ``(batch, heads, N, N)``.
      rate: the dropout rate of ``keep``.

    Returns:
      ``(batch, N, out)``.
    """
    dtype = dtype or x.dtype
    d = x.shape[-1]
    outputs = None
    for h in range(probs.shape[-3]):
        term = ops.matmul(ops.matmul(_dropped_weights(probs, keep, h, rate, dtype), x), kernel[h * d:(h + 1) * d])
        outputs = term if outputs is None else outputs + term
    return outputs


def seeded_sum_over_heads(x, probs, kernel, seed, rate, dtype=None):
    """`sum_over_heads` with the keep-mask drawn from ``seed``, and a gradient that keeps only
    ``X``, the probabilities, ``W^(h)`` and the seed: it draws the mask again (`after` the
    upstream gradient) and, head by head, recomputes ``Z_h = Dropout(P_h) X`` for the value map's
    gradient. Nothing of size ``(batch, N, N)`` or ``(batch, N, heads * D)`` outlives its head.

    Gradients, per head, with ``G`` the upstream gradient ``(batch, N, out)``, ``M_h`` the
    dropped weights and ``s = 1 / (1 - rate)``::

        dW^(h) = Z_h^T G,  dZ_h = G W^(h)T,  dX += M_h^T dZ_h,
        dP_h = s * keep_h * (dZ_h X^T)   (summed over the batch when P is shared)
    """
    dtype = dtype or x.dtype
    heads, d, n = probs.shape[-3], x.shape[-1], x.shape[1]
    units = kernel.shape[-1]
    shared = len(probs.shape) == 3

    @ops.custom_gradient
    def attend(x, probs, kernel, seed):
        mask_shape = (ops.shape(x)[0], heads, n, n)
        outputs = sum_over_heads(x, probs, kernel, draw_keep_mask(mask_shape, seed, rate), rate, dtype)

        def grad(*args, upstream=None):
            g = args[0] if upstream is None else upstream
            keep = draw_keep_mask(mask_shape, after(seed, g), rate)  # after G: block by block
            g_flat = ops.reshape(g, (-1, units))
            dx, dprobs, dkernel = None, [], []
            for h in range(heads):
                m = _dropped_weights(probs, keep, h, rate, dtype)
                z = ops.matmul(m, x)
                dkernel.append(ops.matmul(ops.transpose(ops.reshape(z, (-1, d))), g_flat))
                dz = ops.matmul(g, ops.transpose(kernel[h * d:(h + 1) * d]))
                term = ops.einsum("bqk,bqd->bkd", m, dz)
                dx = term if dx is None else dx + term
                dp = apply_keep_mask(ops.einsum("bqd,bkd->bqk", dz, x), keep[:, h], rate)
                dprobs.append(ops.cast(ops.sum(dp, axis=0) if shared else dp, probs.dtype))
            return dx, ops.stack(dprobs, axis=0 if shared else 1), ops.concatenate(dkernel, axis=0), None

        return outputs, grad

    return attend(x, probs, kernel, seed)


def rematerialize(fn, *args):
    """``keras.remat(fn)(*args)``, where ``args`` may hold None (e.g. the seed of a dropout at
    rate 0): only the tensors enter the rematerialized function, which puts the Nones back.
    Seeds must be arguments, not closures: ``tf.recompute_grad`` makes its arguments wait for
    the incoming gradient, so the recomputation happens block by block in the backward pass."""
    present = [a is not None for a in args]

    def inner(*given):
        given = iter(given)
        return fn(*(next(given) if p else None for p in present))

    return keras.remat(inner)(*(a for a in args if a is not None))
