"""`ModelConfig`, the one configuration type of every model, and the named presets."""

from __future__ import annotations

import dataclasses
from typing import Optional

from sa_conv.attention_init import get_attention_init
from sa_conv.encodings import get_encoding
from sa_conv.initializers import INITIALIZATIONS
from sa_conv.resnet import RESNETS

ARCHITECTURES = ("attention", *RESNETS)
# The fields a CIFAR ResNet reads (`sa_conv.build_model`); the others configure attention.
_RESNET_FIELDS = frozenset({"architecture", "stochastic_depth", "initialization", "image_size", "image_channels",
                            "num_classes", "pixel_mean", "pixel_std"})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every field of a model. The ResNets ignore the attention fields (`ignored_fields`), which
    `get_config` and `sa_conv.build_model` refuse to override on a ResNet.

    Attributes:
      architecture: ``"attention"`` (the paper's fully-attentional classifier) or a CIFAR ResNet
        (a name in `sa_conv.resnet.RESNETS`: ``"resnet18"``, ``"resnet20"``).
      encoding: relative positional encoding of the attention layers (a name in `sa_conv.ENCODINGS`).
      num_layers: transformer blocks.
      num_heads: heads per attention layer (K*K heads express a KxK convolution).
      hidden_size: channels of the attention grid.
      mlp_size: intermediate size of each block's MLP.
      pooling_width: width of the invertible pooling at the input (1 = no pooling).
      dropout: dropout after attention and MLP outputs.
      stochastic_depth: in training, the rate at which the last block's residual branches are
        dropped whole per example (stochastic depth); earlier blocks' rates fall linearly to 0
        at the first. Transformer blocks and ResNet BasicBlocks alike.
      attention_dropout: dropout on the attention probabilities.
      layer_norm_epsilon: LayerNorm epsilon.
      max_grid_size: largest grid side of the learned encodings' tables (P).
      position_embedding_dim: embedding size of ``"learned"``; None = hidden_size.
      initializer_range: std of the normal initialization of dense kernels and embeddings under
        ``initialization="bert"``.
      initialization: ``"reference"`` (default: the reference implementation's PyTorch defaults,
        dense weights and biases ``U(+-1/sqrt(fan_in))``, learned tables ``N(0, 1)``) or
        ``"bert"`` (BERT's ``N(0, initializer_range)`` and zero biases); `sa_conv.initializers`.
      center_init_std, spread_init_std: initialization of the quadratic encodings.
      attention_init: how attention starts (`sa_conv.attention_init`): ``"random"`` (the
        encodings' own initializers), ``"convolutional"`` (each head at one shift of the
        ``K x K`` grid, Theorem 1's construction; position-only encodings and ``gated``) or
        ``"mimetic"`` (content attention's query-key products near a scaled identity).
      locality_strength: ``alpha`` of the convolutional initialization.
      locality_distance: spacing in grid pixels of the convolutional initialization's shifts
        (1: the 3x3 neighbourhood; 2: every other pixel, a wider start).
      fast_position_attention: when to use the exact separable attention path of quadratic
        (isotropic) and learned encodings: "auto" (grids of 8x8 and up, where it pays), True
        or False (see `MultiHeadSelfAttention2D`).
      encoding_options: further arguments of the encoding (e.g. the ``"mlp"`` encoding's
        ``hidden_units`` and ``depth``).
      remat: rematerialize the transformer blocks in training (`TransformerBlock`), all but the
        last (whose backward pass follows its forward pass at once): a training step keeps one
        block's activations instead of all of them, for one more forward pass per block. Same
        gradients. Execution only: no effect on weights or inference.
      image_size: side of the square input images.
      image_channels: channels of the input images.
      num_classes: classifier outputs.
      pixel_mean, pixel_std: per-channel statistics of pixels scaled to [0, 1] that the model's
        `PixelNormalization` applies; None: CIFAR-10's (the paper's). The trainer sets them,
        with the image size and the number of classes, from the training data
        (`trainers.data.ImageData.model_fields`).
    """

    architecture: str = "attention"
    encoding: str = "quadratic"
    num_layers: int = 6
    num_heads: int = 9
    hidden_size: int = 400
    mlp_size: int = 512
    pooling_width: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.1
    stochastic_depth: float = 0.0
    layer_norm_epsilon: float = 1e-12
    max_grid_size: int = 16
    position_embedding_dim: Optional[int] = None
    initializer_range: float = 0.02
    initialization: str = "reference"
    center_init_std: float = 2.0
    spread_init_std: float = 0.01
    attention_init: str = "random"
    locality_strength: float = 1.0
    locality_distance: float = 1.0
    fast_position_attention: object = "auto"
    encoding_options: Optional[dict] = None
    remat: bool = False
    image_size: int = 32
    image_channels: int = 3
    num_classes: int = 10
    pixel_mean: Optional[tuple] = None
    pixel_std: Optional[tuple] = None

    def __post_init__(self):
        for name in ("pixel_mean", "pixel_std"):  # JSON gives lists; the config stays hashable
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        self.validate()

    @property
    def grid_size(self) -> int:
        """Side of the attention grid: ``image_size / pooling_width``."""
        return self.image_size // self.pooling_width

    def validate(self) -> None:
        """Raises ValueError naming the field and the fix for an inconsistent configuration."""
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"Unknown architecture {self.architecture!r}; choose one of {ARCHITECTURES}.")
        spec = get_encoding(self.encoding)
        if self.encoding_options is not None and not isinstance(self.encoding_options, dict):
            raise ValueError(f"encoding_options must be a mapping of argument names to values, got {self.encoding_options!r}.")
        for name in ("num_layers", "num_heads", "hidden_size", "mlp_size", "pooling_width",
                     "max_grid_size", "image_size", "image_channels", "num_classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("dropout", "attention_dropout", "stochastic_depth"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}.")
        if not isinstance(self.remat, bool):
            raise ValueError(f"remat must be True or False, got {self.remat!r}.")
        if self.initialization not in INITIALIZATIONS:
            raise ValueError(f"initialization must be one of {INITIALIZATIONS}, got {self.initialization!r}.")
        # Strength and distance are checked whatever the initialization: a config keeps them.
        for name in ("locality_strength", "locality_distance"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        initializer = get_attention_init(self.attention_init, self.locality_strength, self.locality_distance)
        if self.is_attention:
            initializer.check(spec)
        if self.fast_position_attention not in ("auto", True, False):
            raise ValueError(
                f"fast_position_attention must be 'auto', True or False, got {self.fast_position_attention!r}."
            )
        for name in ("pixel_mean", "pixel_std"):
            value = getattr(self, name)
            if value is not None and len(value) != self.image_channels:
                raise ValueError(f"{name} has {len(value)} values for {self.image_channels} image channels.")
            if value is None and self.image_channels != 3:  # the default is CIFAR-10's, of 3 channels
                raise ValueError(f"image_channels={self.image_channels} needs {name}, one value per channel (the "
                                 "trainer takes it from the training images).")
        if self.pixel_std is not None and min(self.pixel_std) <= 0:
            raise ValueError(f"pixel_std must be positive, got {self.pixel_std}.")
        if not self.is_attention:
            return
        if self.image_size % self.pooling_width:
            raise ValueError(
                f"image_size {self.image_size} is not divisible by pooling_width {self.pooling_width}."
            )
        spec.check_model(grid_size=self.grid_size, hidden_size=self.hidden_size, max_grid_size=self.max_grid_size)

    @property
    def is_attention(self) -> bool:
        """Whether the model is the attention classifier (not a ResNet)."""
        return self.architecture == "attention"

    def ignored_fields(self) -> frozenset:
        """The fields this configuration's architecture does not read: a ResNet's attention fields."""
        if self.is_attention:
            return frozenset()
        return frozenset(f.name for f in dataclasses.fields(self)) - _RESNET_FIELDS

    def replace(self, **overrides) -> "ModelConfig":
        """A copy with ``overrides`` applied; unknown field names raise a clear error."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"Unknown model config field(s) {unknown}; known: {sorted(fields)}.")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_PAPER = ModelConfig()
# CPU-sized variants: same architecture, 3 layers, 9 heads, hidden 64, MLP 128. No attention
# dropout, so the position-only probabilities stay shared by the batch (the fast path).
_SMALL = dict(num_layers=3, hidden_size=64, mlp_size=128, attention_dropout=0.0)

PRESETS: dict[str, ModelConfig] = {
    "sa_quadratic": _PAPER,
    "sa_quadratic_full": _PAPER.replace(encoding="quadratic_full"),
    "sa_learned": _PAPER.replace(encoding="learned"),
    "sa_content_plus_learned_bias": _PAPER.replace(encoding="content_plus_learned_bias"),
    "sa_sinusoidal": _PAPER.replace(encoding="sinusoidal"),
    "sa_mlp": _PAPER.replace(encoding="mlp"),
    # ConViT's gated positional self-attention, its positional half starting as a 3x3 convolution.
    "sa_gated": _PAPER.replace(encoding="gated", attention_init="convolutional"),
    "resnet18": ModelConfig(architecture="resnet18"),
    "resnet20": ModelConfig(architecture="resnet20"),
    "sa_quadratic_small": _PAPER.replace(**_SMALL),
    "sa_quadratic_full_small": _PAPER.replace(encoding="quadratic_full", **_SMALL),
    "sa_learned_small": _PAPER.replace(encoding="learned", **_SMALL),
    "sa_content_plus_learned_bias_small": _PAPER.replace(encoding="content_plus_learned_bias", **_SMALL),
    "sa_sinusoidal_small": _PAPER.replace(encoding="sinusoidal", **_SMALL),
    "sa_mlp_small": _PAPER.replace(encoding="mlp", **_SMALL),
    "sa_gated_small": _PAPER.replace(encoding="gated", attention_init="convolutional", **_SMALL),
}


def preset_names() -> list[str]:
    """The preset names."""
    return list(PRESETS)


def get_config(name: str, **overrides) -> ModelConfig:
    """The preset ``name`` with ``overrides`` applied. ValueError listing the presets for an
    unknown name, or naming the overrides the preset's architecture would ignore (attention
    fields of a ResNet preset)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; choose one of {', '.join(PRESETS)}.")
    return override(PRESETS[name], name, **overrides)


def override(config: ModelConfig, name: str, **overrides) -> ModelConfig:
    """``config`` (called ``name`` in errors) with ``overrides`` applied; ValueError naming the
    overrides its architecture would ignore (a ResNet's attention fields)."""
    config = config.replace(**overrides)
    ignored = sorted(set(overrides) & config.ignored_fields())
    if ignored:
        raise ValueError(f"{name} (architecture {config.architecture}) has no attention: {', '.join(ignored)} would "
                         f"change nothing. Drop {'them' if len(ignored) > 1 else 'it'}, or choose an attention model.")
    return config
