"""Import of models trained with the reference implementation (GitHub ``epfml/attention-cnn``,
PyTorch): its config to a `ModelConfig`, its state dict to the weights of the matching sa-conv
model.

    state = sa_conv.reference.read_state_dict("best.checkpoint")      # or an .npz of it
    config = sa_conv.reference.model_config(reference_config)        # its config.yaml / JSON
    model = sa_conv.build_model(config)
    sa_conv.reference.load_reference_weights(model, state)

What maps to what (PyTorch ``Linear`` stores ``(out, in)``: kernels are transposed):

==========================================================  ================================
reference (``BertImage``)                                   sa-conv
==========================================================  ================================
``features_upscale``                                        ``embedding``
``encoder.layer.i.attention.self.attention_centers``        ``block_i`` encoding ``centers``
``... .attention_spreads``                                  ``spreads`` (same parameterization)
``... .row_embeddings`` / ``head_keys_row``                 ``col_embeddings`` / ``col_head_keys``
``... .col_embeddings`` / ``head_keys_col``                 ``row_embeddings`` / ``row_head_keys``
``... .query`` / ``.key`` (content)                         ``attention/query`` / ``attention/key``
``... .value`` (``heads*D -> D``, head-major)               ``attention/value``
``encoder.layer.i.attention.output.dense`` / ``LayerNorm``  ``attention_output`` / ``attention_norm``
``encoder.layer.i.intermediate.dense``                      ``intermediate``
``encoder.layer.i.output.dense`` / ``LayerNorm``            ``output`` / ``output_norm``
``classifier``                                              ``logits``
==========================================================  ================================

The reference names its learned tables after the axis of the *flattened loop* they come from:
its ``row_embeddings`` score the column offset (``dx``) and ``col_embeddings`` the row offset
(``dy``), hence the swap (the fixtures of ``tests/fixtures/reference`` decide). ResNet18: ``conv``
kernels ``(out, in, kh, kw)`` become ``(kh, kw, in, out)``; BatchNorm ``weight``, ``bias``,
``running_mean``, ``running_var`` become ``gamma``, ``beta``, ``moving_mean``,
``moving_variance``.

Buffers the reference derives from its config (``R``, ``relative_indices``, ``attention_mask``,
``num_batches_tracked``) are recomputed by sa-conv: ignored when present, not required. Every
other tensor must be used exactly once and every sa-conv weight set exactly once; anything
unmatched raises `ReferenceImportError` naming it.
"""

from __future__ import annotations

import json
import os
import re

import epfml_reference
import keras
import numpy as np
from keras import ops

from sa_conv.config import ModelConfig, get_config
from sa_conv.errors import SaConvError
from sa_conv.models import attention_blocks

# Buffers the reference recomputes from its config; sa-conv does too.
DERIVED_BUFFERS = re.compile(r"(^|\.)(R|relative_indices|attention_mask|num_batches_tracked)$")
# The reference's CIFAR-10 normalization (its train.py's; `epfml_reference` holds what sa-conv
# knows of the reference).
REFERENCE_MEAN, REFERENCE_STD = epfml_reference.PIXEL_MEAN, epfml_reference.PIXEL_STD


class ReferenceImportError(SaConvError):
    """A reference checkpoint or config that sa-conv cannot import; the message says which
    tensor or setting and why."""


# --------------------------------------------------------------------------- config


def read_reference_config(path: str) -> dict:
    """The reference's config: its ``config.yaml`` (written by its ``train.py``) or JSON."""
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        values = yaml.safe_load(text)
    else:
        values = json.loads(text)
    if not isinstance(values, dict):
        raise ReferenceImportError(f"{path} does not hold a config mapping.")
    return values


def _unsupported(config: dict) -> list[str]:
    checks = [
        ("pooling_use_resnet", False, "a pretrained ResNet-50 stem"),
        ("add_positional_encoding_to_input", False, "absolute position embeddings on the input"),
        ("attention_gaussian_blur_trick", False, "the 7x7 convolution approximation of Gaussian attention"),
        ("share_position_encoding", False, "learned tables shared by all layers"),
    ]
    problems = [f"{key}={config[key]!r} ({what})" for key, default, what in checks if config.get(key, default)]
    if config.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act={config['hidden_act']!r} (sa-conv's MLP uses the exact GELU)")
    return problems


def model_config(config: dict) -> ModelConfig:
    """The `ModelConfig` of the reference model ``config`` (its ``train.py`` config dict):
    layers, heads, hidden and MLP sizes, encoding, pooling, dropout, LayerNorm epsilon, table
    size, classes, and the reference's pixel normalization."""
    classes = epfml_reference.DATASET_CLASSES.get(config.get("dataset", "Cifar10"))
    if classes is None:
        raise ReferenceImportError(f"dataset={config.get('dataset')!r}: only Cifar10 and Cifar100 are known.")
    stats = dict(num_classes=classes, pixel_mean=REFERENCE_MEAN, pixel_std=REFERENCE_STD)
    name = config.get("model", "bert")
    if name == "resnet18":
        return get_config("resnet18", **stats)
    if name != "bert":
        raise ReferenceImportError(f"model={name!r}: sa-conv imports the reference's 'bert' and 'resnet18'.")
    problems = _unsupported(config)
    if problems:
        raise ReferenceImportError("sa-conv has no equivalent of the reference's " + "; ".join(problems) + ".")
    fields = epfml_reference.model_fields(config)
    if "encoding" not in fields:
        raise ReferenceImportError(
            "The config uses neither Gaussian nor learned 2-D attention (BERT's 1-D attention over the "
            "flattened image); sa-conv has no such model."
        )
    return get_config("sa_quadratic", **fields, **stats)


# --------------------------------------------------------------------------- state dict


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """The reference's state dict from ``path``: a PyTorch checkpoint (its ``train.py``'s
    ``{"model_state_dict": ...}`` or a bare state dict; read with ``torch.load(...,
    weights_only=True)``, which needs torch: ``pip install .[reference]``), or an ``.npz`` of it
    (made where torch is installed with ``np.savez(out, **{k: v.numpy() for k, v in
    state.items()})``). A ``module.`` prefix (``DataParallel``) is removed."""
    if not os.path.isfile(path):
        raise ReferenceImportError(f"No checkpoint at {path}.")
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as data:
            # A fixture of tools/make_reference_fixtures.py keeps its state dict under "state/".
            prefix = "state/" if any(k.startswith("state/") for k in data.files) else ""
            state = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
    else:
        try:
            import torch
        except ImportError:
            raise ReferenceImportError(
                f"{path} is a PyTorch checkpoint and torch is not installed: `pip install .[reference]`, or "
                "convert it where torch is installed: python -c \"import numpy as np, torch; "
                "s = torch.load('CKPT', weights_only=True); s = s.get('model_state_dict', s); "
                "np.savez('CKPT.npz', **{k: v.numpy() for k, v in s.items()})\""
            ) from None
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ReferenceImportError(f"{path} is not a readable PyTorch checkpoint ({exc}).") from None
        if isinstance(loaded, dict) and "model_state_dict" in loaded:
            loaded = loaded["model_state_dict"]
        if not isinstance(loaded, dict):
            raise ReferenceImportError(f"{path} holds a {type(loaded).__name__}, not a state dict.")
        state = {k: v.detach().cpu().numpy() for k, v in loaded.items()}
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def _linear(prefix, dense):
    return [(f"{prefix}.weight", dense.kernel, np.transpose), (f"{prefix}.bias", dense.bias, None)]


def _layer_norm(prefix, norm):
    return [(f"{prefix}.weight", norm.gamma, None), (f"{prefix}.bias", norm.beta, None)]


def _tables(prefix, encoding):
    # The reference's "row" tables score the column offset (see the module docstring).
    return [
        (f"{prefix}.row_embeddings.weight", encoding.col_embeddings, None),
        (f"{prefix}.col_embeddings.weight", encoding.row_embeddings, None),
        (f"{prefix}.head_keys_row.weight", encoding.col_head_keys, np.transpose),
        (f"{prefix}.head_keys_col.weight", encoding.row_head_keys, np.transpose),
    ]


def _quadratic(prefix, attention):
    encoding = attention.position_encoding
    return [(f"{prefix}.attention_centers", encoding.centers, None),
            (f"{prefix}.attention_spreads", encoding.spreads, None)]


def _learned(prefix, attention):
    return _tables(prefix, attention.position_encoding)


def _content_plus_learned_bias(prefix, attention):
    return (_tables(prefix, attention.position_encoding.position) + _linear(f"{prefix}.query", attention.query_dense)
            + _linear(f"{prefix}.key", attention.key_dense))


# The encoding-specific tensors of the reference's self-attention, for each encoding it has
# (`epfml_reference.ENCODING_FLAGS`), from a `MultiHeadSelfAttention2D`.
ENCODING_TENSORS = {"quadratic": _quadratic, "quadratic_full": _quadratic, "learned": _learned,
                    "content_plus_learned_bias": _content_plus_learned_bias}


def _attention_map(model):
    plan = _linear("features_upscale", model.get_layer("embedding"))
    for i, block in enumerate(attention_blocks(model)):
        p = f"encoder.layer.{i}"
        attention = block.attention
        if attention.encoding not in ENCODING_TENSORS:
            raise ReferenceImportError(
                f"Block {i}'s {attention.encoding!r} encoding has no counterpart in the reference "
                f"implementation (it has {', '.join(epfml_reference.ENCODING_FLAGS)})."
            )
        plan += ENCODING_TENSORS[attention.encoding](f"{p}.attention.self", attention)
        plan += _linear(f"{p}.attention.self.value", attention.value_dense)
        plan += _linear(f"{p}.attention.output.dense", block.attention_output)
        plan += _layer_norm(f"{p}.attention.output.LayerNorm", block.attention_norm)
        plan += _linear(f"{p}.intermediate.dense", block.intermediate)
        plan += _linear(f"{p}.output.dense", block.output_dense)
        plan += _layer_norm(f"{p}.output.LayerNorm", block.output_norm)
    return plan + _linear("classifier", model.get_layer("logits"))


def _conv_bn(prefix, conv_bn_name, model, conv_key="conv", bn_key="bn"):
    conv, bn = model.get_layer(f"{conv_bn_name}_conv"), model.get_layer(f"{conv_bn_name}_bn")
    return [
        (f"{prefix}{conv_key}.weight", conv.kernel, lambda w: np.transpose(w, (2, 3, 1, 0))),
        (f"{prefix}{bn_key}.weight", bn.gamma, None),
        (f"{prefix}{bn_key}.bias", bn.beta, None),
        (f"{prefix}{bn_key}.running_mean", bn.moving_mean, None),
        (f"{prefix}{bn_key}.running_var", bn.moving_variance, None),
    ]


def _resnet_map(model):
    plan = _conv_bn("", "stem", model, "conv1", "bn1")
    for stage in range(1, 5):
        for block in range(2):
            ours, theirs = f"stage{stage}_block{block + 1}", f"layer{stage}.{block}."
            plan += _conv_bn(theirs, f"{ours}_1", model, "conv1", "bn1")
            plan += _conv_bn(theirs, f"{ours}_2", model, "conv2", "bn2")
            if any(layer.name == f"{ours}_shortcut_conv" for layer in model.layers):
                plan += _conv_bn(f"{theirs}shortcut.", f"{ours}_shortcut", model, "0", "1")
    return plan + _linear("linear", model.get_layer("logits"))


def _is_resnet(model) -> bool:
    return any(layer.name == "stem_conv" for layer in model.layers)


def weight_map(model: keras.Model) -> list:
    """``[(reference tensor name, sa-conv variable, transform or None), ...]`` for ``model``:
    the table of the module docstring, one entry per sa-conv weight."""
    return _resnet_map(model) if _is_resnet(model) else _attention_map(model)


def load_reference_weights(model: keras.Model, state_dict: dict) -> keras.Model:
    """Sets every weight of ``model`` (an sa-conv attention classifier or ResNet18 built from
    `model_config` of the reference's config) from the reference's ``state_dict`` (name ->
    array or torch tensor). Raises `ReferenceImportError` naming every tensor left unused,
    missing or of the wrong shape, and every sa-conv weight left unset. Returns ``model``."""
    state = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in state_dict.items()}
    plan = weight_map(model)
    problems, values = [], {}
    for key, variable, transform in plan:
        if key not in state:
            problems.append(f"missing {key} (for {variable.path} {tuple(variable.shape)})")
            continue
        value = state[key] if transform is None else transform(state[key])
        if tuple(value.shape) != tuple(variable.shape):
            problems.append(f"{key} has shape {state[key].shape}; {variable.path} needs {tuple(variable.shape)}")
            continue
        values[id(variable)] = (variable, value)
    used = {key for key, _, _ in plan}
    unused = sorted(k for k in state if k not in used and not DERIVED_BUFFERS.search(k))
    problems += [f"unused {k} {state[k].shape}" for k in unused]
    planned = [id(variable) for _, variable, _ in plan]
    problems += [f"sa-conv weight {v.path} has no reference tensor" for v in model.weights
                 if id(v) not in planned and "seed_generator" not in v.path]
    problems += [f"sa-conv weight {v.path} would be set twice" for _, v, _ in plan if planned.count(id(v)) > 1]
    if problems:
        raise ReferenceImportError(
            f"The state dict does not match {model.name} ({len(problems)} problem(s)): " + "; ".join(problems[:20])
            + (" ..." if len(problems) > 20 else "")
            + ". Build the model with sa_conv.reference.model_config(<the reference's config>)."
        )
    for variable, value in values.values():
        variable.assign(ops.convert_to_tensor(value.astype(np.float32), dtype=variable.dtype))
    return model


def import_reference(state_dict: dict, config: dict) -> keras.Model:
    """The sa-conv model of the reference's ``config`` with the weights of ``state_dict``."""
    from sa_conv.models import build_model

    config = model_config(config)
    name = "reference_resnet18" if config.architecture == "resnet18" else f"reference_{config.encoding}"
    return load_reference_weights(build_model(config, name=name), state_dict)
