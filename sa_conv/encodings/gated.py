"""Gated positional self-attention (GPSA), ConViT's attention (d'Ascoli et al., ICML 2021, Eq. 5;
timm's ``convit.py``): per head, a learned gate mixes content attention and the paper's Gaussian
positional attention, which starts as a convolution (`sa_conv.attention_init`)."""

import keras
from keras import ops

from sa_conv import aggregation
from sa_conv.encodings.base import RelativeEncoding, register_encoding
from sa_conv.encodings.content import ContentEncoding
from sa_conv.encodings.quadratic import QuadraticEncoding


@keras.saving.register_keras_serializable(package="sa_conv")
@register_encoding("gated")
class GatedPositionalEncoding(RelativeEncoding):
    """Per head ``h`` with gate ``g_h = sigmoid(lambda_h)``::

        P_h = (1 - g_h) softmax_k(q_h . k_h / sqrt(d)) + g_h softmax_k(-alpha_h ||delta - Delta_h||^2)

    The positional half is the isotropic quadratic encoding of Eq. (9) (`QuadraticEncoding`, its
    centers and spreads), shared by the batch; the content half takes the attention layer's
    per-head queries and keys of ``query_dim`` channels (ConViT's ``D / heads`` by default, so
    the content logits cost ``1 / heads`` of the content encodings' ``D``). Both halves sum to
    one over keys, so their mixture does too (ConViT divides by the sum anyway; here it is 1 to
    rounding). The gates start at ``lambda_h = gate_init`` (ConViT's 1: ``g = 0.73``, mostly
    positional); with ``attention_init="convolutional"`` (the ``sa_gated`` presets') the centers
    start on the ``K x K`` grid. Centers, spreads and gates take no weight decay.

    Weights: ``position/centers (heads, 2)``, ``position/spreads (heads,)``, ``gating (heads,)``.
    """

    position_only = False
    convolutional_init = True
    mixes = True

    def __init__(self, num_heads, query_dim, center_init_std=2.0, spread_init_std=0.01, gate_init=1.0, seed=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.query_dim = int(query_dim)
        if self.query_dim < 1:
            raise ValueError(f"query_dim must be positive, got {query_dim}.")
        self.center_init_std = float(center_init_std)
        self.spread_init_std = float(spread_init_std)
        self.gate_init = float(gate_init)
        self.seed = seed
        self.position = QuadraticEncoding(self.num_heads, "isotropic", self.center_init_std, self.spread_init_std,
                                          seed=seed, name="position")

    @classmethod
    def from_attention(cls, attention, input_dim, query_dim=None, gate_init=1.0):
        return cls(attention.num_heads, query_dim or max(1, input_dim // attention.num_heads),
                   center_init_std=attention.center_init_std, spread_init_std=attention.spread_init_std,
                   gate_init=gate_init, seed=attention.sublayer_seed(0), name="position_encoding")

    @classmethod
    def logits_flops(cls, height, width, num_heads, input_dim, query_dim=None, gate_init=1.0):
        n, d = height * width, query_dim or max(1, input_dim // num_heads)
        # The query and key maps D -> heads * d, the content logits and the mixture.
        return 2 * (2 * n * input_dim * num_heads * d) + 2 * num_heads * n * n * d + 3 * num_heads * n * n

    def build(self, input_shape=None):
        self.position.build()
        self.gating = self.add_weight(name="gating", shape=(self.num_heads,), autocast=False,
                                      initializer=keras.initializers.Constant(self.gate_init))

    def no_weight_decay(self):
        return [*self.position.no_weight_decay(), self.gating]

    def gates(self):
        """``g_h = sigmoid(lambda_h)``, ``(heads,)``: each head's weight on its positional half."""
        return ops.sigmoid(self.gating)

    def gaussian(self):
        return self.position.gaussian()

    def gaussian_weights(self):
        return self.position.gaussian_weights()  # not the gates

    def initialize_convolutional(self, shifts, strength, max_offset=None):
        """The positional half's centers on the ``shifts`` with ``alpha = strength`` (exact)."""
        self.position.initialize_convolutional(shifts, strength, max_offset)

    @classmethod
    def serving_form(cls, **options):
        return "gated"

    def frozen_constants(self, height, width, factored=False):
        """The serving form's constants: ``positional`` ``C_h = g_h softmax_k(-alpha_h ||delta -
        Delta_h||^2)`` ``(heads, N, N)`` and ``content_weights`` ``1 - g_h`` ``(heads,)``."""
        gates = self.gates()
        return {"positional": ops.reshape(gates, (-1, 1, 1)) * self.positional_probabilities(height, width),
                "content_weights": 1.0 - gates}

    def positional_probabilities(self, height, width):
        """``softmax_k(-alpha_h ||delta - Delta_h||^2)``, ``(heads, H*W, H*W)``."""
        return ops.softmax(self.position.logits(height, width), axis=-1)

    def logits(self, height, width, queries=None, keys=None):
        raise ValueError("Gated attention mixes two softmaxes: it has probabilities (probabilities()), not one set "
                         "of logits.")

    def factor_probabilities(self, height, width, queries=None, keys=None):
        """The mixture's parts for queries and keys ``(batch, heads, N, d)`` (`aggregation.Mixture`):
        the content softmax ``(batch, heads, N, N)``, its weights ``1 - g_h`` and ``g_h`` times the
        positional softmax ``(heads, N, N)``."""
        content = ops.softmax(ContentEncoding.content_logits(ContentEncoding.scaled(queries), keys), axis=-1)
        gates = self.gates()
        return aggregation.Mixture(content, 1.0 - gates,
                                   ops.reshape(gates, (-1, 1, 1)) * self.positional_probabilities(height, width))

    def probabilities(self, height, width, queries=None, keys=None):
        """The mixture ``P`` for queries and keys ``(batch, heads, N, d)``: ``(batch, heads, N, N)``."""
        return aggregation.mixed_out(self.factor_probabilities(height, width, queries, keys))

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "query_dim": self.query_dim,
                "center_init_std": self.center_init_std, "spread_init_std": self.spread_init_std,
                "gate_init": self.gate_init, "seed": self.seed}
