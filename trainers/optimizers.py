"""``--optimizer``: how a run's optimizer is made (`OPTIMIZERS`), and SGD with PyTorch's momentum
formulation, for runs that must match the reference's training.

Keras's SGD keeps ``m = mu m - lr g`` and adds ``m`` to the weights; PyTorch's
(``torch.optim.SGD``, which the reference's ``train.py`` uses) keeps ``b = mu b + g`` and
subtracts ``lr b``. With a constant learning rate the two are the same; they differ when it
changes. Most at the reference's per-epoch warm-up, whose first epoch runs at lr 0: PyTorch's
buffer still accumulates that epoch's gradients and the first step at lr > 0 spends them all at
once, while Keras's momentum stays 0 and ramps up (`--momentum_form`).
"""

from __future__ import annotations

import keras
from keras import ops

MOMENTUM_FORMS = ("keras", "pytorch")


@keras.saving.register_keras_serializable(package="sa_conv")
class PyTorchSGD(keras.optimizers.SGD):
    """`keras.optimizers.SGD` with ``torch.optim.SGD``'s momentum (no dampening, no Nesterov):
    ``b <- mu b + g``, ``w <- w - lr b``. Same variables as Keras's SGD (checkpoints interchange)."""

    def __init__(self, learning_rate=0.01, momentum=0.0, name="pytorch_sgd", **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum, nesterov=False, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        if self.momentum == 0:
            self.assign_sub(variable, ops.multiply(gradient, learning_rate))
            return
        buffer = self.momentums[self._get_variable_index(variable)]
        self.assign(buffer, ops.add(ops.multiply(buffer, ops.cast(self.momentum, variable.dtype)), gradient))
        self.assign_sub(variable, ops.multiply(buffer, learning_rate))

    def get_config(self):
        config = super().get_config()
        config.pop("nesterov", None)
        return config


class SGD:
    """``--optimizer=sgd``: `keras.optimizers.SGD` (or `PyTorchSGD`, ``--momentum_form``) with
    ``--momentum``. Weight decay is coupled: the loss gains ``weight_decay / 2 * sum w^2``."""

    couples_weight_decay = True

    @staticmethod
    def make(config, schedule, spared, **options):
        sgd = PyTorchSGD if config.momentum_form == "pytorch" else keras.optimizers.SGD
        return sgd(schedule, momentum=config.momentum, **options)


class AdamW:
    """``--optimizer=adamw``: `keras.optimizers.AdamW` (Loshchilov and Hutter, 2019), decoupled
    weight decay ``w -= lr * weight_decay * w`` on every variable but ``spared``."""

    couples_weight_decay = False

    @staticmethod
    def make(config, schedule, spared, **options):
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay, **options)
        optimizer.exclude_from_weight_decay(var_list=spared)
        return optimizer


OPTIMIZERS = {"sgd": SGD, "adamw": AdamW}
