"""Analytic FLOP counts used by the benchmarks."""

import pytest

import sa_conv
from benchmarks import flops


def test_resnet18_matches_the_known_count():
    # CIFAR ResNet18: 0.556 G multiply-adds per 32x32 image (the usual figure), 2 FLOPs each.
    assert flops.forward_flops(sa_conv.get_config("resnet18")) == pytest.approx(2 * 0.5565e9, rel=0.005)
    # ResNet20 (He et al. 2016): about 41 M multiply-adds, 40.55 M of them in its convolutions with
    # zero-padded shortcuts; the two 1x1 projections here add 0.26 M.
    assert flops.forward_flops(sa_conv.get_config("resnet20")) == pytest.approx(2 * (40.55e6 + 0.262e6), rel=0.002)


def test_attention_parts_by_hand():
    config = sa_conv.get_config("sa_quadratic")  # 16x16 grid, 9 heads, D = 400, MLP 512
    n, h, d = 256, 9, 400
    dense = flops.attention_layer_flops(config, fast=False)
    fast = flops.attention_layer_flops(config, fast=True)  # "auto": separable at 16x16
    assert flops.attention_layer_flops(config.replace(fast_position_attention=True), fast=True) == fast
    assert flops.attention_layer_flops(config.replace(fast_position_attention=False), fast=True) == dense
    assert dense["aggregation"] == 2 * h * n * n * d
    assert fast["aggregation"] == 2 * h * n * 32 * d  # N (H + W) D per head: 8x fewer at 16x16
    assert dense["value_merge"] == 2 * n * h * d * d
    assert dense["mlp"] == 2 * 2 * n * d * 512
    full = sa_conv.get_config("sa_quadratic_full")
    assert flops.attention_layer_flops(full, fast=True)["aggregation"] == dense["aggregation"]  # no fast path


def test_training_path_follows_attention_dropout():
    paper = sa_conv.get_config("sa_quadratic")  # attention dropout 0.1: dense path in training
    assert flops.training_flops(paper) == 3 * flops.forward_flops(paper, fast=False)
    no_drop = paper.replace(attention_dropout=0.0, fast_position_attention=True)
    assert flops.training_flops(no_drop) == 3 * flops.forward_flops(no_drop, fast=True)
    assert flops.training_flops(no_drop) < flops.training_flops(paper)


def test_frozen_copy_counts_the_folded_maps_once():
    """The served copy has no output map (folded into the value map) and, for content logits
    with a position bias, one query-key map instead of a query and a key map."""
    n, d, heads = 16 * 16, 400, 9
    for encoding, saved in (("learned", 2 * n * d * d), ("content_plus_learned_bias", 2 * n * d * d + 2 * n * d * heads * d),
                            ("content_with_relative_keys", 2 * n * d * d)):
        config = sa_conv.get_config("sa_learned", encoding=encoding)
        layer = sum(flops.attention_layer_flops(config, fast=True).values())
        assert layer - sum(flops.attention_layer_flops(config, fast=True, frozen=True).values()) == saved
        assert flops.forward_flops(config) - flops.forward_flops(config, frozen=True) == config.num_layers * saved
    assert flops.forward_flops(sa_conv.get_config("resnet18"), frozen=True) == flops.forward_flops(sa_conv.get_config("resnet18"))
