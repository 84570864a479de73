"""Model builders: the paper's fully-attentional classifier and `build_model` for any preset."""

from __future__ import annotations

import inspect

import keras
import numpy as np
from keras import ops

from sa_conv.config import ModelConfig, get_config, override
from sa_conv.initializers import bias_for, dense_initializers
from sa_conv.invertible_pooling import InvertiblePooling
from sa_conv.preprocessing import REFERENCE_PIXEL_MEAN, REFERENCE_PIXEL_STD, PixelNormalization
from sa_conv.resnet import RESNETS, build_resnet
from sa_conv.seeded_dropout import stochastic_depth_rates
from sa_conv.transformer import ServingTransformerBlock, TransformerBlock


def _statistics(config: ModelConfig):
    """The normalization statistics of ``config``; the reference's CIFAR-10 constants when it has none."""
    return config.pixel_mean or REFERENCE_PIXEL_MEAN, config.pixel_std or REFERENCE_PIXEL_STD


def build_attention_classifier(config: ModelConfig, name: str = "sa_classifier", dtype=None) -> keras.Model:
    """The paper's classifier as a functional `keras.Model`.

    ``image`` ``(batch, S, S, C)`` raw pixels -> normalize -> invertible pooling (w) ->
    dense embedding to ``hidden_size`` -> ``num_layers`` `TransformerBlock`s on the
    ``(S/w) x (S/w)`` grid -> mean over all positions -> dense ``logits (batch, classes)``
    (``S = image_size``, 32 for CIFAR).

    ``dtype``: the layers' dtype policy (e.g. ``"mixed_bfloat16"``; None: Keras's global policy);
    the logits are float32 whatever it is.
    """
    def dense(units, fan_in, name, **kwargs):  # new initializer objects per layer: one object repeats its values
        init = dense_initializers(config.initialization, config.initializer_range)
        kwargs.setdefault("dtype", dtype)
        return keras.layers.Dense(units, kernel_initializer=init["kernel_initializer"],
                                  bias_initializer=bias_for(init["bias_initializer"], fan_in), name=name, **kwargs)

    inputs = keras.Input((config.image_size, config.image_size, config.image_channels), name="image")
    x = PixelNormalization(*_statistics(config), name="normalize", dtype=dtype)(inputs)
    if config.pooling_width > 1:
        x = InvertiblePooling(config.pooling_width, name="invertible_pooling", dtype=dtype)(x)
    x = dense(config.hidden_size, config.image_channels * config.pooling_width ** 2, "embedding")(x)
    attention_config = dict(
        num_heads=config.num_heads,
        encoding=config.encoding,
        max_grid_size=config.max_grid_size,
        position_embedding_dim=config.position_embedding_dim,
        attention_dropout=config.attention_dropout,
        center_init_std=config.center_init_std,
        spread_init_std=config.spread_init_std,
        initializer_range=config.initializer_range,
        fast_position_attention=config.fast_position_attention,
        encoding_options=config.encoding_options,
        initialization=config.initialization,
    )
    if config.attention_init != "random":  # only then: the configs of existing models stay as they were
        attention_config.update(attention_init=config.attention_init, locality_strength=config.locality_strength,
                                locality_distance=config.locality_distance)
    drop_paths = stochastic_depth_rates(config.stochastic_depth, config.num_layers)
    for i in range(config.num_layers):
        x = TransformerBlock(
            config.mlp_size,
            dropout=config.dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            attention_config=attention_config,
            # The last block's backward pass runs right after its forward pass: recomputing it
            # would cost a forward pass and lower no peak.
            remat=config.remat and i < config.num_layers - 1,
            drop_path=drop_paths[i],
            name=f"block_{i}",
            dtype=dtype,
        )(x)
    x = keras.layers.GlobalAveragePooling2D(name="mean_over_positions", dtype=dtype)(x)
    logits = dense(config.num_classes, config.hidden_size, "logits", dtype="float32")(x)
    return keras.Model(inputs, logits, name=name)


def build_model(name_or_config: str | ModelConfig = "sa_quadratic_small", name: str | None = None,
                dtype=None, **overrides) -> keras.Model:
    """Builds a preset by name (see `sa_conv.PRESETS`) or a `ModelConfig`.

    ``overrides`` change fields of the preset, e.g. ``build_model("sa_quadratic", num_layers=2)``;
    ``name`` names the model (default: the preset's name, or ``"sa_model"`` for a config);
    ``dtype`` is its layers' dtype policy (e.g. ``"mixed_bfloat16"``; None: Keras's global one).
    The model maps ``image`` ``(batch, image_size, image_size, image_channels)`` uint8 or
    float pixels in [0, 255] to ``logits`` ``(batch, num_classes)`` float32.
    """
    if isinstance(name_or_config, ModelConfig):
        config, name = override(name_or_config, "the config", **overrides), name or "sa_model"
    else:
        config, name = get_config(name_or_config, **overrides), name or name_or_config
    if config.architecture in RESNETS:
        mean, std, spec = *_statistics(config), RESNETS[config.architecture]
        return build_resnet(config.image_size, config.num_classes, spec.blocks, spec.widths, name=name,
                            image_channels=config.image_channels, pixel_mean=mean, pixel_std=std,
                            initialization=config.initialization, dtype=dtype, stochastic_depth=config.stochastic_depth)
    return build_attention_classifier(config, name=name, dtype=dtype)


def attention_blocks(model: keras.Model) -> list[keras.layers.Layer]:
    """The model's transformer blocks, in order: its `TransformerBlock` layers (in a serving copy,
    `ServingTransformerBlock`), or any layer with an ``attention`` sublayer."""
    return [layer for layer in model.layers if isinstance(getattr(layer, "attention", None), keras.layers.Layer)]


def is_frozen(model: keras.Model) -> bool:
    """Whether ``model`` is a serving copy (`sa_conv.serving.freeze_for_inference`: it has serving blocks)."""
    return any(isinstance(layer, ServingTransformerBlock) for layer in model.layers)


def _with_nested(model: keras.Model):
    """``model`` and the models among its layers, at any depth (a classifier wrapped with
    preprocessing layers in a `keras.Sequential`)."""
    yield model
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _with_nested(layer)


def no_weight_decay(model: keras.Model) -> list:
    """The variables of ``model`` that take no weight decay, as its layers declare them (each
    attention layer's ``no_weight_decay``: the quadratic encodings' centers and spreads, as in the
    reference implementation), also in models nested in it; the trainer decays every other
    trainable variable."""
    return [v for inner in _with_nested(model) for block in attention_blocks(inner)
            if hasattr(block.attention, "no_weight_decay") for v in block.attention.no_weight_decay()]


def attention_grid(model: keras.Model) -> tuple[tuple[int, int], int]:
    """``((H, W), w)``: the model's attention grid and the invertible-pooling width before it."""
    if not attention_blocks(model):
        raise ValueError(f"Model {model.name!r} has no attention layers.")
    width = next((layer.width for layer in model.layers if isinstance(layer, InvertiblePooling)), 1)
    _, height, image_width, _ = model.inputs[0].shape
    return (height // width, image_width // width), width


def copy_weights(source: keras.Model, target: keras.Model, skip=None) -> None:
    """Assigns every weight of ``source`` to the weight of ``target`` with the same path. ValueError
    when a weight of either model has no counterpart, except the paths of either for which
    ``skip(path)`` is true (the caller sets those)."""
    skip = skip or (lambda path: False)
    values = {v.path: v for v in source.weights if not skip(v.path)}
    for variable in target.weights:
        if skip(variable.path):
            continue
        if variable.path not in values:
            raise ValueError(f"{variable.path} has no counterpart in {source.name}.")
        variable.assign(ops.cast(values.pop(variable.path), variable.dtype))
    if values:
        raise ValueError(f"{sorted(values)[:5]} of {source.name} have no counterpart in the copy.")


def with_dtype_policy(model: keras.Model, policy: str) -> keras.Model:
    """A copy of ``model`` whose layers compute under the dtype ``policy`` (e.g.
    ``"mixed_bfloat16"``: float32 weights, bfloat16 compute), with ``model``'s weights. The input
    layer and the output layer keep their dtypes (raw pixels in, float32 logits out), and the
    attention encodings' weights and position terms stay float32 whatever the policy
    (`RelativeEncoding`)."""
    keep = {id(model.get_layer(name)) for name in model.output_names}

    def clone(layer):
        config = layer.get_config()
        if not isinstance(layer, keras.layers.InputLayer) and id(layer) not in keep:
            config = {**config, "dtype": policy}
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy_weights(model, copy)
    return copy


def interpolate_offset_table(table, size: int, scale: float):
    """A relative-offset table ``(2 P - 1, ...)`` (row ``P - 1 + d`` for offset ``d``) resampled to
    ``(2 size - 1, ...)``: offset ``d`` of the new grid reads the old table at ``d * scale``
    (``scale`` = old grid side / new grid side, so an offset covers the same fraction of the image),
    linearly between the two nearest offsets and clamped at the table's ends. NumPy, float64."""
    table = np.asarray(table, np.float64)
    old = (table.shape[0] + 1) // 2
    position = np.clip(np.arange(-(size - 1), size) * float(scale), -(old - 1), old - 1) + (old - 1)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, table.shape[0] - 1)
    weight = (position - low).reshape((-1,) + (1,) * (table.ndim - 1))
    return (1 - weight) * table[low] + weight * table[high]


def with_image_size(model: keras.Model, image_size: int, max_grid_size: int | None = None) -> keras.Model:
    """A copy of ``model`` that takes ``image_size x image_size`` images, with ``model``'s weights.

    Attention on the ``(image_size / w)``-sided grid (``w``: the pooling width): the quadratic,
    sinusoidal and MLP encodings are functions of the offset and keep their weights; the learned
    tables (the ``learned`` encoding's, and the content encodings' offset tables) are resized to
    ``2 max_grid_size - 1`` offsets with `interpolate_offset_table`, reading offset ``d`` at
    ``d * old grid / new grid``: at twice the resolution, offset 2 gets what offset 1 had. Every
    other weight is copied as it is (ResNets: all of them). ``max_grid_size``: of the copy's
    tables; None: the new grid, or the old tables' reach scaled with the grid when larger.

    Raises ValueError for a size the pooling does not divide, or a model frozen for inference
    (its constants belong to one grid: change the resolution first, then freeze)."""
    image_size = int(image_size)
    _, height, _, channels = model.inputs[0].shape
    blocks = attention_blocks(model)
    if is_frozen(model):
        raise ValueError("The model holds inference constants for its grid: call with_image_size on the model it "
                         "was frozen from, then sa_conv.freeze_for_inference.")
    (old_grid, _), pooling = attention_grid(model) if blocks else ((height, height), 1)
    if image_size < 1 or image_size % pooling:
        raise ValueError(f"image_size must be a positive multiple of the pooling width {pooling}, got {image_size}.")
    grid = image_size // pooling
    tables = {}

    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, TransformerBlock):
            attention = config["attention_config"]
            reach = max_grid_size or max(grid, round(attention["max_grid_size"] * grid / old_grid))
            tables[layer.name] = reach
            config = {**config, "attention_config": {**attention, "max_grid_size": reach}}
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone,
                                    input_tensors=keras.Input((image_size, image_size, channels), name="image"))
    values = {v.path: v for v in model.weights}
    for variable in copy.weights:
        value = values.pop(variable.path, None)
        if value is None:
            raise ValueError(f"{variable.path} has no counterpart in {model.name}.")
        value = ops.convert_to_numpy(value)
        if tuple(value.shape) != tuple(variable.shape):
            block = variable.path.split("/")[0]
            if block not in tables or variable.shape[0] != 2 * tables[block] - 1 or value.shape[1:] != variable.shape[1:]:
                raise ValueError(f"{variable.path}: shape {tuple(value.shape)} cannot become {tuple(variable.shape)}.")
            value = interpolate_offset_table(value, tables[block], old_grid / grid)
        variable.assign(np.asarray(value).astype(variable.dtype))
    return copy


def attention_probabilities(model: keras.Model, images) -> list:
    """Attention probabilities of every block for ``images``: a list (one per layer) of
    ``(batch, heads, N, N)`` float32, N = grid pixels, row-major. Inference mode. ``model``'s
    layers run in order (a chain: sa_conv's classifiers, or a `keras.Sequential`)."""
    blocks = attention_blocks(model)
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no attention blocks.")
    for block in blocks:
        if "return_attention_scores" not in inspect.signature(block.call).parameters:
            raise ValueError(
                f"Layer {block.name!r} ({type(block).__name__}) gives no attention scores: attention_probabilities "
                "reads the transformer blocks of sa_conv's classifiers. A convolution converted to attention attends "
                "by position only, the same for every image: call its `.attention` layer with "
                "return_attention_scores=True on any input of the padded grid it attends over.")
    x = images
    probs = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):  # a functional model lists its input, a Sequential does not
            continue
        if any(layer is block for block in blocks):
            x, p = layer(x, training=False, return_attention_scores=True)
            probs.append(p)
            if len(probs) == len(blocks):
                break
        else:
            x = layer(x)
    return probs

