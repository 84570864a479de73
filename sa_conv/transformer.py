"""The post-LayerNorm transformer block of the paper's classifier (BERT's layer on a 2-D grid)."""

import logging
import math

import keras
from keras import ops

from sa_conv.attention import MultiHeadSelfAttention2D, after, apply_keep_mask, draw_keep_mask
from sa_conv.initializers import bias_for, clone_initializer, dense_initializers


def exact_gelu(x):
    """The exact GELU of the reference, ``x Phi(x) = x (1 + erf(x / sqrt(2))) / 2``, written with
    ``erf`` (TensorFlow's own GELU uses ``erfc``, which ONNX has no operator for)."""
    return 0.5 * x * (1.0 + ops.erf(x * ops.cast(1.0 / math.sqrt(2.0), x.dtype)))


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


def _refill(seeds, given):
    """``seeds`` with its non-None entries replaced, in order, by ``given`` (the same seeds as
    the rematerialized function's arguments)."""
    given = iter(given)
    return [None if s is None else next(given) for s in seeds]


@keras.saving.register_keras_serializable(package="sa_conv")
class TransformerBlock(keras.layers.Layer):
    """Attention, dropout, residual, LayerNorm; GELU MLP, dropout, residual, LayerNorm.

    ``y = LN(x + Dropout(Dense(MHSA(x))))``, ``z = LN(y + Dropout(Dense(GELU(Dense(y)))))``.

    Input and output shape: ``(batch, H, W, hidden)``. Keyword arguments not listed are passed
    to `MultiHeadSelfAttention2D` through ``attention_config``.

    In training, the block draws its dropout keep-masks once per call (booleans, from its
    dropout layers' seed generators) and applies them with ``where``: the backward pass keeps
    the booleans rather than float masks.

    ``remat=True`` rematerializes the block in training (`keras.remat`): the backward pass keeps
    only the block's input and its dropout seeds and recomputes its activations from them, so a
    step holds one block's activations instead of all blocks'. The recomputation draws the same
    masks from the same seeds, so the gradients are those without remat, to float32 rounding.
    With a position-only encoding and attention dropout, the attention is not recomputed: its
    gradient draws its mask again and recomputes one product per head
    (`MultiHeadSelfAttention2D` ``dropout_seed``), and only the rest of the block is
    rematerialized (from the block's input and the attention's output).
    """

    def __init__(
        self,
        mlp_size,
        dropout=0.1,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        attention_config=None,
        bias_initializer="zeros",
        remat=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.remat = bool(remat)
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
        self.attention = MultiHeadSelfAttention2D(
            kernel_initializer=self.kernel_initializer, name="attention", dtype=self.dtype_policy,
            **self.attention_config,
        )

    def _sublayer(self, cls, name, fan_in=None, **kwargs):
        if cls is keras.layers.Dense:
            kwargs["kernel_initializer"] = clone_initializer(self.kernel_initializer)
            kwargs["bias_initializer"] = bias_for(self.bias_initializer, fan_in)
        return cls(name=name, dtype=self.dtype_policy, **kwargs)

    def build(self, input_shape):
        hidden = input_shape[-1]
        dense, norm = keras.layers.Dense, keras.layers.LayerNormalization
        self.attention.build(input_shape)
        self.attention_output = self._sublayer(dense, "attention_output", hidden, units=hidden)
        self.attention_dropout = self._sublayer(keras.layers.Dropout, "attention_output_dropout", rate=self.dropout_rate)
        self.attention_norm = self._sublayer(norm, "attention_norm", epsilon=self.layer_norm_epsilon)
        self.intermediate = self._sublayer(dense, "intermediate", hidden, units=self.mlp_size)
        self.output_dense = self._sublayer(dense, "output", self.mlp_size, units=hidden)
        self.output_dropout = self._sublayer(keras.layers.Dropout, "output_dropout", rate=self.dropout_rate)
        self.output_norm = self._sublayer(norm, "output_norm", epsilon=self.layer_norm_epsilon)
        mlp_shape = tuple(input_shape[:-1]) + (self.mlp_size,)
        for layer, shape in (
            (self.attention_output, input_shape), (self.attention_norm, input_shape),
            (self.intermediate, input_shape), (self.output_dense, mlp_shape),
            (self.output_norm, input_shape),
        ):
            layer.build(shape)

    def _mask_seeds(self, inputs):
        """The seeds of the block's three dropouts for this call (None where the rate is 0), each
        advancing its dropout layer's seed generator once."""

        def seed(layer):
            # Tied to the input (`after`): the masks' shapes are static, so without it the
            # runtime draws every block's masks at the start of the step, all alive at once.
            return None if layer.rate <= 0 else after(layer.seed_generator.next(), inputs)

        return seed(self.attention.dropout), seed(self.attention_dropout), seed(self.output_dropout)

    def _keep_masks(self, inputs, seeds):
        """Boolean keep-masks drawn from ``seeds`` (`_mask_seeds`): ``(batch, heads, N, N)`` for the
        attention, ``(batch, H, W, hidden)`` for the two others; None where the seed is."""
        batch = ops.shape(inputs)[0]
        height, width, channels = inputs.shape[1:]
        n = height * width
        shapes = ((batch, self.attention.num_heads, n, n), (batch, height, width, channels),
                  (batch, height, width, channels))
        layers = (self.attention.dropout, self.attention_dropout, self.output_dropout)
        return tuple(None if seed is None else draw_keep_mask(shape, seed, layer.rate)
                     for seed, shape, layer in zip(seeds, shapes, layers))

    def call(self, inputs, training=None, return_attention_scores=False):
        if not training or return_attention_scores:
            return self._forward(inputs, training, return_attention_scores)
        seeds = self._mask_seeds(inputs)
        if not self.remat:
            keeps = self._keep_masks(inputs, seeds)
            return self._tail(inputs, self._attend(inputs, keep=keeps[0]), *keeps[1:])

        # The seeds, not the masks, enter the rematerialized function, which draws the masks from
        # them again when it recomputes: no block's masks outlive its forward or recomputation
        # (the attention's are (batch, heads, N, N)). tf.recompute_grad makes its arguments wait
        # for the incoming gradient, so the recomputation happens block by block in the backward
        # pass; seeds captured by closure would let every block's recomputation run at once.
        if self.attention.position_only and seeds[0] is not None:
            # The attention's own gradient already keeps no (batch, N, N) tensor and recomputes
            # one product per head (`dropout_seed`), cheaper than recomputing its whole forward:
            # only the rest of the block is rematerialized, from its input and the attention's
            # output.
            attended = self._attend(inputs, seed=seeds[0])
            tail_seeds = (None,) + seeds[1:]

            def tail(x, a, *given):
                return self._tail(x, a, *self._keep_masks(x, _refill(tail_seeds, given))[1:])

            return keras.remat(tail)(inputs, attended, *(s for s in tail_seeds if s is not None))

        def block(x, *given):
            keeps = self._keep_masks(x, _refill(seeds, given))
            return self._tail(x, self._attend(x, keep=keeps[0]), *keeps[1:])

        return keras.remat(block)(inputs, *(s for s in seeds if s is not None))

    def _attend(self, inputs, keep=None, seed=None):
        """The attention in training, its dropout from a keep-mask or a seed (or none)."""
        return self.attention(inputs, training=True, dropout_keep=keep, dropout_seed=seed)

    def _tail(self, inputs, attended, attention_output_keep, output_keep):
        """The block after the attention: output map, dropouts, residuals, LayerNorms and MLP."""
        x = apply_keep_mask(self.attention_output(attended), attention_output_keep, self.dropout_rate)
        x = self.attention_norm(inputs + x)
        y = apply_keep_mask(self.output_dense(exact_gelu(self.intermediate(x))), output_keep, self.dropout_rate)
        return self.output_norm(x + y)

    def _forward(self, inputs, training=None, return_attention_scores=False):
        attended = self.attention(inputs, training=training, return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, probs = attended
        x = self.attention_dropout(self.attention_output(attended), training=training)
        x = self.attention_norm(inputs + x)
        y = self.output_dropout(self.output_dense(exact_gelu(self.intermediate(x))), training=training)
        y = self.output_norm(x + y)
        return (y, probs) if return_attention_scores else y

    def compute_output_shape(self, input_shape):
        return input_shape

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
        }
