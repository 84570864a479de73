"""Pixel normalization shared by every model, so that models (and their exports) take raw pixels."""

import keras
from keras import ops

# Per-channel CIFAR-10 statistics used by the paper's code (RGB, on pixels scaled to [0, 1]):
# the defaults of models built without data. The trainer computes the statistics of the data it
# trains on (`sa_conv.data.channel_statistics`).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)


@keras.saving.register_keras_serializable(package="sa_conv")
class PixelNormalization(keras.layers.Layer):
    """Maps raw pixels in ``[0, 255]`` (uint8 or float) to per-channel standardized values.

    ``y = (x / 255 - mean) / std``.

    Input shape: ``(batch, height, width, channels)`` with ``len(mean)`` channels; output shape:
    the same, in the compute dtype.
    """

    def __init__(self, mean=CIFAR10_MEAN, std=CIFAR10_STD, **kwargs):
        super().__init__(**kwargs)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"mean {self.mean} and std {self.std} must have equal length, std > 0.")

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        mean = ops.convert_to_tensor(self.mean, dtype=self.compute_dtype)
        std = ops.convert_to_tensor(self.std, dtype=self.compute_dtype)
        return (x / 255.0 - mean) / std

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std}
