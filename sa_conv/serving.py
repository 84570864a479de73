"""Serving copies of trained models: what inference no longer needs to compute, computed once.

`freeze_for_inference(model)` walks a trained model's layers and builds, for each, the layer that
serves it:

* a `TransformerBlock` becomes a `ServingTransformerBlock`, whose attention's value map holds the
  product of the trained value map and the block's ``attention_output`` map (two linear maps in a
  row in inference: ``W_v W_o`` with bias ``b_v W_o + b_o``, one map of ``heads * D x D`` instead
  of that and a ``D x D`` one per pixel);
* its attention becomes a `MultiHeadSelfAttention2D` with its encoding's serving form
  (``encoding="frozen:NAME"``, `sa_conv.encodings.frozen`), which holds the input-independent part
  as constants (Eq. 5's probabilities of position-only encodings, dense or separable; a position
  bias, with the query and key maps folded into one, `fold_query_key`; gated attention's positional
  half): an export carries them, not their computation. Without a serving form, a copy serves;
* every `BatchNormalization` that follows a linear `Conv2D` alone (the ResNet's) is folded into it;
* under a mixed policy (e.g. ``"mixed_bfloat16"``), the model's own `Conv2D` and `Dense` layers
  hold their weights in the compute dtype, rounded once instead of cast on every call.

Which form serves an attention layer is its encoding's to say (``serving_form``); serving copies
only serve (they refuse ``training=True``).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from sa_conv import aggregation
from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.encodings.base import FROZEN_PREFIX
from sa_conv.models import copy_weights, is_frozen
from sa_conv.separable import separable_pays_with_constants
from sa_conv.transformer import ServingTransformerBlock, TransformerBlock

__all__ = ["ServingTransformerBlock", "fold_query_key", "freeze_for_inference", "is_frozen", "probability_constants",
           "separable_pays_with_constants", "serving_attention", "summary"]


def fold_query_key(query_kernel, query_bias, key_kernel, num_heads):
    """The query and key maps of content attention folded into one map for serving.

    ``q_h . k_h = x_q Wq_h Wk_h^T x_k^T + x_q Wq_h bk_h + bq_h Wk_h^T x_k^T + bq_h . bk_h``; the
    second and last terms are the same for every key of a query, so the softmax over keys removes
    them, and what is left is ``(x_q M_h + u_h) . x_k`` with ``M_h = Wq_h Wk_h^T`` ``(D, D)`` and
    ``u_h = Wk_h bq_h`` ``(D,)``: one map ``D -> heads * D`` of the query pixel against the raw
    key pixel.

    Args:
      query_kernel, key_kernel: ``(D, heads * d)``, columns ordered ``[head, channel]``.
      query_bias: ``(heads * d,)`` (None: zeros). The key bias drops out.
      num_heads: the heads.

    Returns:
      ``(kernel (D, heads * D), bias (heads * D,))``, float64 NumPy, columns ``[head, channel]``.
    """
    wq = np.asarray(query_kernel, np.float64)
    wk = np.asarray(key_kernel, np.float64)
    dim = wq.shape[0]
    wq, wk = wq.reshape(dim, num_heads, -1), wk.reshape(dim, num_heads, -1)
    bq = np.zeros(wq.shape[1:]) if query_bias is None else np.asarray(query_bias, np.float64).reshape(num_heads, -1)
    kernel = np.einsum("ihc,jhc->ihj", wq, wk).reshape(dim, -1)  # [input, head, key channel]
    bias = np.einsum("jhc,hc->hj", wk, bq).reshape(-1)
    return kernel, bias


def _float64(variable, default=None):
    """``variable`` as a float64 NumPy array (``default`` when it is None): the folds compute
    with it before they cast once."""
    return default if variable is None else np.asarray(ops.convert_to_numpy(variable), np.float64)


def _assign(variable, value):
    variable.assign(ops.cast(np.asarray(value, np.float32), variable.dtype))


def _serving_attention_config(attention: MultiHeadSelfAttention2D, grid) -> dict:
    """The `MultiHeadSelfAttention2D` arguments of ``attention``'s serving layer on ``grid``: its
    encoding's serving form, with no dropout and the sum (dense or separable) decided here for
    constants; or, where the encoding has no serving form, ``attention``'s own."""
    config = {k: v for k, v in attention.get_config().items() if k not in ("name", "trainable", "dtype")}
    if attention.encoding_spec.serving_form is None:
        return config
    separably = aggregation.separable_with_constants(attention.encoding_spec, attention.fast_position_attention, grid)
    return {**config, "encoding": FROZEN_PREFIX + attention.encoding, "attention_dropout": 0.0,
            "fast_position_attention": separably,
            "recompute_gradient": False, "attention_init": "random", "initialization": None}


def _set_serving_weights(attention: MultiHeadSelfAttention2D, served: MultiHeadSelfAttention2D) -> None:
    """Fills the built serving layer ``served`` from the trained ``attention`` (all but the value
    map, which the block folds)."""
    if not served.position_encoding.serves_only:
        served.set_weights(attention.get_weights())  # the same class and config: the same weights in order
        return
    grid = served.position_encoding.grid
    served.position_encoding.set_constants(attention.position_encoding.frozen_constants(
        *grid, factored=served.uses_fast_path(grid=grid)))
    if served.position_only:
        return
    query, key = attention.query_dense, attention.key_dense
    if served.position_encoding.maps_keys:
        served.query_dense.set_weights(query.get_weights())
        served.key_dense.set_weights(key.get_weights())
        return
    kernel, bias = fold_query_key(_float64(aggregation.float_kernel(query)), _float64(query.bias) if query.use_bias
                                  else None, _float64(aggregation.float_kernel(key)), attention.num_heads)
    # The folded logits are scaled by 1/sqrt(D), the trained ones by 1/sqrt(d): the map takes the ratio.
    scale = np.sqrt(attention.input_dim / attention.query_key_dim)
    _assign(served.query_dense.kernel, kernel * scale)
    _assign(served.query_dense.bias, bias * scale)


def serving_attention(attention: MultiHeadSelfAttention2D, input_shape) -> MultiHeadSelfAttention2D:
    """The serving layer of a trained ``attention`` layer on inputs of ``input_shape``
    ``(batch, H, W, D)``, built, with ``attention``'s weights (its value map as it is)."""
    served = MultiHeadSelfAttention2D(name=attention.name, dtype=attention.dtype_policy,
                                      **_serving_attention_config(attention, tuple(input_shape[1:3])))
    served.build(input_shape)
    _set_serving_weights(attention, served)
    served.value_dense.set_weights(attention.value_dense.get_weights())
    return served


def _serving_block(block: TransformerBlock, input_shape) -> ServingTransformerBlock:
    """The built serving block of a trained ``block`` on inputs of ``input_shape``, with its
    weights and the folded value map (computed in float64, cast once)."""
    trained, output = block.attention.value_dense, block.attention_output
    kernel = _float64(aggregation.float_kernel(trained)) @ _float64(aggregation.float_kernel(output))
    served = ServingTransformerBlock(block.mlp_size, block.layer_norm_epsilon, name=block.name,
                                     dtype=block.dtype_policy, attention_config=_serving_attention_config(block.attention,
                                                                                tuple(input_shape[1:3])))
    served.build(input_shape)  # the attention inside the block's name scope: its weights' paths are the block's
    _set_serving_weights(block.attention, served.attention)
    for part in ("attention_norm", "intermediate", "output_dense", "output_norm"):
        getattr(served, part).set_weights(getattr(block, part).get_weights())
    bias = _float64(output.bias) if output.use_bias else np.zeros(kernel.shape[1])
    if trained.use_bias:
        bias = bias + _float64(trained.bias) @ _float64(output.kernel)
    _assign(served.attention.value_dense.kernel, kernel)
    _assign(served.attention.value_dense.bias, bias)
    return served


def _serving_blocks(model):
    return [layer for layer in model.layers if isinstance(layer, ServingTransformerBlock)]


def probability_constants(model: keras.Model) -> list:
    """The variables of a serving copy that hold attention probabilities (each frozen encoding
    names its own; a position bias or an attention served as trained holds none)."""
    return [variable for block in _serving_blocks(model)
            for variable in block.attention.position_encoding.probability_constants()]


def summary(model: keras.Model) -> dict:
    """What a serving copy computed once: ``attention_constants`` (per block with constants,
    ``"dense"`` or ``"separable"``: the form its attention reads) and ``maps_folded`` (how many
    ``attention_output`` and ``query_key`` folds)."""
    blocks = _serving_blocks(model)
    frozen = [b.attention for b in blocks if b.attention.position_encoding.serves_only]
    return {"attention_constants": ["separable" if a.uses_fast_path(grid=a.position_encoding.grid) else "dense"
                                    for a in frozen],
            "maps_folded": {"attention_output": len(blocks),
                            "query_key": sum(not a.position_encoding.maps_keys for a in frozen)}}


def _convolutions_before_batch_norm(model: keras.Model) -> dict:
    """``{batch_norm_name: conv_name}`` for each `BatchNormalization` (over the last axis) whose
    only input is a linear `Conv2D` that feeds nothing else: the pairs inference can fold."""
    def tensors(value):  # the serialized Keras tensors among a node's arguments
        if isinstance(value, (list, tuple)):
            return [t for item in value for t in tensors(item)]
        is_tensor = isinstance(value, dict) and value.get("class_name") == "__keras_tensor__"
        return [value["config"]["keras_history"][0]] if is_tensor else []

    consumers, sources = {}, {}
    for entry in model.get_config()["layers"]:
        for node in entry.get("inbound_nodes", []):
            for source in tensors(node.get("args", [])):
                consumers[source] = consumers.get(source, 0) + 1
                sources.setdefault(entry["name"], []).append(source)
    pairs = {}
    for layer in model.layers:
        if not isinstance(layer, keras.layers.BatchNormalization) or layer.axis not in (-1, 3):
            continue
        inputs = sources.get(layer.name, [])
        if len(inputs) != 1 or consumers[inputs[0]] != 1:
            continue
        conv = model.get_layer(inputs[0])
        if isinstance(conv, keras.layers.Conv2D) and conv.get_config()["activation"] == "linear":
            pairs[layer.name] = conv.name
    return pairs


def _folded_convolution(conv, batch_norm):
    """``(kernel, bias)`` of ``conv`` followed by ``batch_norm`` in inference:
    ``gamma (x * k + b - mean) / sqrt(var + eps) + beta``, in float64 before the cast."""
    channels = conv.kernel.shape[-1]
    scale = _float64(batch_norm.gamma, np.ones(channels)) / np.sqrt(
        _float64(batch_norm.moving_variance) + batch_norm.epsilon)
    bias = _float64(conv.bias, np.zeros(channels)) if conv.use_bias else np.zeros(channels)
    kernel = _float64(conv.kernel) * scale
    return kernel, (bias - _float64(batch_norm.moving_mean)) * scale + _float64(batch_norm.beta, np.zeros(channels))


def freeze_for_inference(model: keras.Model) -> keras.Model:
    """A copy of ``model`` for serving, built from its layers (see the module doc): serving blocks
    and attention, batch norms folded into their convolutions, and under a mixed policy the
    model's own `Conv2D` and `Dense` weights in the compute dtype.

    Same outputs as ``model(images, training=False)`` to float32 rounding; each attention sums
    densely or separably as pays with constant probabilities (`aggregation.separable_with_constants`:
    from 12x12, where training's rule says 8x8). The copy only serves; ``model`` is unchanged. The
    folds are computed in float64 and cast once.
    """
    if is_frozen(model):
        raise ValueError(f"{model.name} is already frozen for inference (it has serving blocks): freeze the trained "
                         "model it was made from.")
    folds = _convolutions_before_batch_norm(model)
    folded_convs = set(folds.values())

    def clone(layer):
        if isinstance(layer, TransformerBlock):
            return _serving_block(layer, layer.input.shape)
        config = layer.get_config()
        if layer.name in folded_convs:
            config = {**config, "use_bias": True}
        policy = layer.dtype_policy
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)) and policy.compute_dtype != policy.variable_dtype:
            config = {**config, "dtype": policy.compute_dtype}  # weights cast once, here
        return layer.__class__.from_config(config)

    def call(layer, *args, **kwargs):
        return args[0] if layer.name in folds else layer(*args, **kwargs)

    frozen = keras.models.clone_model(model, clone_function=clone, call_function=call if folds else None)
    blocks = tuple(f"{layer.name}/" for layer in model.layers if isinstance(layer, TransformerBlock))
    folded = set(folds) | folded_convs
    copy_weights(model, frozen, skip=lambda path: path.split("/")[0] in folded or path.startswith(blocks))
    for bn_name, conv_name in folds.items():
        kernel, bias = _folded_convolution(model.get_layer(conv_name), model.get_layer(bn_name))
        target = frozen.get_layer(conv_name)
        _assign(target.kernel, kernel)
        _assign(target.bias, bias)
    return frozen

