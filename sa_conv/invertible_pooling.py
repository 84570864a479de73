"""Invertible down-sampling (space-to-depth) and its exact inverse (Jacobsen et al., 2018).

The paper's classifier starts with a 2x2 invertible pooling, which turns the 32x32 image into a
16x16 grid of 12-dimensional pixels without losing information.

Channel order (the same as ``tf.nn.space_to_depth``): output channel ``(dy * w + dx) * C + c``
holds input channel ``c`` of the pixel at offset ``(dy, dx)`` inside each ``w x w`` block.
"""

import keras
from keras import ops


class _BlockLayer(keras.layers.Layer):
    """What both directions share: the block width ``w`` and the rank check."""

    def __init__(self, width=2, **kwargs):
        super().__init__(**kwargs)
        if int(width) < 1:
            raise ValueError(f"width must be a positive integer, got {width}.")
        self.width = int(width)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"{type(self).__name__} expects (batch, height, width, channels), got an input of "
                f"rank {len(input_shape)}."
            )

    def get_config(self):
        return {**super().get_config(), "width": self.width}


@keras.saving.register_keras_serializable(package="sa_conv")
class InvertiblePooling(_BlockLayer):
    """Space-to-depth of block width ``w``.

    Input shape: ``(batch, H, W, C)``, H and W divisible by ``w``.
    Output shape: ``(batch, H / w, W / w, C * w * w)``.
    """

    def build(self, input_shape):
        super().build(input_shape)
        for axis, size in (("height", input_shape[1]), ("width", input_shape[2])):
            if size is not None and size % self.width:
                raise ValueError(
                    f"InvertiblePooling(width={self.width}): input {axis} {size} is not "
                    f"divisible by {self.width}; crop or pad the input, or change the width."
                )

    def call(self, inputs):
        w = self.width
        _, h, wd, _ = ops.shape(inputs)  # a height or width unknown when traced is a tensor
        c = inputs.shape[-1]
        x = ops.reshape(inputs, (-1, h // w, w, wd // w, w, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, h // w, wd // w, w * w * c))

    def compute_output_shape(self, input_shape):
        b, h, wd, c = input_shape
        w = self.width
        return (b, None if h is None else h // w, None if wd is None else wd // w, c * w * w)


@keras.saving.register_keras_serializable(package="sa_conv")
class InvertibleUnpooling(_BlockLayer):
    """Depth-to-space, the exact inverse of `InvertiblePooling` with the same ``width``.

    Input shape: ``(batch, H, W, C * w * w)``; output shape: ``(batch, H * w, W * w, C)``.
    """

    def build(self, input_shape):
        super().build(input_shape)
        if input_shape[-1] % (self.width**2):
            raise ValueError(
                f"InvertibleUnpooling(width={self.width}): {input_shape[-1]} channels are not "
                f"divisible by width**2 = {self.width ** 2}."
            )

    def call(self, inputs):
        w = self.width
        _, h, wd, _ = ops.shape(inputs)  # a height or width unknown when traced is a tensor
        c = inputs.shape[-1] // (w * w)
        x = ops.reshape(inputs, (-1, h, wd, w, w, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, h * w, wd * w, c))

    def compute_output_shape(self, input_shape):
        b, h, wd, c = input_shape
        w = self.width
        return (b, None if h is None else h * w, None if wd is None else wd * w, c // (w * w))
