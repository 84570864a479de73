"""sa-conv: self-attention over images (Cordonnier, Loukas & Jaggi, ICLR 2020) in Keras 3."""

from sa_conv.attention import ENCODINGS, MultiHeadSelfAttention2D
from sa_conv.conversion import AttentionConv2D, attention_to_conv, conv_to_attention, convert_model
from sa_conv.config import PRESETS, ModelConfig, get_config, preset_names
from sa_conv.invertible_pooling import InvertiblePooling, InvertibleUnpooling
from sa_conv.models import attention_blocks, attention_grid, attention_probabilities, build_attention_classifier, build_model
from sa_conv.positional_encoding import LearnedContentEncoding, LearnedRelativeEncoding, QuadraticEncoding
from sa_conv.preprocessing import CIFAR10_MEAN, CIFAR10_STD, PixelNormalization
from sa_conv.resnet import build_resnet
from sa_conv.transformer import TransformerBlock

__version__ = "0.1.0"

__all__ = [
    "AttentionConv2D", "attention_to_conv", "conv_to_attention", "convert_model",
    "CIFAR10_MEAN", "CIFAR10_STD", "ENCODINGS", "InvertiblePooling", "InvertibleUnpooling",
    "LearnedContentEncoding", "LearnedRelativeEncoding", "ModelConfig", "MultiHeadSelfAttention2D",
    "PRESETS", "PixelNormalization", "QuadraticEncoding", "TransformerBlock", "attention_blocks", "attention_grid",
    "attention_probabilities", "build_attention_classifier", "build_model", "build_resnet",
    "get_config", "preset_names",
]
