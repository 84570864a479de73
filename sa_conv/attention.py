"""Multi-head self-attention over 2-D feature maps with relative positional encodings: the
paper's Eq. (5)-(6) (`MultiHeadSelfAttention2D`).

The layer holds the logits and the one call path; how Eq. (6)'s weighted sum is computed (dense,
separable, with attention dropout) is the aggregation object of `sa_conv.aggregation`.
"""

import keras
import numpy as np
from keras import ops

from sa_conv import aggregation, seeded_dropout
from sa_conv.attention_init import get_attention_init
from sa_conv.encodings import get_encoding
from sa_conv.encodings.base import FROZEN_PREFIX
from sa_conv.initializers import INITIALIZATIONS, bias_for, clone_initializer, dense_initializers

__all__ = ["MultiHeadSelfAttention2D"]


def scores_spec(input_shape, num_heads):
    """The attention scores' `keras.KerasTensor` for inputs ``(batch, H, W, D)``: ``(batch, heads, H*W, H*W)``
    float32, what a layer called with ``return_attention_scores=True`` returns beside its outputs."""
    batch, height, width, _ = input_shape
    n = None if height is None or width is None else height * width
    return keras.KerasTensor((batch, num_heads, n, n), dtype="float32")


@keras.saving.register_keras_serializable(package="sa_conv")
class MultiHeadSelfAttention2D(keras.layers.Layer):
    """Multi-head self-attention (MHSA) over a 2-D grid, the paper's Eq. (5)-(6)::

        MHSA(X)_q = sum_h sum_k softmax_k(A_h[q, :]) X_k W^(h) + b

    Every head attends with softmax over all ``H*W`` keys of each query pixel and averages the
    full ``D``-dimensional input ``X`` (no per-head value projection); the heads are merged by one
    dense map from ``heads * D`` to ``output_dim`` (the paper's ``W^(h)``, stacked), with bias.

    ``encoding``: any name registered in `sa_conv.encodings.ENCODINGS` (each one's equation is in
    its class); the paper presets use ``quadratic`` (Eq. 9), ``quadratic_full``, ``learned`` and
    ``content_plus_learned_bias``. Content encodings get per-head queries and keys of size ``D``
    (maps ``D -> heads * D``, built only for them); position-only ones compute their
    probabilities ``(heads, N, N)`` once per call, shared by the batch.

    **One call path.** `call` computes the logits (`attention_logits`), their softmax over keys,
    and hands the probabilities to `_compute_attention`, which applies the aggregation chosen
    once per grid (`sa_conv.aggregation.choose`): the dense sum of Eq. (6), or for separable
    position-only encodings the exact separable sum, ``O(N (H + W))`` per head and channel
    (``fast_position_attention``: ``"auto"``, True or False). Attention dropout (training only,
    a mask per example) is drawn from a seed: the layer's own, or ``dropout_seed`` (what
    `TransformerBlock` passes, so a rematerialized block draws the same mask again). Serving
    copies are built from trained layers by `sa_conv.serving`.

    Args:
      num_heads: number of heads ``N_h``.
      output_dim: output channels; defaults to the input channels ``D``.
      encoding: a name registered in `ENCODINGS`, or ``"frozen:NAME"``: the serving form of
        ``NAME`` (`sa_conv.encodings.frozen`, what `sa_conv.freeze_for_inference` builds).
      max_grid_size: largest grid side ``P`` for the learned encodings.
      position_embedding_dim: embedding size ``E`` of ``"learned"``; defaults to ``D``.
      attention_dropout: dropout rate on the attention probabilities.
      center_init_std, spread_init_std: initialization of the quadratic encodings.
      kernel_initializer, bias_initializer: for the dense maps (cloned for each one).
      initializer_range: std of the learned embeddings' normal initialization.
      seed: makes the encoding's initialization and the attention dropout deterministic.
      encoding_options: further arguments of the encoding, e.g. ``{"hidden_units": 64,
        "depth": 3}`` for ``"mlp"``.
      recompute_gradient: a gradient that recomputes rather than keeps (the separable sum head by
        head; the dropped dense sum's mask from its seed): less memory, slower steps; what a
        rematerialized `TransformerBlock` sets.
      attention_init: how attention starts (`sa_conv.attention_init`): ``"random"`` (the
        encoding's own initializers), ``"convolutional"`` (every head at one shift of the
        ``K x K`` grid with logits ``-locality_strength ||delta - Delta_h||^2``: Theorem 1's
        construction; position-only encodings and ``gated``) or ``"mimetic"`` (content
        attention's query-key products near a scaled identity, Trockman & Kolter 2023).
      locality_strength: ``alpha`` of the convolutional initialization (ConViT's 1 by default;
        at 10 and above each head starts on its one pixel).
      locality_distance: spacing of the convolutional initialization's grid, in pixels.
      initialization: None (the initializer arguments decide), ``"reference"`` (the reference
        implementation's PyTorch defaults: dense weights and biases ``U(+-1/sqrt(fan_in))``,
        learned tables ``N(0, 1)``) or ``"bert"`` (``N(0, initializer_range)``, zero biases);
        see `sa_conv.initializers`. When set, it overrides the initializer arguments.

    Call arguments:
      inputs: ``(batch, H, W, D)`` with static ``H`` and ``W``.
      training: whether attention dropout is active.
      dropout_seed: the seed of the attention-dropout mask in training (None: the layer draws
        one from its ``attention_dropout`` seed generator).
      return_attention_scores: also return the attention probabilities,
        ``(batch, heads, H*W, H*W)`` float32, indexed ``[b, h, query, key]`` with pixels
        flattened row-major.

    Returns:
      ``(batch, H, W, output_dim)``, or ``(output, probabilities)``.
    """

    # Constructor arguments that `get_config` returns as they are stored.
    _CONFIG = ("num_heads", "output_dim", "encoding", "max_grid_size", "position_embedding_dim", "attention_dropout",
               "center_init_std", "spread_init_std", "initializer_range", "seed", "fast_position_attention",
               "initialization", "recompute_gradient", "attention_init", "locality_strength", "locality_distance")

    def __init__(self, num_heads, output_dim=None, encoding="quadratic", max_grid_size=16, position_embedding_dim=None,
                 attention_dropout=0.0, center_init_std=2.0, spread_init_std=0.01, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", initializer_range=0.02, seed=None, fast_position_attention="auto",
                 encoding_options=None, initialization=None, recompute_gradient=False, attention_init="random",
                 locality_strength=1.0, locality_distance=1.0, **kwargs):
        super().__init__(**kwargs)
        if initialization is not None and initialization not in INITIALIZATIONS:
            raise ValueError(f"initialization must be None or one of {INITIALIZATIONS}, got {initialization!r}.")
        self.initialization = initialization
        if initialization is not None:  # it decides every initializer of the layer
            initializers = dense_initializers(initialization, initializer_range)
            kernel_initializer, bias_initializer = initializers["kernel_initializer"], initializers["bias_initializer"]
        self.encoding_spec = get_encoding(encoding)
        self.encoding_options = dict(encoding_options or {})
        if int(num_heads) < 1:
            raise ValueError(f"num_heads must be positive, got {num_heads}.")
        if output_dim is not None and int(output_dim) < 1:
            raise ValueError(f"output_dim must be positive, got {output_dim}.")
        if not 0.0 <= float(attention_dropout) < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}.")
        if fast_position_attention not in ("auto", True, False):
            raise ValueError(f"fast_position_attention must be 'auto', True or False, got {fast_position_attention!r}.")
        self.num_heads = int(num_heads)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.encoding = self.encoding_spec.name
        self.max_grid_size = int(max_grid_size)
        self.position_embedding_dim = position_embedding_dim
        self.attention_dropout = float(attention_dropout)
        self.center_init_std = float(center_init_std)
        self.spread_init_std = float(spread_init_std)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        self.fast_position_attention = fast_position_attention
        self.recompute_gradient = bool(recompute_gradient)
        self.attention_init = attention_init
        self.locality_strength = float(locality_strength)
        self.locality_distance = float(locality_distance)
        self._initializer = get_attention_init(attention_init, self.locality_strength, self.locality_distance,
                                               seed=self.sublayer_seed(1))
        self._initializer.check(self.encoding_spec)
        # Holds the seed generator of the attention-dropout masks (`dropout_seed`).
        self.dropout = keras.layers.Dropout(self.attention_dropout, seed=seed, name="attention_dropout")
        self._aggregations = {}

    @property
    def position_only(self):
        """Whether the logits depend on positions only (shared by the batch)."""
        return self.encoding_spec.position_only

    def sublayer_seed(self, index):
        """A seed for the ``index``-th seeded sublayer, or None when the layer is unseeded."""
        return None if self.seed is None else int(self.seed) * 1009 + 17 * (index + 1)

    def _dense(self, units, name, fan_in):
        return keras.layers.Dense(
            units, name=name, kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=bias_for(self.bias_initializer, fan_in), dtype=self.dtype_policy,
        )

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"{type(self).__name__} expects inputs of shape (batch, height, width, channels), "
                f"got rank {len(input_shape)}: {tuple(input_shape)}."
            )
        d = input_shape[-1]
        if d is None:
            raise ValueError("The channel dimension of the input must be known.")
        self.input_dim = int(d)
        heads = self.num_heads
        self.position_encoding = self.encoding_spec.create(self, self.input_dim)
        if not self.position_only:
            # Per-head query and key size: D, or what the encoding asks for (gated: D / heads).
            self.query_key_dim = int(getattr(self.position_encoding, "query_dim", self.input_dim))
            self.query_dense = self._dense(heads * self.query_key_dim, "query", self.input_dim)
            self.query_dense.build(input_shape)
            if self.position_encoding.maps_keys:
                self.key_dense = self._dense(heads * self.query_key_dim, "key", self.input_dim)
                self.key_dense.build(input_shape)
        self.position_encoding.build(input_shape)
        # The heads' W^(h) stacked: (heads * D, output_dim), rows ordered [head, channel].
        self.value_dense = self._dense(self.output_dim or self.input_dim, "value", heads * self.input_dim)
        self.value_dense.build(tuple(input_shape[:-1]) + (heads * self.input_dim,))
        self._initializer.apply(self)
        if None not in tuple(input_shape[1:3]):
            self.aggregation_for(tuple(input_shape[1:3]))

    def aggregation_for(self, grid=None):
        """The aggregation of Eq. (6) on a ``grid`` ``(H, W)`` (`sa_conv.aggregation.choose`), chosen once per grid."""
        if grid not in self._aggregations:
            self._aggregations[grid] = aggregation.choose(
                self.encoding_spec, self.fast_position_attention, grid, self.attention_dropout,
                self.recompute_gradient)
        return self._aggregations[grid]

    def uses_fast_path(self, training=False, grid=None):
        """Whether a call with this ``training`` flag on a ``grid`` ``(H, W)`` runs the separable
        sum (``grid`` matters only for ``"auto"``; None: assume it pays)."""
        return self.aggregation_for(grid).takes_factors(dropout=bool(training) and self.attention_dropout > 0)

    def no_weight_decay(self):
        """The layer's variables that take no weight decay: its encoding's (``no_weight_decay``)."""
        return self.position_encoding.no_weight_decay()

    def value_kernel_per_head(self):
        """The heads' value maps ``W^(h)`` as ``(heads, D, output_dim)`` (Eq. 6)."""
        return ops.reshape(aggregation.float_kernel(self.value_dense), (self.num_heads, self.input_dim, -1))

    def set_value_map(self, kernel_per_head, bias=None):
        """Sets ``W^(h)`` from ``(heads, D, output_dim)`` and the output bias (None: zeros)."""
        kernel = ops.convert_to_tensor(kernel_per_head, "float32")
        expected = (self.num_heads, self.input_dim, self.value_dense.units)
        if tuple(kernel.shape) != expected:
            raise ValueError(f"kernel_per_head must have shape {expected}, got {tuple(kernel.shape)}.")
        self.value_dense.kernel.assign(ops.reshape(kernel, (-1, expected[-1])))
        self.value_dense.bias.assign(ops.zeros((expected[-1],)) if bias is None else ops.convert_to_tensor(bias, "float32"))

    def _check_grid(self, inputs):
        _, height, width, _ = inputs.shape
        if height is None or width is None:
            raise ValueError(
                f"{type(self).__name__} needs a static grid size; got height={height}, "
                f"width={width}. Give the model input a fixed spatial shape."
            )
        return height, width

    def attention_logits(self, inputs, factored=False):
        """Eq. (5)'s logits: float32 ``(heads, N, N)`` (position only, shared by the batch) or
        ``(batch, heads, N, N)`` (content attention: in the compute dtype as trained, float32 in a
        serving copy's query-major forms); with ``factored``, a separable encoding's row and
        column terms (`sa_conv.aggregation.Factors`)."""
        height, width = self._check_grid(inputs)
        if self.position_only:
            if factored:
                return aggregation.Factors(*self.position_encoding.factor_logits(height, width))
            return self.position_encoding.logits(height, width)
        return self.position_encoding.logits(height, width, *self.queries_and_keys(inputs))

    def queries_and_keys(self, inputs):
        """Content attention's per-head queries and keys, each ``(batch, heads, N, d)``, or
        ``(batch, N, heads, d)`` for a ``query_major`` encoding; where the encoding maps no keys
        (``maps_keys``), the keys are the input pixels ``(batch, N, D)``."""
        heads, d = self.num_heads, self.query_key_dim
        n = inputs.shape[1] * inputs.shape[2]
        layout = (lambda t: t) if self.position_encoding.query_major else (lambda t: ops.transpose(t, (0, 2, 1, 3)))
        q = layout(ops.reshape(self.query_dense(inputs), (-1, n, heads, d)))
        if not self.position_encoding.maps_keys:
            return q, ops.reshape(ops.cast(inputs, q.dtype), (-1, n, inputs.shape[-1]))
        return q, layout(ops.reshape(self.key_dense(inputs), (-1, n, heads, d)))

    def attention_probabilities(self, inputs, factored=False):
        """Eq. (5)'s probabilities, in `attention_logits`' dtype: the softmax over keys of
        `attention_logits`, or for content attention what its encoding makes of the queries and
        keys (`RelativeEncoding.probabilities`: that softmax, or a mixture of two, ``gated``,
        whose `aggregation.Mixture` holds the content softmax in the compute dtype and its weights
        and positional part in float32)."""
        height, width = self._check_grid(inputs)
        if self.position_only:
            if factored:  # a tuple from an encoding that writes its own
                return aggregation.Factors(*self.position_encoding.factor_probabilities(height, width))
            return self.position_encoding.probabilities(height, width)
        if factored:  # the parts its aggregation sums without forming P (gated: a Mixture)
            return self.position_encoding.factor_probabilities(height, width, *self.queries_and_keys(inputs))
        return self.position_encoding.probabilities(height, width, *self.queries_and_keys(inputs))

    def call(self, inputs, training=None, return_attention_scores=False, dropout_seed=None):
        if training and self.position_encoding.serves_only:
            raise ValueError(
                f"{self.name} is a serving copy (encoding {self.encoding!r}, made by sa_conv.freeze_for_inference): it "
                "serves, it does not train. Train the model it was made from, then freeze that again.")
        grid = self._check_grid(inputs)
        if not (training and self.attention_dropout > 0):
            dropout_seed = None
        elif dropout_seed is None:
            dropout_seed = seeded_dropout.after(self.dropout.seed_generator.next(), inputs)
        factored = self.aggregation_for(grid).takes_factors(dropout=dropout_seed is not None)
        probabilities = self.attention_probabilities(inputs, factored)
        outputs = self._compute_attention(inputs, probabilities, dropout_seed)
        if not return_attention_scores:
            return outputs
        return outputs, ops.cast(self.aggregation_for(grid).scores(probabilities, ops.shape(inputs)[0]), "float32")

    def _compute_attention(self, inputs, probabilities, dropout_seed=None):
        """Eq. (6), ``sum_h Dropout(P_h) X W^(h) + b``, by the layer's aggregation.

        Args:
          inputs: ``X``, ``(batch, H, W, D)``.
          probabilities: ``P`` as `attention_probabilities` gives them.
          dropout_seed: the seed of the attention-dropout mask, or None (no dropout).

        Returns:
          ``(batch, H, W, output_dim)``.
        """
        return self.aggregation_for(tuple(inputs.shape[1:3]))(
            inputs, probabilities, self.value_dense, self.compute_dtype, dropout_seed)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False, dropout_seed=None):
        outputs = keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.compute_dtype)
        return (outputs, scores_spec(inputs.shape, self.num_heads)) if return_attention_scores else outputs

    def get_config(self):
        return {**super().get_config(), **{name: getattr(self, name) for name in self._CONFIG},
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "encoding_options": self.encoding_options or None}
