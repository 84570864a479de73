"""Serving copies of trained models: what inference no longer needs to compute, computed once.

`freeze_for_inference(model)` walks a trained model's layers and builds, for each, the layer that
serves it:

* a `TransformerBlock` becomes a `ServingTransformerBlock`, whose attention's value map holds the
  product of the trained value map and the block's ``attention_output`` map (two linear maps in a
  row in inference: ``W_v W_o`` with bias ``b_v W_o + b_o``, one map of ``heads * D x D`` instead
  of that and a ``D x D`` one per pixel);
* its position-only attention becomes a `PrecomputedAttention`, which holds the probabilities of
  Eq. (5) as constants (dense ``(heads, N, N)``, or the separable row and column factors) and
  computes only Eq. (6): a SavedModel, TFLite or ONNX export carries the probabilities, not their
  computation;
* its content attention with a position bias (``content_plus_learned_bias``: ``q . k / sqrt(D)``
  plus a position-only term) becomes a `FoldedContentAttention`, which holds the term as a
  constant and one query-key map instead of the query and key maps (`fold_query_key`);
  gated attention (``gated``) becomes a `PrecomputedGatedAttention`, which holds its gated
  positional probabilities as a constant; other content attention is copied as it is;
* every `BatchNormalization` that follows a linear `Conv2D` alone (the ResNet's) is folded into it;
* under a mixed policy (e.g. ``"mixed_bfloat16"``), the model's own `Conv2D` and `Dense` layers
  hold their weights in the compute dtype, rounded once instead of cast on every call.

The serving layers only serve (they refuse ``training=True``) and take no flag of the training
layers: what varies between them is which class serves, chosen once here. `.keras` files written
while serving was a set of flags of the training layers (``inference_constants``,
``fold_attention_output``) load as these classes (`legacy_serving_layer`).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from sa_conv import aggregation, separable
from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.encodings import GatedPositionalEncoding, get_encoding
from sa_conv.models import copy_weights
from sa_conv.transformer import TransformerBlock, exact_gelu

__all__ = ["FoldedContentAttention", "PrecomputedAttention", "PrecomputedGatedAttention", "ServingTransformerBlock", "fold_query_key",
           "freeze_for_inference", "is_frozen", "legacy_serving_layer", "probability_constants",
           "separable_pays_with_constants", "serving_attention", "summary"]


def _refuse_training(layer):
    raise ValueError(
        f"{layer.name} is a serving copy (sa_conv.freeze_for_inference): it serves, it does not train. Train the "
        "model it was made from, then freeze that again.")


def _static_grid(layer, input_shape):
    height, width = input_shape[1:3]
    if height is None or width is None:
        raise ValueError(f"{layer.name} serves precomputed attention for one grid: give the model input a fixed "
                         f"spatial shape (got {tuple(input_shape)}).")
    return int(height), int(width)


def _value_dense(layer, units):
    return keras.layers.Dense(units, name="value", dtype=layer.dtype_policy)


def separable_pays_with_constants(height, width):
    """Whether the separable sum pays on an ``H x W`` grid when the probabilities are constants:
    ``H * W >= 6 (H + W)`` (12x12 and larger). Precomputed probabilities make the dense sum
    cheaper than in training (no logits, no softmax per call): at 8x8 it measured faster at batch
    1 and 100 alike (``benchmarks/results/serving_aggregation.json``)."""
    return separable.separable_pays(height, width, threshold=6)


@keras.saving.register_keras_serializable(package="sa_conv")
class PrecomputedAttention(keras.layers.Layer):
    """Position-only attention from its probabilities, computed once: Eq. (6) only,
    ``sum_h P_h X W^(h) + b``.

    The probabilities ``P`` of Eq. (5) do not depend on the input: `set_probabilities` stores them
    (float32 constants, never autocast) in the form the aggregation reads, chosen when the layer is
    built on its grid by `sa_conv.aggregation.choose` with `separable_pays_with_constants` (the
    dense sum, or for separable encodings the separable one where it pays with constants).

    Args:
      num_heads: ``N_h``.
      output_dim: output channels (None: the input's).
      encoding: the trained layer's encoding (its name): whether its logits separate.
      fast_position_attention: the trained layer's setting (``"auto"``, True or False).

    Call: ``inputs`` ``(batch, H, W, D)`` on the grid it was built for; ``return_attention_scores``
    also returns ``(batch, heads, N, N)``. Returns ``(batch, H, W, output_dim)``.
    """

    def __init__(self, num_heads, output_dim=None, encoding="quadratic", fast_position_attention="auto", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.encoding = get_encoding(encoding).name
        self.fast_position_attention = fast_position_attention

    def build(self, input_shape):
        self.grid = _static_grid(self, input_shape)
        height, width = self.grid
        self.input_dim = int(input_shape[-1])
        self.aggregation = aggregation.choose(get_encoding(self.encoding), self.fast_position_attention, self.grid,
                                              pays=separable_pays_with_constants)
        n = height * width
        shapes = ({"row_probabilities": (self.num_heads, height, height),
                   "col_probabilities": (self.num_heads, width, width)} if self.factored
                  else {"probabilities": (self.num_heads, n, n)})
        self.constants = {name: self.add_weight(name=f"constant_{name}", shape=shape, initializer="zeros",
                                                trainable=False, autocast=False) for name, shape in shapes.items()}
        self.value_dense = _value_dense(self, self.output_dim or self.input_dim)
        self.value_dense.build(tuple(input_shape[:-1]) + (self.num_heads * self.input_dim,))

    @property
    def factored(self) -> bool:
        """Whether the probabilities are held as separable factors (needs a built layer)."""
        return self.aggregation.takes_factors(dropout=False)

    @property
    def probability_constants(self) -> list:
        """The variables holding attention probabilities (dense, or the row and column factors)."""
        return list(self.constants.values())

    def set_probabilities(self, probabilities):
        """Stores the probabilities: `sa_conv.aggregation.Factors` ``(heads, H, H)``,
        ``(heads, W, W)`` where the layer is `factored`, else dense ``(heads, N, N)``."""
        values = (dict(row_probabilities=probabilities.row, col_probabilities=probabilities.col) if self.factored
                  else {"probabilities": probabilities})
        for name, value in values.items():
            self.constants[name].assign(ops.cast(value, "float32"))

    def call(self, inputs, training=None, return_attention_scores=False):
        if training:
            _refuse_training(self)
        if tuple(inputs.shape[1:3]) != self.grid:
            raise ValueError(f"{self.name}'s probabilities are for a {self.grid} grid, got {tuple(inputs.shape[1:3])}.")
        c = self.constants
        probabilities = (aggregation.Factors(c["row_probabilities"], c["col_probabilities"]) if self.factored
                         else c["probabilities"])
        outputs = self.aggregation(inputs, probabilities, self.value_dense, self.compute_dtype)
        if not return_attention_scores:
            return outputs
        return outputs, aggregation.dense_probabilities(probabilities, ops.shape(inputs)[0])

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "output_dim": self.output_dim,
                "encoding": self.encoding, "fast_position_attention": self.fast_position_attention}


def _attend_query_major(layer, inputs, probabilities, return_attention_scores=False):
    """Eq. (6) of a serving layer whose probabilities are ``(batch, query, heads, key)`` (the
    layout in which the sum needs no transpose): ``layer.value_dense`` of the heads' weighted
    sums, ``(batch, H, W, output_dim)``, and with ``return_attention_scores`` the probabilities as
    ``(batch, heads, N, N)``."""
    _, height, width, d = inputs.shape
    x = ops.reshape(ops.cast(inputs, layer.compute_dtype), (-1, height * width, d))
    mixed = ops.einsum("bqhk,bkd->bqhd", ops.cast(probabilities, layer.compute_dtype), x)
    outputs = layer.value_dense(ops.reshape(mixed, (-1, height, width, layer.num_heads * d)))
    if not return_attention_scores:
        return outputs
    return outputs, ops.transpose(probabilities, (0, 2, 1, 3))


@keras.saving.register_keras_serializable(package="sa_conv")
class FoldedContentAttention(keras.layers.Layer):
    """Content attention whose logits are ``q . k / sqrt(D)`` plus a position-only term, served
    from one query-key map and the term as a constant:
    ``logits_h[q, k] = (x_q M_h + u_h) . x_k / sqrt(D) + b_h[q, k]`` (`fold_query_key`), then the
    softmax over keys (Eq. 5) and Eq. (6).

    The logits differ from the trained layer's by a constant per query, which the softmax removes:
    the probabilities are the same to float32 rounding. Computed in the ``(batch, query, head,
    key)`` layout, in which the aggregation needs no transpose.

    Call: ``inputs`` ``(batch, H, W, D)`` on the grid it was built for. Returns
    ``(batch, H, W, output_dim)`` (and ``(batch, heads, N, N)`` with ``return_attention_scores``).
    """

    def __init__(self, num_heads, output_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.output_dim = None if output_dim is None else int(output_dim)

    def build(self, input_shape):
        self.grid = _static_grid(self, input_shape)
        self.input_dim = d = int(input_shape[-1])
        n = self.grid[0] * self.grid[1]
        self.query_key = keras.layers.Dense(self.num_heads * d, name="query_key", dtype=self.dtype_policy)
        self.query_key.build(input_shape)
        self.position_logits = self.add_weight(name="constant_position_logits", shape=(n, self.num_heads, n),
                                               initializer="zeros", trainable=False, autocast=False)
        self.value_dense = _value_dense(self, self.output_dim or d)
        self.value_dense.build(tuple(input_shape[:-1]) + (self.num_heads * d,))

    @property
    def probability_constants(self) -> list:
        """None: its constant is a term of the logits, not probabilities."""
        return []

    def logits(self, inputs):
        """``(batch, N, heads, N)`` (query, head, key), float32."""
        _, height, width, d = inputs.shape
        n, heads = height * width, self.num_heads
        queries = ops.reshape(self.query_key(inputs), (-1, n, heads, d))
        x = ops.reshape(ops.cast(inputs, queries.dtype), (-1, n, d))
        content = ops.cast(ops.einsum("bqhd,bkd->bqhk", queries, x), "float32") / math.sqrt(d)
        return content + self.position_logits[None]

    def call(self, inputs, training=None, return_attention_scores=False):
        if training:
            _refuse_training(self)
        probabilities = ops.softmax(self.logits(inputs), axis=-1)  # (batch, query, heads, key)
        return _attend_query_major(self, inputs, probabilities, return_attention_scores)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "output_dim": self.output_dim}


@keras.saving.register_keras_serializable(package="sa_conv")
class PrecomputedGatedAttention(keras.layers.Layer):
    """Gated attention (``gated``, `sa_conv.encodings.GatedPositionalEncoding`) with its positional
    half computed once: ``P_h = (1 - g_h) softmax_k(q_h . k_h / sqrt(d)) + C_h``, where the
    constant ``C_h = g_h softmax_k(-alpha_h ||delta - Delta_h||^2)`` holds the gate and the
    positional softmax, and ``1 - g_h`` is a constant per head; then Eq. (6). The query and key
    maps are the trained ones (``d = D / heads`` channels per head: folding them into one
    ``D x D`` map per head would cost more than it saves).

    Computed in the ``(batch, query, head, key)`` layout, like `FoldedContentAttention`.
    Call: ``inputs`` ``(batch, H, W, D)`` on the grid it was built for. Returns
    ``(batch, H, W, output_dim)`` (and ``(batch, heads, N, N)`` with ``return_attention_scores``).
    """

    def __init__(self, num_heads, query_dim, output_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.query_dim = int(query_dim)
        self.output_dim = None if output_dim is None else int(output_dim)

    def build(self, input_shape):
        self.grid = _static_grid(self, input_shape)
        self.input_dim = d = int(input_shape[-1])
        n, heads = self.grid[0] * self.grid[1], self.num_heads
        self.query_dense = keras.layers.Dense(heads * self.query_dim, name="query", dtype=self.dtype_policy)
        self.key_dense = keras.layers.Dense(heads * self.query_dim, name="key", dtype=self.dtype_policy)
        self.query_dense.build(input_shape)
        self.key_dense.build(input_shape)
        self.positional = self.add_weight(name="constant_gated_positional_probabilities", shape=(n, heads, n),
                                          initializer="zeros", trainable=False, autocast=False)
        self.content_weights = self.add_weight(name="constant_content_weights", shape=(heads,), initializer="zeros",
                                               trainable=False, autocast=False)
        self.value_dense = _value_dense(self, self.output_dim or d)
        self.value_dense.build(tuple(input_shape[:-1]) + (heads * d,))

    @property
    def probability_constants(self) -> list:
        """``C``: the gated positional probabilities."""
        return [self.positional]

    def set_constants(self, encoding, height, width):
        """``C`` and ``1 - g`` from the trained ``encoding``."""
        gates = encoding.gates()
        positional = ops.reshape(gates, (-1, 1, 1)) * encoding.positional_probabilities(height, width)
        self.positional.assign(ops.cast(ops.transpose(positional, (1, 0, 2)), "float32"))
        self.content_weights.assign(ops.cast(1.0 - gates, "float32"))

    def probabilities(self, inputs):
        """``(batch, N, heads, N)`` (query, head, key), float32."""
        _, height, width, _ = inputs.shape
        n, heads, d = height * width, self.num_heads, self.query_dim
        queries = ops.reshape(self.query_dense(inputs), (-1, n, heads, d))
        keys = ops.reshape(self.key_dense(inputs), (-1, n, heads, d))
        content = ops.cast(ops.einsum("bqhd,bkhd->bqhk", queries, keys), "float32") / math.sqrt(d)
        weights = ops.reshape(self.content_weights, (1, 1, -1, 1))
        return weights * ops.softmax(content, axis=-1) + self.positional[None]

    def call(self, inputs, training=None, return_attention_scores=False):
        if training:
            _refuse_training(self)
        if tuple(inputs.shape[1:3]) != self.grid:
            raise ValueError(f"{self.name}'s positional probabilities are for a {self.grid} grid, got "
                             f"{tuple(inputs.shape[1:3])}.")
        return _attend_query_major(self, inputs, self.probabilities(inputs), return_attention_scores)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "query_dim": self.query_dim,
                "output_dim": self.output_dim}


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


def _folds_query_key(attention):
    return not attention.position_only and attention.encoding_spec.has_position_bias


def _unbuilt_serving_attention(attention: MultiHeadSelfAttention2D) -> keras.layers.Layer:
    """The class that serves ``attention``, unbuilt: `PrecomputedAttention` (position only),
    `FoldedContentAttention` (content with a position bias) or a copy of ``attention``."""
    common = dict(num_heads=attention.num_heads, output_dim=attention.output_dim, name=attention.name,
                  dtype=attention.dtype_policy)
    if attention.position_only:
        return PrecomputedAttention(encoding=attention.encoding, fast_position_attention=attention.fast_position_attention,
                                    **common)
    if _folds_query_key(attention):
        return FoldedContentAttention(**common)
    if isinstance(attention.position_encoding, GatedPositionalEncoding):
        return PrecomputedGatedAttention(query_dim=attention.query_key_dim, **common)
    return MultiHeadSelfAttention2D.from_config(attention.get_config())


def _set_serving_weights(attention: MultiHeadSelfAttention2D, layer: keras.layers.Layer) -> None:
    """Fills the built serving ``layer`` of ``attention`` from ``attention``'s weights."""
    if isinstance(layer, MultiHeadSelfAttention2D):
        layer.set_weights(attention.get_weights())  # the same class and config: the same weights in order
        return
    height, width = layer.grid
    if isinstance(layer, PrecomputedAttention):
        layer.set_probabilities(attention.attention_probabilities(
            ops.zeros((1, height, width, attention.input_dim)), factored=layer.factored))
    elif isinstance(layer, PrecomputedGatedAttention):
        layer.query_dense.set_weights(attention.query_dense.get_weights())
        layer.key_dense.set_weights(attention.key_dense.get_weights())
        layer.set_constants(attention.position_encoding, height, width)
    else:
        query, key = attention.query_dense, attention.key_dense
        kernel, bias = fold_query_key(_float64(query.kernel), _float64(query.bias) if query.use_bias else None,
                                      _float64(key.kernel), attention.num_heads)
        _assign(layer.query_key.kernel, kernel)
        _assign(layer.query_key.bias, bias)
        position = attention.position_encoding.position_logits(height, width)
        layer.position_logits.assign(ops.cast(ops.transpose(position, (1, 0, 2)), "float32"))
    layer.value_dense.set_weights(attention.value_dense.get_weights())


def serving_attention(attention: MultiHeadSelfAttention2D, input_shape) -> keras.layers.Layer:
    """The serving layer of a trained ``attention`` layer on inputs of ``input_shape``
    ``(batch, H, W, D)``, built, with ``attention``'s weights: a `PrecomputedAttention` (position
    only), a `FoldedContentAttention` (content with a position bias) or a copy of ``attention``."""
    layer = _unbuilt_serving_attention(attention)
    layer.build(input_shape)
    _set_serving_weights(attention, layer)
    return layer


@keras.saving.register_keras_serializable(package="sa_conv")
class ServingTransformerBlock(keras.layers.Layer):
    """A `TransformerBlock` in inference, with its ``attention_output`` map folded into the
    attention's value map: ``y = LN(x + A(x))``, ``z = LN(y + Dense(GELU(Dense(y))))``, where
    ``A`` is the serving attention (`serving_attention`).

    Args:
      attention: the serving attention layer.
      mlp_size, layer_norm_epsilon: the trained block's.

    Sublayers: ``attention``, ``attention_norm``, ``intermediate``, ``output``, ``output_norm``.
    """

    def __init__(self, attention, mlp_size, layer_norm_epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        self.attention = attention
        self.mlp_size = int(mlp_size)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    @classmethod
    def from_block(cls, block: TransformerBlock, input_shape) -> "ServingTransformerBlock":
        """The built serving block of a trained ``block`` on inputs of ``input_shape``, with its
        weights and the folded value map (computed in float64, cast once)."""
        served = cls(_unbuilt_serving_attention(block.attention), block.mlp_size, block.layer_norm_epsilon,
                     name=block.name, dtype=block.dtype_policy)
        served.build(input_shape)  # the attention inside the block's name scope: its weights' paths are the block's
        attention = served.attention
        _set_serving_weights(block.attention, attention)
        for part in ("attention_norm", "intermediate", "output_dense", "output_norm"):
            getattr(served, part).set_weights(getattr(block, part).get_weights())
        trained, output = block.attention.value_dense, block.attention_output
        kernel = _float64(trained.kernel) @ _float64(output.kernel)
        bias = _float64(output.bias) if output.use_bias else np.zeros(kernel.shape[1])
        if trained.use_bias:
            bias = bias + _float64(trained.bias) @ _float64(output.kernel)
        _assign(attention.value_dense.kernel, kernel)
        _assign(attention.value_dense.bias, bias)
        return served

    def build(self, input_shape):
        hidden = input_shape[-1]
        if not self.attention.built:
            self.attention.build(input_shape)
        norm = keras.layers.LayerNormalization
        self.attention_norm = norm(epsilon=self.layer_norm_epsilon, name="attention_norm", dtype=self.dtype_policy)
        self.intermediate = keras.layers.Dense(self.mlp_size, name="intermediate", dtype=self.dtype_policy)
        self.output_dense = keras.layers.Dense(hidden, name="output", dtype=self.dtype_policy)
        self.output_norm = norm(epsilon=self.layer_norm_epsilon, name="output_norm", dtype=self.dtype_policy)
        self.attention_norm.build(input_shape)
        self.intermediate.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.mlp_size,))
        self.output_norm.build(input_shape)

    def call(self, inputs, training=None, return_attention_scores=False):
        if training:
            _refuse_training(self)
        attended = self.attention(inputs, training=False, return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, probabilities = attended
        x = self.attention_norm(inputs + attended)
        outputs = self.output_norm(x + self.output_dense(exact_gelu(self.intermediate(x))))
        return (outputs, probabilities) if return_attention_scores else outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "attention": keras.saving.serialize_keras_object(self.attention),
                "mlp_size": self.mlp_size, "layer_norm_epsilon": self.layer_norm_epsilon}


@keras.saving.register_keras_serializable(package="sa_conv", name="LegacyServingTransformerBlock")
class LegacyServingTransformerBlock(ServingTransformerBlock):
    """A `ServingTransformerBlock` read from a `.keras` file written while serving was the
    ``fold_attention_output`` flag of `TransformerBlock`. Keras finds a layer's weights in the file
    under its class name, so this class is named ``TransformerBlock``."""


LegacyServingTransformerBlock.__name__ = LegacyServingTransformerBlock.__qualname__ = "TransformerBlock"


def _legacy_attention(config):
    """The serving attention of a former ``MultiHeadSelfAttention2D`` config with
    ``inference_constants``."""
    spec = get_encoding(config["encoding"])
    common = {k: config[k] for k in ("num_heads", "output_dim", "name", "dtype", "trainable") if k in config}
    if spec.position_only:
        return PrecomputedAttention(encoding=spec.name, fast_position_attention=config.get("fast_position_attention",
                                                                                           "auto"), **common)
    return FoldedContentAttention(**common)


def legacy_serving_layer(cls, config):
    """For ``cls.from_config``: ``(layer, config)``, where ``layer`` is the serving layer of a
    `MultiHeadSelfAttention2D` or `TransformerBlock` config written while serving was a set of
    their flags (a layer with ``inference_constants``; a block with ``fold_attention_output``,
    which becomes a `ServingTransformerBlock` named so that the file's weights load), else None,
    and ``config`` without those flags."""
    config = dict(config)
    if "dtype" in config and isinstance(config["dtype"], dict):
        config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
    if cls is MultiHeadSelfAttention2D:
        return (_legacy_attention(config) if config.pop("inference_constants", False) else None), config
    attention = dict(config.get("attention_config") or {})
    constants = attention.pop("inference_constants", False)
    config["attention_config"] = attention
    if not config.pop("fold_attention_output", False):
        return None, config
    dtype = config.get("dtype")
    served = (_legacy_attention({**attention, "name": "attention", "dtype": dtype}) if constants
              else MultiHeadSelfAttention2D(name="attention", dtype=dtype, **attention))
    common = {k: config[k] for k in ("name", "dtype", "trainable") if k in config}
    return LegacyServingTransformerBlock(served, config["mlp_size"], config.get("layer_norm_epsilon", 1e-12),
                                         **common), config


def _blocks(model):
    return [layer for layer in model.layers if isinstance(layer, (TransformerBlock, ServingTransformerBlock))]


def is_frozen(model: keras.Model) -> bool:
    """Whether ``model`` is a serving copy (it has serving blocks)."""
    return any(isinstance(layer, ServingTransformerBlock) for layer in model.layers)


def probability_constants(model: keras.Model) -> list:
    """The variables of a serving copy that hold attention probabilities (each serving attention
    layer names its own; a copied content attention holds none)."""
    return [variable for layer in model.layers if isinstance(layer, ServingTransformerBlock)
            for variable in getattr(layer.attention, "probability_constants", [])]


def summary(model: keras.Model) -> dict:
    """What a serving copy computed once: ``attention_constants`` (per block with constants,
    ``"dense"`` or ``"separable"``: the form its precomputed attention reads) and ``maps_folded``
    (how many ``attention_output`` and ``query_key`` folds)."""
    blocks = [layer for layer in model.layers if isinstance(layer, ServingTransformerBlock)]
    constants = [("separable" if b.attention.factored else "dense") if isinstance(b.attention, PrecomputedAttention)
                 else "dense" for b in blocks if isinstance(b.attention, (PrecomputedAttention, FoldedContentAttention,
                                                                          PrecomputedGatedAttention))]
    return {"attention_constants": constants,
            "maps_folded": {"attention_output": len(blocks),
                            "query_key": sum(isinstance(b.attention, FoldedContentAttention) for b in blocks)}}


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

    Same outputs as ``model(images, training=False)`` to float32 rounding, on the same attention
    path (dense or separable) as ``model`` chooses for its grid. The copy only serves; ``model`` is
    unchanged. The folds are computed in float64 and cast once.
    """
    if is_frozen(model):
        raise ValueError(f"{model.name} is already frozen for inference (it has serving blocks): freeze the trained "
                         "model it was made from.")
    folds = _convolutions_before_batch_norm(model)
    folded_convs = set(folds.values())

    def clone(layer):
        if isinstance(layer, TransformerBlock):
            return ServingTransformerBlock.from_block(layer, layer.input.shape)
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
    blocks = tuple(f"{block.name}/" for block in _blocks(model))
    folded = set(folds) | folded_convs
    copy_weights(model, frozen, skip=lambda path: path.split("/")[0] in folded or path.startswith(blocks))
    for bn_name, conv_name in folds.items():
        kernel, bias = _folded_convolution(model.get_layer(conv_name), model.get_layer(bn_name))
        target = frozen.get_layer(conv_name)
        _assign(target.kernel, kernel)
        _assign(target.bias, bias)
    return frozen
