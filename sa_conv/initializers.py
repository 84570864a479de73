"""Weight initializations: the reference implementation's (PyTorch defaults) and BERT's.

The reference's ``BertImage`` never calls BERT's ``init_bert_weights``, so its layers keep
PyTorch's defaults: ``Linear`` and ``Conv2d`` weights and biases ``U(-1/sqrt(fan_in),
1/sqrt(fan_in))`` (`FanInUniform`), ``Embedding`` tables ``N(0, 1)``, LayerNorm and BatchNorm
ones and zeros. ``"bert"`` is BERT's: weights and tables ``N(0, initializer_range)``, zero biases.
"""

from __future__ import annotations

import math

import keras

INITIALIZATIONS = ("reference", "bert")


@keras.saving.register_keras_serializable(package="sa_conv")
class FanInUniform(keras.initializers.RandomUniform):
    """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, PyTorch's default for ``Linear`` and ``Conv2d``
    weights (``kaiming_uniform_(a=sqrt(5))``) and biases.

    ``fan_in``: None for kernels (the product of all dimensions but the last: ``in`` of a dense
    kernel ``(in, out)``, ``kh * kw * in`` of a convolution's); a bias ``(units,)`` needs the
    fan-in of its layer's kernel, given here (`bias_for` does it).
    """

    def __init__(self, fan_in=None, seed=None):
        self.fan_in = None if fan_in is None else int(fan_in)
        super().__init__(-1.0, 1.0, seed=seed)

    def __call__(self, shape, dtype=None):
        fan_in = self.fan_in or math.prod(shape[:-1])
        if fan_in < 1:
            raise ValueError(f"FanInUniform needs a fan-in: give fan_in for a weight of shape {tuple(shape)}.")
        bound = 1.0 / math.sqrt(fan_in)
        return keras.random.uniform(shape, -bound, bound, seed=self.seed, dtype=dtype)

    def get_config(self):
        return {"fan_in": self.fan_in, "seed": super().get_config()["seed"]}


def clone_initializer(initializer):
    """A fresh copy of a Keras initializer: an unseeded initializer object returns the same
    values on every call, so every sublayer gets its own (as `keras.layers.MultiHeadAttention`)."""
    return initializer.__class__.from_config(initializer.get_config())


def bias_for(initializer, fan_in: int):
    """A fresh copy of the bias ``initializer`` of a layer whose kernel has fan-in ``fan_in``:
    `FanInUniform` without a fan-in takes it; any other initializer is cloned."""
    if isinstance(initializer, FanInUniform) and initializer.fan_in is None:
        return FanInUniform(fan_in, seed=initializer._init_seed)
    return clone_initializer(initializer)


def dense_initializers(initialization: str, initializer_range: float = 0.02) -> dict:
    """``kernel_initializer`` and ``bias_initializer`` of dense layers under ``initialization``
    (the bias one resolved per layer with `bias_for`)."""
    if initialization == "reference":
        return {"kernel_initializer": FanInUniform(), "bias_initializer": FanInUniform()}
    if initialization == "bert":
        return {"kernel_initializer": keras.initializers.RandomNormal(stddev=initializer_range),
                "bias_initializer": keras.initializers.Zeros()}
    raise ValueError(f"initialization must be one of {INITIALIZATIONS}, got {initialization!r}.")
