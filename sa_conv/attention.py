"""Multi-head self-attention over 2-D feature maps with relative positional encodings."""

import keras
from keras import ops

from sa_conv.encodings import get_encoding
from sa_conv.initializers import INITIALIZATIONS, bias_for, clone_initializer, dense_initializers

__all__ = ["MultiHeadSelfAttention2D", "apply_keep_mask", "clone_initializer", "draw_keep_mask", "separable_pays"]


class GivenSeed(keras.random.SeedGenerator):
    """A seed tensor handed to `keras.random` functions (which accept only seed generators and
    ints). Deliberately skips ``SeedGenerator.__init__``: it owns no state variable."""

    def __init__(self, seed):  # pylint: disable=super-init-not-called
        self._seed = seed

    def next(self, ordered=True):
        return self._seed


def draw_keep_mask(shape, seed, rate):
    """Boolean keep-mask of dropout at ``rate`` drawn from a seed tensor (a seed generator's
    ``next()``): the same seed gives the same mask, so a backward pass can draw it again
    instead of keeping it."""
    return keras.random.uniform(shape, seed=GivenSeed(seed)) >= rate


def after(seed, tensor):
    """``seed`` unchanged, with a data dependency on ``tensor``. The runtime runs an op as soon
    as its inputs are ready; a mask drawn from a seed alone would be drawn at the start of the
    step, every block's at once. Tied to ``tensor``, it is drawn when ``tensor`` exists."""
    first = ops.reshape(tensor, (-1,))[:1]
    return seed + ops.cast(ops.where(ops.isnan(first), 0.0, 0.0)[0], seed.dtype)


def apply_keep_mask(x, keep, rate):
    """Inverted dropout from a boolean keep-mask: ``x / (1 - rate)`` where ``keep``, else 0;
    ``x`` unchanged when ``keep`` is None. ``where`` leaves only the booleans for the backward
    pass (a float mask would be kept at full size)."""
    if keep is None:
        return x
    return ops.where(keep, x * ops.cast(1.0 / (1.0 - rate), x.dtype), ops.zeros((), x.dtype))


def separable_pays(height, width):
    """Whether ``fast_position_attention="auto"`` takes the separable path on an ``H x W`` grid:
    when ``H * W >= 4 * (H + W)`` (8x8 and larger), the size from which the separable path
    measured faster than the dense one in training (``benchmarks/results/throughput.json``)."""
    return height * width >= 4 * (height + width)


@keras.saving.register_keras_serializable(package="sa_conv")
class MultiHeadSelfAttention2D(keras.layers.Layer):
    """Multi-head self-attention (MHSA) over a 2-D grid, the paper's Eq. (5)-(6)::

        MHSA(X)_q = sum_h sum_k softmax_k(A_h[q, :]) X_k W^(h) + b

    Every head attends with softmax over all ``H*W`` keys of each query pixel and averages the
    full ``D``-dimensional input ``X`` (no per-head value projection); the heads are merged by one
    dense map from ``heads * D`` to ``output_dim`` (the paper's ``W^(h)``, stacked), with bias.

    Encodings (``encoding=``, any name registered in `sa_conv.encodings.ENCODINGS`):

    * ``"quadratic"``: Gaussian, isotropic (paper Eq. 9), ``A_h = -alpha_h ||delta - Delta_h||^2``.
    * ``"quadratic_full"``: Gaussian with full covariance ``Sigma_h^-1 = A_h A_h^T``.
    * ``"learned"``: learned row and column offset embeddings, position only.
    * ``"learned_content"``: ``(q.k + q.r_delta) / sqrt(D)`` with per-head queries and keys of
      size ``D`` (dense maps ``D -> heads * D``, built only for content-based encodings) and
      learned row/column offset embeddings.

    The position-only encodings do not depend on the input: their probabilities
    ``(heads, H*W, H*W)`` are computed once per call and shared by the batch. Attention dropout
    (training only) draws an independent mask for every example.

    **Fast exact path** (``fast_position_attention``: ``"auto"``, the default, True or False).
    For separable encodings (``"quadratic"``, ``"learned"``) the logit is a row term plus a column term,
    ``s(q, k) = r(qi, ki) + c(qj, kj)``, so the softmax over all keys factorizes exactly:
    ``P(q, k) = softmax_ki(r(qi, .))[ki] * softmax_kj(c(qj, .))[kj]`` (each 1-D softmax subtracts
    its own maximum, so large spreads do not underflow). The aggregation is then two 1-D passes,
    over key columns and then key rows, ``O(N (H + W))`` per head and channel instead of
    ``O(N^2)``, with no truncation; the heads' value maps run first, so that every step is a plain
    matrix product (see `_separable_attention`). It runs when the encoding separates, no
    attention dropout is active and (for ``"auto"``) `separable_pays` for the grid (8x8 and up).
    Otherwise (``"quadratic_full"``, ``"learned_content"``, attention dropout in training, or
    small grids) the dense ``(heads, N, N)`` path runs. Both give the same output to float32
    rounding; measured speed-ups are in ``benchmarks/results/throughput.json``.

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
        self.encoding = encoding
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
        if not self.position_only:
            self.query_dense = self._dense(heads * self.input_dim, "query", self.input_dim)
            self.key_dense = self._dense(heads * self.input_dim, "key", self.input_dim)
            self.query_dense.build(input_shape)
            self.key_dense.build(input_shape)
        self.position_encoding.build()
        # The heads' W^(h) stacked: (heads * D, output_dim), rows ordered [head, channel].
        self.value_dense = self._dense(out, "value", heads * self.input_dim)
        self.value_dense.build(tuple(input_shape[:-1]) + (heads * self.input_dim,))

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
        """Logits ``(heads, N, N)`` (position only) or ``(batch, heads, N, N)``, float32."""
        height, width = self._check_grid(inputs)
        if self.position_only:
            return self.position_encoding.logits(height, width)
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
        if self.fast_position_attention == "auto" and grid is not None and not separable_pays(*grid):
            return False
        return (
            bool(self.fast_position_attention)
            and self.position_only
            and self.encoding_spec.separable
            and not (training and self.attention_dropout > 0)
        )

    def _separable_attention(self, inputs):
        """The fast path, value map included: ``(batch, H, W, output_dim)``.

        ``sum_h sum_k P_h(q, k) x_k W^(h)`` with ``P_h`` = row factor x column factor, in the
        order that keeps every step a plain (batched) matrix product: the heads' value maps
        first, ``y_h = x W^(h)``; then the column pass for every head; then the row pass with
        the sum over heads folded into its contraction (``K = H * heads``).
        """
        height, width = self._check_grid(inputs)
        heads, d = self.num_heads, self.input_dim
        out = self.output_dim or d
        row, col = self.position_encoding.factor_logits(height, width)
        p_row = ops.cast(ops.softmax(row, axis=-1), self.compute_dtype)  # (heads, Hq, Hk)
        p_col = ops.cast(ops.softmax(col, axis=-1), self.compute_dtype)  # (heads, Wq, Wk)
        batch = ops.shape(inputs)[0]
        # W^(h) side by side: (D, heads * out), columns ordered [head, channel].
        kernel = ops.cast(self.value_dense.kernel, self.compute_dtype)
        kernel = ops.reshape(ops.transpose(ops.reshape(kernel, (heads, d, out)), (1, 0, 2)), (d, heads * out))
        y = ops.matmul(ops.reshape(inputs, (-1, d)), kernel)
        y = ops.transpose(ops.reshape(y, (-1, height, width, heads, out)), (0, 1, 3, 2, 4))  # [b, ki, h, kj, e]
        # Columns: (Wq, Wk) @ (Wk, out) for every (example, key row, head).
        t = ops.matmul(ops.broadcast_to(p_col, (batch, height, heads, width, width)), y)  # [b, ki, h, qj, e]
        # Rows and heads in one contraction: [qi, (ki, h)] @ [(ki, h), (qj, e)].
        r = ops.reshape(ops.transpose(p_row, (1, 2, 0)), (height, height * heads))
        outputs = ops.matmul(ops.broadcast_to(r, (batch, height, height * heads)),
                             ops.reshape(t, (-1, height * heads, width * out)))
        outputs = ops.reshape(outputs, (-1, height, width, out))
        if self.value_dense.use_bias:
            outputs = outputs + ops.cast(self.value_dense.bias, self.compute_dtype)
        return outputs

    def call(self, inputs, training=None, return_attention_scores=False, dropout_keep=None, dropout_seed=None):
        """``dropout_keep``: optional boolean keep-mask of the attention dropout, ``(batch, heads, N,
        N)``, used in place of the layer's own draw (`TransformerBlock` draws its masks once per
        step, so a rematerialized block applies the same ones when it recomputes).
        ``dropout_seed``: optional seed tensor of that mask (`draw_keep_mask`) instead; the
        gradient then draws the mask again and recomputes what it needs head by head
        (`_seeded_sum_over_heads`), so the backward pass keeps no ``(batch, N, N)`` tensor."""
        height, width = self._check_grid(inputs)
        n = height * width
        if dropout_keep is not None and dropout_seed is not None:
            raise ValueError("Pass dropout_keep or dropout_seed, not both.")
        if (dropout_keep is not None or dropout_seed is not None) and training:
            return self._masked_attention(inputs, keep=dropout_keep, seed=dropout_seed)
        if self.uses_fast_path(training, (height, width)):
            outputs = self._separable_attention(inputs)
            if not return_attention_scores:
                return outputs
            probs = self.attention_probabilities(inputs)
            return outputs, ops.broadcast_to(probs[None], (ops.shape(inputs)[0],) + tuple(probs.shape))
        x = ops.reshape(inputs, (-1, n, self.input_dim))
        probs = self.attention_probabilities(inputs)
        if self.position_only and training and self.attention_dropout > 0:
            batch = ops.shape(x)[0]
            probs = ops.broadcast_to(probs[None], (batch,) + tuple(probs.shape))
        dropped = self.dropout(probs, training=training)
        weights = ops.cast(dropped, self.compute_dtype)
        if len(weights.shape) == 3:  # shared by the batch
            mixed = ops.einsum("hqk,bkd->bqhd", weights, x)
        else:
            mixed = ops.einsum("bhqk,bkd->bqhd", weights, x)
        mixed = ops.reshape(mixed, (-1, height, width, self.num_heads * self.input_dim))
        outputs = self.value_dense(mixed)
        if not return_attention_scores:
            return outputs
        if len(probs.shape) == 3:
            probs = ops.broadcast_to(probs[None], (ops.shape(x)[0],) + tuple(probs.shape))
        return outputs, probs

    def _masked_attention(self, inputs, keep=None, seed=None):
        """The dense path with attention dropout from a given keep-mask (`apply_keep_mask`) or from
        the seed of one (`_seeded_sum_over_heads`), one head at a time: ``sum_h (Dropout(P_h) X) W^(h) + b`` (the value map split by head, as in
        `_separable_attention`). Same FLOPs as the all-heads path, but no ``(batch, N, heads * D)``
        concatenation and only ``(batch, N, N)`` pieces of the weights, in the forward pass and in
        its gradient: rematerialized training holds a fraction of the memory. Position-only
        probabilities ``(heads, N, N)`` broadcast against the mask without a per-example copy."""
        height, width = self._check_grid(inputs)
        x = ops.reshape(inputs, (-1, height * width, self.input_dim))
        kernel = ops.cast(self.value_dense.kernel, self.compute_dtype)  # (heads * D, out), rows [head, channel]
        probs = self.attention_probabilities(inputs)
        if seed is None:
            outputs = self._sum_over_heads(x, probs, kernel, keep)
        else:
            outputs = self._seeded_sum_over_heads(x, probs, kernel, seed)
        if self.value_dense.use_bias:
            outputs = outputs + ops.cast(self.value_dense.bias, self.compute_dtype)
        return ops.reshape(outputs, (-1, height, width, self.value_dense.units))

    def _dropped_weights(self, probs, keep, h):
        """Head ``h``'s dropped, rescaled probabilities, ``(batch, N, N)`` in the compute dtype;
        ``probs`` is ``(heads, N, N)`` (shared by the batch) or ``(batch, heads, N, N)``."""
        p = probs[h] if len(probs.shape) == 3 else probs[:, h]
        return ops.cast(apply_keep_mask(p, keep[:, h], self.attention_dropout), self.compute_dtype)

    def _sum_over_heads(self, x, probs, kernel, keep):
        """``sum_h (Dropout(P_h) X) W^(h)``, ``(batch, N, out)``, one head at a time."""
        d = self.input_dim
        outputs = None
        for h in range(self.num_heads):
            term = ops.matmul(ops.matmul(self._dropped_weights(probs, keep, h), x), kernel[h * d:(h + 1) * d])
            outputs = term if outputs is None else outputs + term
        return outputs

    def _seeded_sum_over_heads(self, x, probs, kernel, seed):
        """`_sum_over_heads` with the keep-mask drawn from ``seed``, and a gradient that keeps
        only ``X``, the probabilities, ``W^(h)`` and the seed: it draws the mask again and, head
        by head, recomputes ``Z_h = Dropout(P_h) X`` for the value map's gradient. Per head the
        backward pass is then five products of the forward's sizes instead of four (one
        aggregation recomputed), against recomputing the whole forward under `keras.remat`;
        nothing of size ``(batch, N, N)`` or ``(batch, N, heads * D)`` outlives its head.

        Gradients, per head, with ``G`` the upstream gradient ``(batch, N, out)``, ``M_h`` the
        dropped weights and ``s = 1 / (1 - rate)``::

            dW^(h) = Z_h^T G,  dZ_h = G W^(h)T,  dX += M_h^T dZ_h,
            dP_h = s * keep_h * (dZ_h X^T)   (summed over the batch when P is shared)
        """
        heads, d, n = self.num_heads, self.input_dim, x.shape[1]
        units, rate = self.value_dense.units, self.attention_dropout
        shared = len(probs.shape) == 3

        @ops.custom_gradient
        def attend(x, probs, kernel, seed):
            mask_shape = (ops.shape(x)[0], heads, n, n)
            outputs = self._sum_over_heads(x, probs, kernel, draw_keep_mask(mask_shape, seed, rate))

            def grad(*args, upstream=None):
                g = args[0] if upstream is None else upstream
                keep = draw_keep_mask(mask_shape, after(seed, g), rate)  # after G: block by block
                g_flat = ops.reshape(g, (-1, units))
                dx, dprobs, dkernel = None, [], []
                for h in range(heads):
                    m = self._dropped_weights(probs, keep, h)
                    z = ops.matmul(m, x)
                    dkernel.append(ops.matmul(ops.transpose(ops.reshape(z, (-1, d))), g_flat))
                    dz = ops.matmul(g, ops.transpose(kernel[h * d:(h + 1) * d]))
                    term = ops.einsum("bqk,bqd->bkd", m, dz)
                    dx = term if dx is None else dx + term
                    dp = apply_keep_mask(ops.einsum("bqd,bkd->bqk", dz, x), keep[:, h], rate)
                    dprobs.append(ops.cast(ops.sum(dp, axis=0) if shared else dp, probs.dtype))
                return dx, ops.stack(dprobs, axis=0 if shared else 1), ops.concatenate(dkernel, axis=0), None

            return outputs, grad

        return attend(x, probs, kernel, seed)

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
        }
