"""Pixel normalization shared by every model, so that models (and their exports) take raw pixels."""

import epfml_reference
import keras
from keras import ops

# The reference implementation's CIFAR-10 normalization (RGB, on pixels scaled to [0, 1]; its std
# is below the data's measured ~0.25): the defaults of models built without data, as in the
# paper's code. The trainer computes the statistics of the data it trains on
# (`trainers.data.channel_statistics`).
REFERENCE_PIXEL_MEAN = epfml_reference.PIXEL_MEAN
REFERENCE_PIXEL_STD = epfml_reference.PIXEL_STD


@keras.saving.register_keras_serializable(package="sa_conv")
class PixelNormalization(keras.layers.Layer):
    """Maps raw pixels in ``[0, 255]`` (uint8 or float) to per-channel standardized values.

    ``y = (x / 255 - mean) / std``.

    Input shape: ``(batch, height, width, channels)`` with ``len(mean)`` channels; output shape:
    the same, in the compute dtype.
    """

    def __init__(self, mean=REFERENCE_PIXEL_MEAN, std=REFERENCE_PIXEL_STD, **kwargs):
        super().__init__(**kwargs)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"mean {self.mean} and std {self.std} must have equal length, std > 0.")

    def build(self, input_shape):
        if input_shape[-1] is not None and input_shape[-1] != len(self.mean):
            raise ValueError(f"PixelNormalization has statistics of {len(self.mean)} channels; its input has "
                             f"{input_shape[-1]}: give a mean and std per channel.")
        super().build(input_shape)

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        mean = ops.convert_to_tensor(self.mean, dtype=self.compute_dtype)
        std = ops.convert_to_tensor(self.std, dtype=self.compute_dtype)
        return (x / 255.0 - mean) / std

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std}
