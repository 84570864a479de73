"""Degenerate attention heads: find them, prune them, or re-initialize them.

A Gaussian (quadratic) head is *degenerate* when its attention is not localized (the reference
implementation's criteria, on the precision matrix ``Sigma_h^-1`` of the head):

* isotropic: ``sigma^-2 = s_h^2`` below ``min_precision`` (default 1e-5);
* full covariance: condition number above ``max_condition`` (default 1000) or largest
  eigenvalue below ``min_precision``.

Encodings without Gaussian heads (``gaussian()`` is None) have no criterion: no head of theirs is
reported. Pruning works for every encoding: it removes the heads' slices from every weight that
has a head axis (the value map's rows, the encoding's per-head parameters, the content queries and
keys), found by comparing the shapes of the old and the new layer.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from sa_conv.models import attention_blocks, is_frozen
from sa_conv.transformer import TransformerBlock


def head_gates(model: keras.Model) -> list:
    """Per attention block, in order, its heads' gates ``(heads,)`` as NumPy float64: each
    head's weight on its positional attention for encodings that mix two (``gated``,
    `RelativeEncoding.gates`), None for blocks whose encoding has none."""
    gates = []
    for block in attention_blocks(model):
        values = block.attention.position_encoding.gates()
        gates.append(None if values is None else np.asarray(ops.convert_to_numpy(values), np.float64))
    return gates


def degenerate_heads(model: keras.Model, min_precision: float = 1e-5, max_condition: float = 1000.0) -> dict:
    """``{block index: [head, ...]}`` of the degenerate heads of every attention block (only
    blocks with at least one), by the criteria of the module docstring."""
    if is_frozen(model):  # its heads are folded constants: no Gaussian left to judge
        raise ValueError(f"{model.name} is a serving copy: find the degenerate heads of the trained model.")
    found = {}
    for index, block in enumerate(attention_blocks(model)):
        gaussian = block.attention.position_encoding.gaussian()
        if gaussian is None:
            continue
        precision = np.asarray(ops.convert_to_numpy(gaussian[1]), np.float64)  # (heads, 2, 2)
        eigenvalues = np.linalg.eigvalsh(precision)  # ascending
        largest, smallest = eigenvalues[:, -1], eigenvalues[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            condition = np.where(smallest > 0, largest / smallest, np.inf)
        bad = (largest < min_precision) | (condition > max_condition)
        if bad.any():
            found[index] = [int(h) for h in np.flatnonzero(bad)]
    return found


def _check_heads(model, heads_by_layer):
    """``(blocks, {block: sorted distinct heads})`` after checking that every head exists and
    that every block keeps one."""
    if is_frozen(model):
        raise ValueError(f"{model.name} is a serving copy (its constants are per head and folded): prune the trained "
                         "model, then sa_conv.freeze_for_inference the pruned one.")
    heads_by_layer = {int(k): sorted(set(int(h) for h in v)) for k, v in heads_by_layer.items() if v}
    blocks = attention_blocks(model)
    for index, heads in heads_by_layer.items():
        if not 0 <= index < len(blocks):
            raise ValueError(f"Block {index} does not exist; the model has {len(blocks)} attention blocks.")
        count = blocks[index].attention.num_heads
        bad = [h for h in heads if not 0 <= h < count]
        if bad:
            raise ValueError(f"Block {index} has heads 0..{count - 1}; got {bad}.")
        if len(set(heads)) >= count:
            raise ValueError(f"Pruning every head of block {index} would leave no attention; keep at least one.")
    return blocks, heads_by_layer


def _take_heads(old: np.ndarray, new_shape: tuple, kept: list[int], heads: int) -> np.ndarray:
    """The kept heads' slices of ``old`` along the one axis whose size changed."""
    axes = [i for i, (a, b) in enumerate(zip(old.shape, new_shape)) if a != b]
    if len(axes) != 1 or old.shape[axes[0]] % heads:
        raise ValueError(f"Cannot find the head axis of a weight of shape {old.shape} (pruned: {new_shape}).")
    axis = axes[0]
    per_head = old.shape[axis] // heads
    split = old.reshape(old.shape[:axis] + (heads, per_head) + old.shape[axis + 1:])
    return np.take(split, kept, axis=axis).reshape(new_shape)


def _slicer(blocks, heads_by_layer):
    selection = {}
    for index, removed in heads_by_layer.items():
        heads = blocks[index].attention.num_heads
        kept = [h for h in range(heads) if h not in removed]
        for weight in blocks[index].weights:
            selection[id(weight)] = (kept, heads)

    def take(variable, value, new_shape):
        value = np.asarray(value)
        if tuple(new_shape) == value.shape:
            return value
        if id(variable) not in selection:
            raise ValueError(f"{variable.path} of shape {value.shape} is not in a pruned block (asked for {tuple(new_shape)}).")
        return _take_heads(value, tuple(new_shape), *selection[id(variable)])

    return take


def _check_prunable(model, heads_by_layer):
    """`_check_heads`, and that every block to prune is a `TransformerBlock`: the pruned copy
    rebuilds those only (any other layer would keep its heads)."""
    blocks, heads_by_layer = _check_heads(model, heads_by_layer)
    other = [i for i in heads_by_layer if not isinstance(blocks[i], TransformerBlock)]
    if other:
        raise ValueError(f"Block {other[0]} ({type(blocks[other[0]]).__name__}) is not a TransformerBlock: "
                         "prune_heads prunes the transformer blocks of sa_conv's classifiers.")
    return blocks, heads_by_layer


def head_slicer(model: keras.Model, heads_by_layer: dict):
    """A function ``(variable, value, new_shape) -> value`` that takes, from ``value`` (the value
    of ``variable`` of ``model``, or of anything shaped like it such as an optimizer's momentum),
    the slices of the heads that `prune_heads` keeps: unchanged when ``new_shape`` is its shape."""
    return _slicer(*_check_prunable(model, heads_by_layer))


def prune_heads(model: keras.Model, heads_by_layer: dict) -> keras.Model:
    """A copy of ``model`` without the heads ``{block index: [head, ...]}``: it computes what
    ``model`` computes with those heads' contributions removed (each head's rows of the value
    map go, and so do its slices of every other per-head weight). Other weights are copied."""
    blocks, heads_by_layer = _check_prunable(model, heads_by_layer)
    take = _slicer(blocks, heads_by_layer)
    pruned_names = {blocks[i].name: heads for i, heads in heads_by_layer.items()}

    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, TransformerBlock) and layer.name in pruned_names:
            attention = dict(config["attention_config"])
            attention["num_heads"] = layer.attention.num_heads - len(pruned_names[layer.name])
            trained = layer.attention
            if not trained.position_only and trained.query_key_dim != trained.input_dim:
                # A per-head query size derived from the head count (gated: D / heads) stays the trained one.
                attention["encoding_options"] = {**(attention.get("encoding_options") or {}),
                                                 "query_dim": trained.query_key_dim}
            config["attention_config"] = attention
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    for old, new in zip(model.layers, copy.layers):
        new.set_weights([
            take(old_weight, ops.convert_to_numpy(old_weight), new_weight.shape)
            for old_weight, new_weight in zip(old.weights, new.weights)
        ])
    return copy


def heads_per_block(model: keras.Model) -> list[int]:
    """The number of heads of every attention block, in order."""
    return [block.attention.num_heads for block in attention_blocks(model)]


def prune_to(model: keras.Model, counts: list[int]) -> keras.Model:
    """``model`` with its blocks' last heads pruned so that block ``i`` has ``counts[i]`` heads:
    the architecture of a model pruned to those counts (e.g. to restore its checkpoint into)."""
    current = heads_per_block(model)
    if len(counts) != len(current) or any(c < 1 or c > n for c, n in zip(counts, current)):
        raise ValueError(f"Cannot prune a model with heads {current} to {list(counts)}.")
    removed = {i: list(range(c, n)) for i, (c, n) in enumerate(zip(counts, current)) if c < n}
    return prune_heads(model, removed) if removed else model


def reset_heads(model: keras.Model, heads_by_layer: dict) -> None:
    """Re-initializes, in place, the center and spread of the Gaussian heads
    ``{block: [head, ...]}`` (e.g. degenerate ones) from the encoding's own initializers;
    every other weight is kept. ``keras.utils.set_random_seed`` makes it reproducible."""
    blocks, heads_by_layer = _check_heads(model, heads_by_layer)
    for index, heads in heads_by_layer.items():
        attention = blocks[index].attention
        encoding = attention.position_encoding
        if encoding.gaussian() is None:
            raise ValueError(f"Block {index}'s {attention.encoding!r} encoding has no Gaussian heads to reset.")
        if not encoding.gaussian_weights():
            raise ValueError(f"Block {index}'s {attention.encoding!r} encoding names no gaussian_weights() (its "
                             "centers and spreads, heads first) to reset.")
        fresh = attention.encoding_spec.create(attention, attention.input_dim)
        fresh.build()
        for weight, initial in zip(encoding.gaussian_weights(), fresh.gaussian_weights()):
            value = np.array(ops.convert_to_numpy(weight))
            value[heads] = np.asarray(ops.convert_to_numpy(initial))[heads]
            weight.assign(value)
