"""The post-LayerNorm transformer block of the paper's classifier (BERT's layer on a 2-D grid)."""

import logging
import math

import keras
from keras import ops

from sa_conv.attention import MultiHeadSelfAttention2D, scores_spec
from sa_conv.seeded_dropout import after, apply_keep_mask, draw_keep_mask, rematerialize
from sa_conv.initializers import bias_for, clone_initializer, dense_initializers


def exact_gelu(x):
    """The exact GELU of the reference, ``x Phi(x) = x (1 + erf(x / sqrt(2))) / 2``, written with
    ``erf`` (TensorFlow's own GELU uses ``erfc``, which ONNX has no operator for). Evaluated in
    float32 and returned in ``x``'s dtype: CPUs have no bfloat16 units for elementwise work, and
    TensorFlow's bfloat16 ``erf``, ``exp`` and products (in the gradient too) convert every element."""
    y = ops.cast(x, "float32")
    return ops.cast(0.5 * y * (1.0 + ops.erf(y * (1.0 / math.sqrt(2.0)))), x.dtype)


class SeedWatchFilter(logging.Filter):
    """Drops TensorFlow's warning that a watched tensor is not floating point. ``tf.recompute_grad``
    (``keras.remat`` on TensorFlow) watches every argument of the recomputed function; the dropout
    seeds of a rematerialized `TransformerBlock` are integers by design (they have no gradient),
    and TensorFlow would print the warning for each such block.

    The library installs nothing: a program adds `SEED_WATCH_FILTER` to the ``"tensorflow"``
    logger in its entry point (`trainers.process.configure` does)."""

    MESSAGE = "The dtype of the watched tensor must be floating"

    def filter(self, record):
        return self.MESSAGE not in record.getMessage()


SEED_WATCH_FILTER = SeedWatchFilter()


@keras.saving.register_keras_serializable(package="sa_conv")
class TransformerBlock(keras.layers.Layer):
    """Attention, dropout, residual, LayerNorm; GELU MLP, dropout, residual, LayerNorm.

    ``y = LN(x + Dropout(Dense(MHSA(x))))``, ``z = LN(y + Dropout(Dense(GELU(Dense(y)))))``.

    With ``drop_path`` above 0 (stochastic depth, Huang et al. 2016), training also drops each
    of the two residual branches of an example whole, at that rate, rescaling kept ones by
    ``1 / (1 - drop_path)``: ``y = LN(x + DropPath(Dropout(Dense(MHSA(x)))))``, the same for ``z``.

    Input and output shape: ``(batch, H, W, hidden)``. Keyword arguments not listed are passed
    to `MultiHeadSelfAttention2D` through ``attention_config``.

    One call path (`_block`): in training the block draws its dropout masks (and stochastic
    depth's) from seeds (booleans, `sa_conv.seeded_dropout`, one seed per layer and call) and applies them
    with ``where``, so the backward pass keeps booleans rather than float masks; in inference
    there are no seeds and no dropout.

    ``remat=True`` wraps that path in `keras.remat` in training (`seeded_dropout.rematerialize`):
    the backward pass keeps only the block's input and its dropout seeds and recomputes its
    activations from them, so a step holds one block's activations instead of all blocks'; its
    attention's separable path then recomputes its own gradient head by head
    (``recompute_gradient``), so that block's backward pass holds no ``(batch, N, heads * D)``
    tensor either. The recomputation draws the same masks from the same seeds, so the gradients are those without
    remat, to float32 rounding. Where the attention's aggregation recomputes its own dropout
    gradient (`sa_conv.aggregation`, ``recomputes_dropout_gradient``: position-only encodings
    with attention dropout, whose gradient draws the mask again and recomputes one product per
    head, cheaper than recomputing the forward), the attention is left out of the wrapper and
    only the rest of the block is rematerialized (from the block's input and the attention's
    output).

    Sublayers: ``attention``, ``attention_output`` (dense), ``attention_output_dropout`` (at rate
    ``dropout``; the attention's own ``attention_dropout`` acts on its probabilities),
    ``attention_norm``, ``intermediate``, ``output``, ``output_dropout``, ``output_norm`` and,
    with ``drop_path``, ``drop_path`` (a `keras.layers.Dropout` whose seed generator draws both
    branches' keep-masks).

    Its serving copy (`ServingTransformerBlock`) is built from a trained block by
    `sa_conv.serving.freeze_for_inference`.
    """

    #: Whether the attention's output goes through its own map (a serving copy folds it away).
    maps_attention_output = True

    def __init__(
        self,
        mlp_size,
        dropout=0.1,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        attention_config=None,
        bias_initializer="zeros",
        remat=False,
        drop_path=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.remat = bool(remat)
        self.drop_path_rate = float(drop_path)
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {drop_path}.")
        self.mlp_size = int(mlp_size)
        self.dropout_rate = float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.attention_config = dict(attention_config or {})
        initialization = self.attention_config.get("initialization")
        if initialization is not None:  # as the attention layer: it decides the dense maps too
            initializers = dense_initializers(initialization, self.attention_config.get("initializer_range", 0.02))
            kernel_initializer, bias_initializer = initializers["kernel_initializer"], initializers["bias_initializer"]
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.attention = self._make_attention()

    def _make_attention(self):
        # A rematerialized block trades compute for memory: so does its separable attention.
        # The block's initializers unless attention_config names its own.
        return MultiHeadSelfAttention2D(name="attention", dtype=self.dtype_policy, **{
            "kernel_initializer": self.kernel_initializer, "bias_initializer": self.bias_initializer,
            "recompute_gradient": self.remat, **self.attention_config})

    def _sublayer(self, cls, name, fan_in=None, **kwargs):
        if cls is keras.layers.Dense:
            kwargs["kernel_initializer"] = clone_initializer(self.kernel_initializer)
            kwargs["bias_initializer"] = bias_for(self.bias_initializer, fan_in)
        return cls(name=name, dtype=self.dtype_policy, **kwargs)

    def build(self, input_shape):
        hidden = input_shape[-1]
        if self.attention.output_dim not in (None, hidden):  # the residual adds it to the block's input
            raise ValueError(f"attention_config's output_dim={self.attention.output_dim}: a TransformerBlock's "
                             f"attention keeps the block's {hidden} channels; leave output_dim out.")
        dense, norm = keras.layers.Dense, keras.layers.LayerNormalization
        if not self.attention.built:
            self.attention.build(input_shape)
        if self.maps_attention_output:
            self.attention_output = self._sublayer(dense, "attention_output", hidden, units=hidden)
            self.attention_output.build(input_shape)
        self.attention_output_dropout = self._sublayer(
            keras.layers.Dropout, "attention_output_dropout", rate=self.dropout_rate)
        self.attention_norm = self._sublayer(norm, "attention_norm", epsilon=self.layer_norm_epsilon)
        self.intermediate = self._sublayer(dense, "intermediate", hidden, units=self.mlp_size)
        self.output_dense = self._sublayer(dense, "output", self.mlp_size, units=hidden)
        self.output_dropout = self._sublayer(keras.layers.Dropout, "output_dropout", rate=self.dropout_rate)
        self.output_norm = self._sublayer(norm, "output_norm", epsilon=self.layer_norm_epsilon)
        if self.drop_path_rate > 0:  # only then: the variables of blocks without it stay as they were
            self.drop_path = self._sublayer(keras.layers.Dropout, "drop_path", rate=self.drop_path_rate)
        mlp_shape = tuple(input_shape[:-1]) + (self.mlp_size,)
        for layer, shape in (
            (self.attention_norm, input_shape), (self.intermediate, input_shape), (self.output_dense, mlp_shape),
            (self.output_norm, input_shape),
        ):
            layer.build(shape)

    def _mask_seeds(self, inputs):
        """The seeds of the block's three dropouts and of its stochastic depth for this call (None
        where the rate is 0), each advancing its dropout layer's seed generator once."""

        def seed(layer):
            # Tied to the input (`after`): the masks' shapes are static, so without it the
            # runtime draws every block's masks at the start of the step, all alive at once.
            return None if layer.rate <= 0 else after(layer.seed_generator.next(), inputs)

        paths = seed(self.drop_path) if self.drop_path_rate > 0 else None
        return seed(self.attention.dropout), seed(self.attention_output_dropout), seed(self.output_dropout), paths

    def call(self, inputs, training=None, return_attention_scores=False):
        seeds = self._mask_seeds(inputs) if training else (None, None, None, None)
        if not (self.remat and training) or return_attention_scores:
            return self._block(inputs, *seeds, return_attention_scores=return_attention_scores)
        if seeds[0] is not None and self.attention.aggregation_for(tuple(inputs.shape[1:3])).recomputes_dropout_gradient:
            attended = self.attention(inputs, training=True, dropout_seed=seeds[0])
            return rematerialize(self._tail, inputs, attended, *seeds[1:])
        return rematerialize(self._block, inputs, *seeds)

    def _block(self, inputs, attention_seed=None, attention_output_seed=None, output_seed=None, path_seed=None,
               return_attention_scores=False):
        """The block from its input and its dropouts' and stochastic depth's seeds (None: none there)."""
        attended = self.attention(inputs, training=attention_seed is not None, dropout_seed=attention_seed,
                                  return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, probs = attended
            return self._tail(inputs, attended, attention_output_seed, output_seed, path_seed), probs
        return self._tail(inputs, attended, attention_output_seed, output_seed, path_seed)

    def _tail(self, inputs, attended, attention_output_seed=None, output_seed=None, path_seed=None):
        """The block after the attention: output map, dropouts, stochastic depth, residuals,
        LayerNorms and MLP."""
        shape = (ops.shape(inputs)[0],) + tuple(inputs.shape[1:])
        # One draw for both branches: (batch, 1, 1, 2), a keep per example and branch.
        paths = None if path_seed is None else draw_keep_mask((shape[0], 1, 1, 2), path_seed, self.drop_path_rate)
        x = apply_keep_mask(self.attention_output(attended), self._keep(shape, attention_output_seed), self.dropout_rate)
        x = self.attention_norm(inputs + self._drop_path(x, paths, 0))
        y = apply_keep_mask(self.output_dense(exact_gelu(self.intermediate(x))), self._keep(shape, output_seed),
                            self.dropout_rate)
        return self.output_norm(x + self._drop_path(y, paths, 1))

    def _drop_path(self, branch, paths, index):
        return branch if paths is None else apply_keep_mask(branch, paths[..., index:index + 1], self.drop_path_rate)

    def _keep(self, shape, seed):
        return None if seed is None else draw_keep_mask(shape, seed, self.dropout_rate)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        return (outputs, scores_spec(inputs.shape, self.attention.num_heads)) if return_attention_scores else outputs

    def get_config(self):
        return {
            **super().get_config(),
            "mlp_size": self.mlp_size,
            "dropout": self.dropout_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "attention_config": self.attention_config,
            "remat": self.remat,
            # Only when on: the configs of blocks without it stay as they were.
            **({"drop_path": self.drop_path_rate} if self.drop_path_rate else {}),
        }


@keras.saving.register_keras_serializable(package="sa_conv")
class ServingTransformerBlock(TransformerBlock):
    """A `TransformerBlock` in inference, its ``attention_output`` map folded into the attention's
    value map (``W_v W_o``, bias ``b_v W_o + b_o``: `sa_conv.serving.freeze_for_inference`)::

        y = LN(x + A(x)),    z = LN(y + Dense(GELU(Dense(y))))

    ``A`` is a `MultiHeadSelfAttention2D` with the trained encoding's frozen form
    (``encoding="frozen:NAME"``), or the trained attention as it is where the encoding is served as
    trained. No dropout; it serves, it does not train. Input and output ``(batch, H, W, hidden)``
    on the grid it was frozen for.

    Sublayers: ``attention``, ``attention_norm``, ``intermediate``, ``output``, ``output_norm``.

    Args:
      mlp_size, layer_norm_epsilon: the trained block's.
      attention_config: the serving attention's (`MultiHeadSelfAttention2D` arguments).
    """

    maps_attention_output = False

    def __init__(self, mlp_size, layer_norm_epsilon=1e-12, *, attention_config, **kwargs):
        super().__init__(mlp_size, dropout=0.0, layer_norm_epsilon=layer_norm_epsilon,
                         attention_config=attention_config, **kwargs)

    def _make_attention(self):
        return MultiHeadSelfAttention2D(name="attention", dtype=self.dtype_policy, **self.attention_config)

    def call(self, inputs, training=None, return_attention_scores=False):
        if training:
            raise ValueError(f"{self.name} is a serving copy (sa_conv.freeze_for_inference): it serves, it does not "
                             "train. Train the model it was made from, then freeze that again.")
        return super().call(inputs, training=False, return_attention_scores=return_attention_scores)

    def _tail(self, inputs, attended, attention_output_seed=None, output_seed=None, path_seed=None):
        x = self.attention_norm(inputs + attended)
        return self.output_norm(x + self.output_dense(exact_gelu(self.intermediate(x))))

    def get_config(self):
        config = super().get_config()
        for trained_only in ("dropout", "remat", "drop_path"):
            config.pop(trained_only, None)
        return config
