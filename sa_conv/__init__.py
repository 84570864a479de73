"""sa-conv: self-attention over images (Cordonnier, Loukas & Jaggi, ICLR 2020) in Keras 3.

What ``pip install sa-conv`` users import, on any Keras backend (`keras.ops` only): the layers,
encodings and models, Theorem 1 (`sa_conv.conversion`), inspection, and the serving transform
(`sa_conv.serving`). `sa_conv.plotting` is imported on demand (it needs matplotlib). The data
pipeline, the command-line helpers and the memory estimate are the programs' (`trainers`).
"""

from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.config import PRESETS, ModelConfig, get_config, preset_names
from sa_conv.conversion import AttentionConv2D, attention_to_conv, conv_to_attention, convert_model
from sa_conv.encodings import (
    ENCODINGS, ContentPlusLearnedBiasEncoding, ContentWithRelativeKeysEncoding, LearnedRelativeEncoding,
    QuadraticEncoding, RelativeEncoding, get_encoding, register_encoding,
)
from sa_conv.errors import DatasetError, SaConvError
from sa_conv.heads import degenerate_heads, prune_heads, reset_heads
from sa_conv.invertible_pooling import InvertiblePooling, InvertibleUnpooling
from sa_conv.models import (
    attention_blocks, attention_grid, attention_probabilities, build_attention_classifier, build_model,
    interpolate_offset_table, no_weight_decay, with_dtype_policy, with_image_size,
)
from sa_conv.serving import freeze_for_inference
from sa_conv.preprocessing import REFERENCE_PIXEL_MEAN, REFERENCE_PIXEL_STD, PixelNormalization
from sa_conv.resnet import build_resnet
from sa_conv import reference  # noqa: E402  (sa_conv.reference.load_reference_weights)
from sa_conv.transformer import TransformerBlock

__version__ = "0.2.0"


__all__ = [
    "AttentionConv2D", "DatasetError", "ENCODINGS", "InvertiblePooling",
    "InvertibleUnpooling", "ContentPlusLearnedBiasEncoding", "ContentWithRelativeKeysEncoding", "LearnedRelativeEncoding", "ModelConfig",
    "MultiHeadSelfAttention2D", "PRESETS", "PixelNormalization", "QuadraticEncoding", "REFERENCE_PIXEL_MEAN",
    "REFERENCE_PIXEL_STD", "RelativeEncoding", "SaConvError", "TransformerBlock", "attention_blocks", "attention_grid", "attention_probabilities",
    "attention_to_conv", "build_attention_classifier", "build_model", "build_resnet", "conv_to_attention",
    "convert_model", "degenerate_heads", "freeze_for_inference", "get_config", "get_encoding", "no_weight_decay", "preset_names", "prune_heads",
    "interpolate_offset_table", "register_encoding", "reset_heads", "with_dtype_policy", "with_image_size",
]
