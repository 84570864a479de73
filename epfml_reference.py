"""What sa-conv knows of the reference implementation, GitHub ``epfml/attention-cnn`` (PyTorch),
in one place: its normalization constants, its ``train.py`` defaults, the flags that select each
attention variant, how its config keys map to `sa_conv.ModelConfig` fields, and its optimizer.

The importer (`sa_conv.reference`), the fixture tool (``tools/make_reference_fixtures.py``) and
the benchmarks that run the reference side by side import it. Standard library only, and outside
the ``sa_conv`` package (whose import loads Keras): the reference side of a benchmark runs in a
process with torch and without TensorFlow, whose memory it measures.

Encoding names are sa-conv's (current names; the reference has no names, only flags):

==============================  =================================================================
sa-conv encoding                the reference's flags (``models/bert.py``)
==============================  =================================================================
``quadratic``                   ``use_gaussian_attention``, ``attention_isotropic_gaussian``
``quadratic_full``              ``use_gaussian_attention``
``learned``                     ``use_learned_2d_encoding``
``content_plus_learned_bias``   ``use_learned_2d_encoding``, ``use_attention_data``
==============================  =================================================================
"""

from __future__ import annotations

REPOSITORY = "epfml/attention-cnn"
COMMIT = "9ffaa3061da11e7246534a6d5ce1cfe5a2a77000"  # a consistent snapshot, the one compared against

# Its train.py's CIFAR-10 normalization of pixels scaled to [0, 1]. The std is below CIFAR-10's
# measured per-channel std (about 0.247, 0.243, 0.261): sa-conv's trainer uses the data's own
# statistics unless --pixel_statistics=reference.
PIXEL_MEAN = (0.4914, 0.4822, 0.4465)
PIXEL_STD = (0.2023, 0.1994, 0.2010)

# Its dataset names and their classes.
DATASET_CLASSES = {"Cifar10": 10, "Cifar100": 100}

# Its train.py's defaults, at sa-conv's small size (3 layers, 9 heads, hidden 64, MLP 128).
SMALL_CONFIG = dict(
    dataset="Cifar10", model="bert", vocab_size_or_config_json_file=-1, hidden_size=64,
    position_encoding_size=-1, num_hidden_layers=3, num_attention_heads=9, intermediate_size=128,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    max_position_embeddings=16, type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
    add_positional_encoding_to_input=False, use_learned_2d_encoding=False, share_position_encoding=False,
    use_attention_data=False, use_gaussian_attention=True, attention_isotropic_gaussian=False,
    gaussian_init_sigma_std=0.01, gaussian_init_mu_std=2.0, attention_gaussian_blur_trick=False,
    pooling_concatenate_size=2, pooling_use_resnet=False,
)

# sa-conv encoding -> the reference's flags that select it (all four flags, so that any base
# config gives the variant).
ENCODING_FLAGS = {
    "quadratic": dict(use_gaussian_attention=True, attention_isotropic_gaussian=True,
                      use_learned_2d_encoding=False, use_attention_data=False),
    "quadratic_full": dict(use_gaussian_attention=True, attention_isotropic_gaussian=False,
                           use_learned_2d_encoding=False, use_attention_data=False),
    "learned": dict(use_gaussian_attention=False, attention_isotropic_gaussian=False,
                    use_learned_2d_encoding=True, use_attention_data=False),
    "content_plus_learned_bias": dict(use_gaussian_attention=False, attention_isotropic_gaussian=False,
                                      use_learned_2d_encoding=True, use_attention_data=True),
}

# sa-conv ModelConfig field -> the reference's config key, with its train.py default.
CONFIG_KEYS = {
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "hidden_size": ("hidden_size", None),
    "mlp_size": ("intermediate_size", None),
    "pooling_width": ("pooling_concatenate_size", 1),
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "layer_norm_epsilon": ("layer_norm_eps", 1e-12),
    "max_grid_size": ("max_position_embeddings", 16),
    "position_embedding_dim": ("position_encoding_size", -1),  # -1: the hidden size (sa-conv: None)
    "center_init_std": ("gaussian_init_mu_std", 2.0),
    "spread_init_std": ("gaussian_init_sigma_std", 0.01),
}

# Its train.py applies no weight decay to parameters whose names contain these.
NO_WEIGHT_DECAY = ("attention_spreads", "attention_centers")


def encoding_of(config: dict) -> str | None:
    """The sa-conv encoding the reference ``config`` selects, or None (BERT's 1-D attention,
    which sa-conv does not have)."""
    if config.get("use_gaussian_attention"):
        return "quadratic" if config.get("attention_isotropic_gaussian") else "quadratic_full"
    if config.get("use_learned_2d_encoding"):
        return "content_plus_learned_bias" if config.get("use_attention_data") else "learned"
    return None


def model_fields(config: dict) -> dict:
    """`sa_conv.ModelConfig` fields of the reference ``config`` (sizes, dropout, LayerNorm
    epsilon, table size, initialization of the Gaussians; ``encoding`` from `encoding_of`).
    Keys without a default must be present."""
    fields = {}
    for field, (key, default) in CONFIG_KEYS.items():
        value = config[key] if default is None else config.get(key, default)
        if field == "position_embedding_dim":
            fields[field] = None if value in (-1, None) else int(value)
        else:
            fields[field] = type(default if default is not None else 1)(value)
    encoding = encoding_of(config)
    if encoding is not None:
        fields["encoding"] = encoding
    return fields


def reference_config(encoding: str, base: dict | None = None, **fields) -> dict:
    """The reference config of the sa-conv ``encoding`` (a key of `ENCODING_FLAGS`), from
    ``base`` (default `SMALL_CONFIG`) with sa-conv ModelConfig ``fields`` (e.g.
    ``hidden_size=400``) translated by `CONFIG_KEYS`."""
    if encoding not in ENCODING_FLAGS:
        raise ValueError(f"The reference has no {encoding!r} attention; it has {', '.join(ENCODING_FLAGS)}.")
    config = {**(SMALL_CONFIG if base is None else base), **ENCODING_FLAGS[encoding]}
    for field, value in fields.items():
        if field not in CONFIG_KEYS:
            raise ValueError(f"{field!r} has no reference config key; known: {', '.join(CONFIG_KEYS)}.")
        key, _ = CONFIG_KEYS[field]
        config[key] = -1 if (field == "position_embedding_dim" and value is None) else value
    return config


def reference_sgd(model, torch, lr=0.1, momentum=0.9, weight_decay=1e-4):
    """Its train.py's optimizer for ``model`` (a torch module): SGD with momentum and weight
    decay on every parameter except the Gaussian centers and spreads (`NO_WEIGHT_DECAY`).
    ``torch`` is passed in: this module does not import it."""
    named = dict(model.named_parameters())
    spared = [p for n, p in named.items() if any(s in n for s in NO_WEIGHT_DECAY)]
    decayed = [p for n, p in named.items() if not any(s in n for s in NO_WEIGHT_DECAY)]
    return torch.optim.SGD([{"params": decayed}, {"params": spared, "weight_decay": 0.0}],
                           lr=lr, momentum=momentum, weight_decay=weight_decay)
