"""Analytic FLOPs per image of sa_conv models.

Convention: a multiply-add counts as 2 FLOPs; attention aggregation (probabilities times values)
and the attention logits are included; softmax, normalization, activations and the optimizer
update are not. Training = 3 x forward (backward ~ 2 x forward).
"""

from __future__ import annotations

from sa_conv.separable import separable_pays
from sa_conv.config import ModelConfig
from sa_conv.encodings import get_encoding
from sa_conv.resnet import RESNETS, ResNetSpec


def attention_layer_flops(config: ModelConfig, fast: bool, frozen: bool = False) -> dict:
    """Forward FLOPs of one transformer block on the attention grid, by part. ``frozen``: of the
    copy `sa_conv.freeze_for_inference` serves (the output map folded into the value map; one
    query-key map instead of two for content logits with a position bias)."""
    g = config.grid_size
    n, h, d, m = g * g, config.num_heads, config.hidden_size, config.mlp_size
    encoding = get_encoding(config.encoding)
    parts = {}
    logits = encoding.logits_flops(g, g, h, d)  # 0 for position-only encodings (once per batch)
    if logits:
        parts["logits"] = logits
    pays = config.fast_position_attention is True or (
        config.fast_position_attention == "auto" and separable_pays(g, g))
    if fast and pays and encoding.position_only and encoding.separable:
        parts["aggregation"] = 2 * h * n * (g + g) * d  # two 1-D passes
    else:
        parts["aggregation"] = 2 * h * n * n * d
    parts["value_merge"] = 2 * n * (h * d) * d
    if not frozen:
        parts["attention_output"] = 2 * n * d * d
    elif encoding.has_position_bias:
        parts["logits"] -= 2 * n * d * h * d  # the key map
    parts["mlp"] = 2 * 2 * n * d * m
    return parts


def resnet_flops(spec: ResNetSpec, image_size: int = 32, num_classes: int = 10) -> int:
    """Forward FLOPs of a CIFAR ResNet of `sa_conv.resnet.ResNetSpec` ``spec`` (convolutions and
    the classifier)."""
    total, size, channels = 0, image_size, 3
    total += 2 * size * size * 9 * channels * spec.widths[0]
    channels = spec.widths[0]
    for stage, (count, width) in enumerate(zip(spec.blocks, spec.widths)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            out = size // stride
            total += 2 * out * out * 9 * channels * width  # first 3x3
            total += 2 * out * out * 9 * width * width  # second 3x3
            if stride != 1 or channels != width:
                total += 2 * out * out * channels * width  # 1x1 projection
            size, channels = out, width
    return total + 2 * channels * num_classes


def forward_flops(config: ModelConfig, fast: bool = True, frozen: bool = False) -> int:
    """Forward FLOPs per image. ``fast``: the separable path where it applies (inference, or
    training without attention dropout); ``frozen``: of the served copy (`attention_layer_flops`)."""
    if config.architecture in RESNETS:
        return resnet_flops(RESNETS[config.architecture], config.image_size, config.num_classes)
    g = config.grid_size
    embedding = 2 * g * g * (3 * config.pooling_width**2) * config.hidden_size
    block = sum(attention_layer_flops(config, fast, frozen).values())
    return embedding + config.num_layers * block + 2 * config.hidden_size * config.num_classes


def training_flops(config: ModelConfig) -> int:
    """Training FLOPs per image (3 x forward), with the path training takes: the separable one
    only when there is no attention dropout."""
    return 3 * forward_flops(config, fast=config.attention_dropout == 0)
