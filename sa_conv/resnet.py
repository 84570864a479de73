"""CIFAR ResNets (He et al., 2016): ResNet18, the baseline of the paper's Table 1, and ResNet20.

3x3 stride-1 stem without max-pool, stages of BasicBlocks (`RESNETS`: blocks per stage and
channels), 1x1 projection shortcuts where the shape changes, global average pooling, dense
classifier. Stochastic depth (Huang et al., 2016) drops a block's residual branch per example in
training, at a rate rising linearly from 0 at the first block to ``stochastic_depth`` at the last.
"""

import dataclasses

import keras

from sa_conv.initializers import FanInUniform
from sa_conv.seeded_dropout import stochastic_depth_rates
from sa_conv.preprocessing import REFERENCE_PIXEL_MEAN, REFERENCE_PIXEL_STD, PixelNormalization

# PyTorch's BatchNorm defaults, as in the reference implementation.
_BN = dict(momentum=0.9, epsilon=1e-5)


def _conv_bn(x, filters, kernel, stride, name, relu=True, initialization="reference", dtype=None):
    padding = "same"
    if stride > 1 and kernel > 1:
        # PyTorch's padding=1 on both sides: Keras's "same" pads a strided 3x3 convolution on the
        # bottom and right only, which samples every window one pixel further (a different
        # function from the reference's, and from its imported weights).
        x = keras.layers.ZeroPadding2D(kernel // 2, name=f"{name}_pad", dtype=dtype)(x)
        padding = "valid"
    x = keras.layers.Conv2D(filters, kernel, strides=stride, padding=padding, use_bias=False,
                            kernel_initializer=FanInUniform() if initialization == "reference" else "he_normal",
                            name=f"{name}_conv", dtype=dtype)(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn", dtype=dtype, **_BN)(x)
    return keras.layers.ReLU(name=f"{name}_relu", dtype=dtype)(x) if relu else x


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
    """A CIFAR ResNet's stages: ``blocks`` BasicBlocks per stage at ``widths`` channels."""

    blocks: tuple
    widths: tuple


RESNETS = {
    # The paper's Table 1 baseline: 11.2 M parameters.
    "resnet18": ResNetSpec((2, 2, 2, 2), (64, 128, 256, 512)),
    # He et al.'s 6n+2 CIFAR family at n=3 (their Section 4.2), 0.27 M parameters: the size of the
    # _small attention presets. Projection shortcuts (their option B) where they use zero padding.
    "resnet20": ResNetSpec((3, 3, 3), (16, 32, 64)),
}


def _basic_block(x, filters, stride, name, initialization, dtype=None, drop_path=0.0):
    shortcut = x
    y = _conv_bn(x, filters, 3, stride, f"{name}_1", initialization=initialization, dtype=dtype)
    y = _conv_bn(y, filters, 3, 1, f"{name}_2", relu=False, initialization=initialization, dtype=dtype)
    if drop_path > 0:  # only then: the layers of a ResNet without stochastic depth stay as they were
        y = keras.layers.Dropout(drop_path, noise_shape=(None, 1, 1, 1), name=f"{name}_drop_path", dtype=dtype)(y)
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, stride, f"{name}_shortcut", relu=False, initialization=initialization,
                            dtype=dtype)
    add = keras.layers.Add(name=f"{name}_add", dtype=dtype)([y, shortcut])
    return keras.layers.ReLU(name=f"{name}_out", dtype=dtype)(add)


def build_resnet(image_size=32, num_classes=10, blocks=(2, 2, 2, 2), widths=(64, 128, 256, 512), name="resnet18",
                 image_channels=3, pixel_mean=REFERENCE_PIXEL_MEAN, pixel_std=REFERENCE_PIXEL_STD, initialization="reference",
                 dtype=None, stochastic_depth=0.0):
    """A CIFAR ResNet as a functional `keras.Model`: ``image`` ``(batch, S, S, C)`` raw pixels
    (uint8 or float in [0, 255]) -> ``logits`` ``(batch, num_classes)``; ``pixel_mean`` and
    ``pixel_std`` are the statistics its `PixelNormalization` applies. ``initialization``:
    ``"reference"`` (PyTorch's defaults, as the reference: convolution and dense weights and
    biases ``U(+-1/sqrt(fan_in))``) or anything else for He-normal convolutions and Keras's
    default dense layer. ``dtype``: the layers' dtype policy (None: Keras's global one); the
    logits are float32 whatever it is. ``blocks``, ``widths``: a `ResNetSpec`'s. ``stochastic_depth``:
    the drop rate of the last block's residual branch (see the module doc)."""
    inputs = keras.Input((image_size, image_size, image_channels), name="image")
    x = PixelNormalization(pixel_mean, pixel_std, name="normalize", dtype=dtype)(inputs)
    x = _conv_bn(x, widths[0], 3, 1, "stem", initialization=initialization, dtype=dtype)
    rates = iter(stochastic_depth_rates(stochastic_depth, sum(blocks)))
    for stage, (count, filters) in enumerate(zip(blocks, widths)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, stride, f"stage{stage + 1}_block{block + 1}", initialization, dtype,
                             next(rates))
    x = keras.layers.GlobalAveragePooling2D(name="pool", dtype=dtype)(x)
    dense = {}
    if initialization == "reference":
        dense = dict(kernel_initializer=FanInUniform(), bias_initializer=FanInUniform(widths[-1]))
    logits = keras.layers.Dense(num_classes, name="logits", dtype="float32", **dense)(x)
    return keras.Model(inputs, logits, name=name)
