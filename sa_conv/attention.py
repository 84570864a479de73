"""Multi-head self-attention over 2-D feature maps with relative positional encodings: the
paper's Eq. (5)-(6) (`MultiHeadSelfAttention2D`).

The layer holds the maths; two modules beside it hold the speed and memory machinery: the exact
separable path of position-only encodings (`sa_conv.separable`) and dropout from seeds for
memory-lean training (`sa_conv.seeded_dropout`, used by `sa_conv.TransformerBlock`).
"""

import math

import keras
import numpy as np
from keras import ops

from sa_conv import seeded_dropout, separable
from sa_conv.encodings import get_encoding
from sa_conv.initializers import INITIALIZATIONS, bias_for, clone_initializer, dense_initializers

__all__ = ["MultiHeadSelfAttention2D", "fold_query_key"]


@keras.saving.register_keras_serializable(package="sa_conv")
class MultiHeadSelfAttention2D(keras.layers.Layer):
    """Multi-head self-attention (MHSA) over a 2-D grid, the paper's Eq. (5)-(6)::

        MHSA(X)_q = sum_h sum_k softmax_k(A_h[q, :]) X_k W^(h) + b

    Every head attends with softmax over all ``H*W`` keys of each query pixel and averages the
    full ``D``-dimensional input ``X`` (no per-head value projection); the heads are merged by one
    dense map from ``heads * D`` to ``output_dim`` (the paper's ``W^(h)``, stacked), with bias.

    Encodings (``encoding=``, any name registered in `sa_conv.encodings.ENCODINGS`); the paper
    presets use ``quadratic``, ``quadratic_full``, ``learned`` and ``content_plus_learned_bias``:

    * ``"quadratic"``: Gaussian, isotropic (paper Eq. 9), ``A_h = -alpha_h ||delta - Delta_h||^2``.
    * ``"quadratic_full"``: Gaussian with full covariance ``Sigma_h^-1 = A_h A_h^T``.
    * ``"learned"``: learned row and column offset embeddings, position only.
    * ``"content_plus_learned_bias"`` (the paper's "learned embedding w/ content", the
      reference's; formerly ``learned_plus_content``): ``q.k / sqrt(D) + b_h(delta)``, content
      logits plus the ``learned`` encoding's position-only logits.
    * ``"content_with_relative_keys"`` (Ramachandran et al., 2019; formerly
      ``learned_content``): ``(q.k + q.r_delta) / sqrt(D)``, row and column offset embeddings
      against each head's query.
    * ``"sinusoidal"``, ``"mlp"``: fixed sinusoidal features, or a small MLP, of the offset.

    The two content encodings have per-head queries and keys of size ``D`` (dense maps
    ``D -> heads * D``, built only for content-based encodings).

    The position-only encodings do not depend on the input: their probabilities
    ``(heads, H*W, H*W)`` are computed once per call and shared by the batch. Attention dropout
    (training only) draws an independent mask for every example.

    **Paths.** `_compute_attention` holds Eq. (5)-(6) as written, with dense ``(heads, N, N)``
    probabilities. For separable position-only encodings (``fast_position_attention``:
    ``"auto"``, the default, True or False) the same sum runs in ``O(N (H + W))`` per head and
    channel through `sa_conv.separable` (exact: the same output to float32 rounding), when no
    attention dropout is active and (for ``"auto"``) `separable.separable_pays` for the grid.
    `attend_with_dropout` applies attention dropout from a given mask or its seed, head by
    head (`sa_conv.seeded_dropout`), for `TransformerBlock`'s memory-lean training.

    **Serving.** Once trained, a position-only encoding's probabilities are constants. With
    ``inference_constants=True`` the layer holds them (dense ``(heads, N, N)``, or the separable
    factors) as non-trainable weights, filled by `update_constants`, and inference reads them
    instead of evaluating the encoding; such a layer only serves. `sa_conv.freeze_for_inference`
    makes that copy of a trained model. A content encoding whose logits are ``q . k / sqrt(D)``
    plus a position-only term (``content_plus_learned_bias``; the encoding's
    ``has_position_bias``) holds that term as a constant, and its query and key maps folded into
    one ``query_key`` map ``D -> heads * D`` (`fold_query_key`): the logits become
    ``(x_q M_h + u_h) . x_k / sqrt(D)``, one map of the input instead of two. They differ from the
    trained layer's by a constant per query, which the softmax over keys removes: the
    probabilities are the same to float32 rounding.

    Args:
      num_heads: number of heads ``N_h``.
      output_dim: output channels; defaults to the input channels ``D``.
      encoding: a name registered in `ENCODINGS`.
      max_grid_size: largest grid side ``P`` for the learned encodings.
      position_embedding_dim: embedding size ``E`` of ``"learned"``; defaults to ``D``.
      attention_dropout: dropout rate on the attention probabilities.
      center_init_std, spread_init_std: initialization of the quadratic encodings.
      kernel_initializer, bias_initializer: for the dense maps (cloned for each one).
      initializer_range: std of the learned embeddings' normal initialization.
      seed: makes the encoding's initialization and the attention dropout deterministic.
      encoding_options: further arguments of the encoding, e.g. ``{"hidden_units": 64,
        "depth": 3}`` for ``"mlp"``.
      inference_constants: hold the probabilities as constants for serving (position-only
        encodings), or the position term and a folded query-key map (content encodings with a
        position bias); see **Serving**.
      recompute_gradient: on the separable path, a gradient that keeps only the layer's input and
        recomputes the rest head by head (`sa_conv.separable`): less memory, slower steps; what
        a rematerialized `TransformerBlock` sets.
      initialization: None (the initializer arguments decide), ``"reference"`` (the reference
        implementation's PyTorch defaults: dense weights and biases ``U(+-1/sqrt(fan_in))``,
        learned tables ``N(0, 1)``) or ``"bert"`` (``N(0, initializer_range)``, zero biases);
        see `sa_conv.initializers`. When set, it overrides the initializer arguments.

    Call arguments:
      inputs: ``(batch, H, W, D)`` with static ``H`` and ``W``.
      training: whether attention dropout is active.
      return_attention_scores: also return the attention probabilities,
        ``(batch, heads, H*W, H*W)`` float32, indexed ``[b, h, query, key]`` with pixels
        flattened row-major.

    Returns:
      ``(batch, H, W, output_dim)``, or ``(output, probabilities)``.
    """

    def __init__(
        self,
        num_heads,
        output_dim=None,
        encoding="quadratic",
        max_grid_size=16,
        position_embedding_dim=None,
        attention_dropout=0.0,
        center_init_std=2.0,
        spread_init_std=0.01,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        initializer_range=0.02,
        seed=None,
        fast_position_attention="auto",
        encoding_options=None,
        initialization=None,
        inference_constants=False,
        recompute_gradient=False,
        **kwargs,
    ):
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
        self.num_heads = int(num_heads)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.encoding = self.encoding_spec.name  # a former name (ENCODING_ALIASES) saves as the current one
        self.max_grid_size = int(max_grid_size)
        self.position_embedding_dim = position_embedding_dim
        self.attention_dropout = float(attention_dropout)
        self.center_init_std = float(center_init_std)
        self.spread_init_std = float(spread_init_std)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.initializer_range = float(initializer_range)
        self.seed = seed
        if fast_position_attention not in ("auto", True, False):
            raise ValueError(f"fast_position_attention must be 'auto', True or False, got {fast_position_attention!r}.")
        self.fast_position_attention = fast_position_attention
        self.inference_constants = bool(inference_constants)
        self.recompute_gradient = bool(recompute_gradient)
        if self.inference_constants and not (self.position_only or self.encoding_spec.has_position_bias):
            raise ValueError(
                f"inference_constants: the {self.encoding!r} encoding's probabilities depend on the input; "
                "only position-only encodings (and content encodings with a position bias) have constants to hold.")
        self.dropout = keras.layers.Dropout(self.attention_dropout, seed=seed, name="attention_dropout")

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
        out = self.output_dim or self.input_dim
        heads = self.num_heads
        self.position_encoding = self.encoding_spec.create(self, self.input_dim)
        if not self.position_only and self.inference_constants:  # q.k folded: see **Serving**
            self.query_key = self._dense(heads * self.input_dim, "query_key", self.input_dim)
            self.query_key.build(input_shape)
        elif not self.position_only:
            self.query_dense = self._dense(heads * self.input_dim, "query", self.input_dim)
            self.key_dense = self._dense(heads * self.input_dim, "key", self.input_dim)
            self.query_dense.build(input_shape)
            self.key_dense.build(input_shape)
        self.position_encoding.build()
        # The heads' W^(h) stacked: (heads * D, output_dim), rows ordered [head, channel].
        self.value_dense = self._dense(out, "value", heads * self.input_dim)
        self.value_dense.build(tuple(input_shape[:-1]) + (heads * self.input_dim,))
        if self.inference_constants:
            self._build_constants(input_shape[1], input_shape[2])

    def _build_constants(self, height, width):
        if height is None or width is None:
            raise ValueError("inference_constants needs a static grid size: give the model input a fixed shape.")
        self.constants_grid = (int(height), int(width))
        n = height * width
        if not self.position_only:
            shapes = {"position_logits": (n, self.num_heads, n)}  # (query, head, key): see _folded_logits
        else:
            shapes = {"dense": {"probabilities": (self.num_heads, n, n)},
                      "separable": {"row_probabilities": (self.num_heads, height, height),
                                    "col_probabilities": (self.num_heads, width, width)}}[self.inference_aggregation()]
        self.constants = {
            name: self.add_weight(name=f"constant_{name}", shape=shape, initializer="zeros", trainable=False,
                                  autocast=False)
            for name, shape in shapes.items()}

    def refuse_training(self):
        """Raises ValueError: a layer with inference constants only serves (its encoding's weights
        no longer reach its outputs, so training could not move them)."""
        raise ValueError(
            f"{self.name} holds inference constants (sa_conv.freeze_for_inference): it serves, it does not "
            "train. Train the model it was made from, then freeze that again.")

    def inference_aggregation(self):
        """``"separable"`` or ``"dense"``: the path inference from constants takes on the
        layer's grid. ``fast_position_attention`` True or False decides; ``"auto"`` takes the
        separable path for separable encodings where it measured faster with constants
        (`separable.separable_pays` with ``constants=True``: 12x12 grids and up). Needs a built
        layer."""
        if not (self.position_only and self.encoding_spec.separable and self.fast_position_attention):
            return "dense"
        if self.fast_position_attention == "auto" and not separable.separable_pays(*self.constants_grid, constants=True):
            return "dense"
        return "separable"

    def update_constants(self):
        """Computes the constant probabilities of ``inference_constants`` from the encoding's
        current weights: what `sa_conv.freeze_for_inference` calls once the weights are set.
        Dense: ``(heads, N, N)``; separable: the row and column factors ``(heads, H, H)`` and
        ``(heads, W, W)``, after the softmax over keys of Eq. (5); content encodings: their
        position term ``(heads, N, N)`` (the folded query-key map is set by
        `sa_conv.freeze_for_inference`, from the trained layer's query and key maps), held as
        ``(N, heads, N)`` (query, head, key)."""
        if not self.inference_constants:
            raise ValueError(f"{self.name} was built without inference_constants.")
        height, width = self.constants_grid
        if "position_logits" in self.constants:
            values = {"position_logits": ops.transpose(self.position_encoding.position_logits(height, width), (1, 0, 2))}
        elif "probabilities" in self.constants:
            values = {"probabilities": ops.softmax(self.position_encoding.logits(height, width), axis=-1)}
        else:
            row, col = self.position_encoding.factor_logits(height, width)
            values = {"row_probabilities": ops.softmax(row, axis=-1), "col_probabilities": ops.softmax(col, axis=-1)}
        for name, value in values.items():
            self.constants[name].assign(ops.cast(value, "float32"))

    def value_kernel_per_head(self):
        """The heads' value maps ``W^(h)`` as ``(heads, D, output_dim)`` (Eq. 6)."""
        return ops.reshape(self.value_dense.kernel, (self.num_heads, self.input_dim, -1))

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

    def attention_logits(self, inputs):
        """Logits ``(heads, N, N)`` (position only) or ``(batch, heads, N, N)``, float32. A
        content layer with inference constants gives them up to a constant per query (see
        **Serving**)."""
        height, width = self._check_grid(inputs)
        if self.position_only:
            return self.position_encoding.logits(height, width)
        if self.inference_constants:
            return ops.transpose(self._folded_logits(inputs), (0, 2, 1, 3))
        heads, d = self.num_heads, self.input_dim
        n = height * width
        q = ops.transpose(ops.reshape(self.query_dense(inputs), (-1, n, heads, d)), (0, 2, 1, 3))  # (b, heads, n, d)
        k = ops.transpose(ops.reshape(self.key_dense(inputs), (-1, n, heads, d)), (0, 2, 1, 3))
        return self.position_encoding.logits(height, width, q, k)

    def attention_probabilities(self, inputs):
        """Softmax over keys of `attention_logits`, float32."""
        return ops.softmax(self.attention_logits(inputs), axis=-1)

    def uses_fast_path(self, training=False, grid=None):
        """Whether a call with this ``training`` flag on a ``grid`` ``(H, W)`` runs the separable
        path (``grid`` matters only for ``"auto"``; None: assume it pays)."""
        return separable.takes_separable_path(self.encoding_spec, self.fast_position_attention, grid,
                                              attention_dropout_active=bool(training) and self.attention_dropout > 0)

    def call(self, inputs, training=None, return_attention_scores=False):
        height, width = self._check_grid(inputs)
        if self.inference_constants:
            return self._call_with_constants(inputs, training, return_attention_scores)
        if self.uses_fast_path(training, (height, width)):
            row, col = self.position_encoding.factor_logits(height, width)
            outputs = separable.separable_attention(
                inputs, row, col, self.value_dense.kernel,
                self.value_dense.bias if self.value_dense.use_bias else None, self.compute_dtype,
                recompute_gradient=self.recompute_gradient)
            if not return_attention_scores:
                return outputs
            probs = self.attention_probabilities(inputs)
        else:
            outputs, probs = self._compute_attention(inputs, self.attention_probabilities(inputs), training)
            if not return_attention_scores:
                return outputs
        if len(probs.shape) == 3:
            probs = ops.broadcast_to(probs[None], (ops.shape(inputs)[0],) + tuple(probs.shape))
        return outputs, probs

    def _call_with_constants(self, inputs, training, return_attention_scores):
        """Inference from the precomputed probabilities: no encoding computed per call."""
        if training:
            self.refuse_training()
        if tuple(inputs.shape[1:3]) != self.constants_grid:
            raise ValueError(f"{self.name}'s constants are for a {self.constants_grid} grid, got {tuple(inputs.shape[1:3])}.")
        bias = self.value_dense.bias if self.value_dense.use_bias else None
        if "position_logits" in self.constants:
            return self._call_folded_content(inputs, return_attention_scores)
        if "probabilities" in self.constants:
            outputs, probs = self._compute_attention(inputs, self.constants["probabilities"], training=False)
        else:
            row, col = self.constants["row_probabilities"], self.constants["col_probabilities"]
            outputs = separable.separable_sum(inputs, row, col, self.value_dense.kernel, bias, self.compute_dtype)
            if not return_attention_scores:
                return outputs
            n = row.shape[1] * col.shape[1]  # P[h, (qi, qj), (ki, kj)] = row[h, qi, ki] col[h, qj, kj]
            probs = ops.reshape(row[:, :, None, :, None] * col[:, None, :, None, :], (-1, n, n))
        if not return_attention_scores:
            return outputs
        return outputs, ops.broadcast_to(probs[None], (ops.shape(inputs)[0],) + tuple(probs.shape))

    def _folded_logits(self, inputs):
        """Content logits from the folded ``query_key`` map plus the constant position term,
        ``(batch, N, heads, N)`` (query, head, key), float32: the layout in which the
        aggregation needs no transpose."""
        _, height, width, d = inputs.shape
        n, heads = height * width, self.num_heads
        queries = ops.reshape(self.query_key(inputs), (-1, n, heads, d))
        x = ops.reshape(ops.cast(inputs, queries.dtype), (-1, n, d))
        content = ops.cast(ops.einsum("bqhd,bkd->bqhk", queries, x), "float32") / math.sqrt(d)
        return content + self.constants["position_logits"][None]

    def _call_folded_content(self, inputs, return_attention_scores):
        _, height, width, d = inputs.shape
        probs = ops.softmax(self._folded_logits(inputs), axis=-1)  # (batch, query, heads, key)
        x = ops.reshape(ops.cast(inputs, self.compute_dtype), (-1, height * width, d))
        mixed = ops.einsum("bqhk,bkd->bqhd", ops.cast(probs, self.compute_dtype), x)
        outputs = self.value_dense(ops.reshape(mixed, (-1, height, width, self.num_heads * d)))
        if not return_attention_scores:
            return outputs
        return outputs, ops.transpose(probs, (0, 2, 1, 3))

    def _compute_attention(self, inputs, probabilities, training=None):
        """Eq. (5)-(6), dense: ``sum_h Dropout(P_h) X W^(h) + b``.

        Args:
          inputs: ``X``, ``(batch, H, W, D)``.
          probabilities: ``P``, ``(heads, N, N)`` (position only) or ``(batch, heads, N, N)``.
          training: whether attention dropout (a mask per example) is active.

        Returns:
          ``(outputs (batch, H, W, output_dim), probabilities)``, the probabilities as given.
        """
        _, height, width, d = inputs.shape
        x = ops.reshape(inputs, (-1, height * width, d))
        weights = probabilities
        if self.position_only and training and self.attention_dropout > 0:
            weights = ops.broadcast_to(weights[None], (ops.shape(x)[0],) + tuple(weights.shape))
        weights = ops.cast(self.dropout(weights, training=training), self.compute_dtype)
        if len(weights.shape) == 3:  # shared by the batch
            mixed = ops.einsum("hqk,bkd->bqhd", weights, x)
        else:
            mixed = ops.einsum("bhqk,bkd->bqhd", weights, x)
        mixed = ops.reshape(mixed, (-1, height, width, self.num_heads * d))
        return self.value_dense(mixed), probabilities

    def attend_with_dropout(self, inputs, keep=None, seed=None):
        """The layer in training with attention dropout from a given boolean keep-mask ``keep``
        ``(batch, heads, N, N)``, or from the ``seed`` of one (`seeded_dropout.draw_keep_mask`),
        in place of the layer's own draw: `TransformerBlock` draws its masks once per step, so a
        rematerialized block applies the same ones when it recomputes. Computed head by head
        (`seeded_dropout.sum_over_heads`): the FLOPs of `_compute_attention`, without its
        ``(batch, N, heads * D)`` concatenation. With ``seed``, the gradient draws the mask again
        and recomputes one product per head (`seeded_dropout.seeded_sum_over_heads`): the
        backward pass keeps no ``(batch, N, N)`` tensor. Returns ``(batch, H, W, output_dim)``."""
        if (keep is None) == (seed is None):
            raise ValueError("Pass exactly one of keep (a keep-mask) or seed (the seed of one).")
        if not self.built:
            raise ValueError(f"{self.name} is not built: call it on inputs (or build it) before attend_with_dropout.")
        height, width = self._check_grid(inputs)
        x = ops.reshape(ops.cast(inputs, self.compute_dtype), (-1, height * width, self.input_dim))
        kernel = ops.cast(self.value_dense.kernel, self.compute_dtype)  # (heads * D, out), rows [head, channel]
        probs = self.attention_probabilities(inputs)
        rate, dtype = self.attention_dropout, self.compute_dtype
        if seed is None:
            outputs = seeded_dropout.sum_over_heads(x, probs, kernel, keep, rate, dtype)
        else:
            outputs = seeded_dropout.seeded_sum_over_heads(x, probs, kernel, seed, rate, dtype)
        if self.value_dense.use_bias:
            outputs = outputs + ops.cast(self.value_dense.bias, self.compute_dtype)
        return ops.reshape(outputs, (-1, height, width, self.value_dense.units))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "output_dim": self.output_dim,
            "encoding": self.encoding,
            "max_grid_size": self.max_grid_size,
            "position_embedding_dim": self.position_embedding_dim,
            "attention_dropout": self.attention_dropout,
            "center_init_std": self.center_init_std,
            "spread_init_std": self.spread_init_std,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "initializer_range": self.initializer_range,
            "seed": self.seed,
            "fast_position_attention": self.fast_position_attention,
            "encoding_options": self.encoding_options or None,
            "initialization": self.initialization,
            "inference_constants": self.inference_constants,
            "recompute_gradient": self.recompute_gradient,
        }


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
