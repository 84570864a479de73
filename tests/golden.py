"""Golden outputs of every preset with fixed weights: the proof that a redesign changed nothing.

    python -m tests.golden --write          # records tests/fixtures/golden/<preset>.npz

Run it only before a change meant to keep behaviour, and commit the fixtures before the change.
A recording made later (a preset's gradients in another dtype) is checked against the one it
replaces, to that one's bound, before it is committed.

`record(preset)` builds the preset, sets every variable from a generator keyed by the variable's
path (so neither the order in which layers create their weights nor the initializers matter;
dropout seed-generator states included) and computes, for fixed images and labels:

* ``logits``: inference logits ``(4, classes)``;
* ``attention``: block 0's inference attention probabilities for queries ``0, 102, 204``
  (``(2, heads, 3, N)``; attention presets only);
* ``grad/<variant>/<path>`` (or ``sketch/...``): the gradient of one training step's mean cross-entropy for each
  variable, under the variants of `VARIANTS` (remat on and off, attention dropout on and off,
  the dropout masks drawn from the fixed seed-generator states), in `gradient_dtype`. Gradients of up to
  `WHOLE` entries are kept whole, and so is one within its bound of zero (the key bias, which the
  softmax removes: rounding only, with no norm of its own to compare a sketch to); larger ones as
  a sketch (`sketch`: their dot products with fixed random vectors, and their norm), which moves
  with any change of them: the whole gradients of the presets would weigh tens of MB;
* ``frozen``: logits of `sa_conv.freeze_for_inference(model)`;
* ``bfloat16``: logits of the frozen ``mixed_bfloat16`` copy (`with_dtype_policy` first).

`tests/test_golden.py` recomputes them and compares. A fixture keeps what the comparison needs
(`stored`): a remat variant's gradients are compared with those of the same step without remat
(`RECORDED_AS`: remat recomputes the same step; the recordings of both agreed to 0.1% of their
bound), and a paper-size preset keeps the part of its recording that depends on size
(`in_part`). The fixtures were recorded before the one-path redesign with every variant whole up
to 4096 entries and six attention queries, and later cut to this layout from that recording
(sketches of the recorded gradients, a subset of the recorded queries), not recorded again;
``resnet20``'s was recorded when the preset was added, and guards only later changes.
"""

from __future__ import annotations

import argparse
import pathlib
import zlib

import keras
import numpy as np
from keras import ops

import sa_conv
from tests import tiers, tolerances

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden"
# (remat, attention_dropout) of the training-step gradients.
VARIANTS = {"plain": (False, 0.0), "remat": (True, 0.0), "attention_dropout": (False, 0.1),
            "remat_attention_dropout": (True, 0.1)}
# The recorded variant each variant is compared with: remat recomputes the same step.
RECORDED_AS = {"plain": "plain", "remat": "plain", "attention_dropout": "attention_dropout",
               "remat_attention_dropout": "attention_dropout"}
BATCH = 4
GRAD_BATCH = 2
WHOLE = 2048
SKETCHES = 4
# Block 0's attention is recorded for every QUERY_STEP-th query of the 16x16 grid.
QUERY_STEP = 102


def gradient_dtype(config) -> str:
    """The dtype (``"float32"`` or ``"float64"``) a preset's training-step gradients are recorded
    and recomputed in, for its `sa_conv.ModelConfig`.

    ReLU's derivative jumps at zero, so every ResNet records in float64. ResNet18's training step on
    `GRAD_BATCH` images has 1.1 million ReLU inputs (ResNet-20's about 0.4 million), and a float32
    evaluation with other kernels moves each by up to about 1e-6 of its layer's scale: on average
    about one of them crosses zero, and its side, which the kernel set decides, moves the gradients
    of the layers below it beyond float32's bound (Eigen against oneDNN on one AMD EPYC with
    AVX-512: one crossing in ``stage1_block1_out``, 0.18% of the gradient scale against a bound of
    0.10%). In float64 the odds of one crossing are about 1e-9. The attention presets' activations
    on images are smooth (GELU, softmax); their only kinks are the MLP encoding's ReLUs, on the
    fixed offsets rather than the images (about 60 thousand inputs a block, computed by a short
    sum): they are recorded in float32, the dtype they train in."""
    return "float32" if config.is_attention else "float64"


def presets() -> list[str]:
    return sa_conv.preset_names()


def _rng(path: str, salt: str = "") -> np.random.Generator:
    return np.random.default_rng(zlib.crc32((salt + path).encode()))


def canonical_path(path: str) -> str:
    """The variable's path as the fixtures name it (one place to map a renamed path)."""
    return path


def _value(variable) -> np.ndarray:
    """The fixed value of ``variable``, from its path: scaled to its role, so that activations
    stay in range and attention is neither uniform nor one-hot."""
    path = canonical_path(variable.path)
    shape = tuple(variable.shape)
    rng = _rng(path)
    name = path.split("/")[-1]
    if "seed_generator" in path:
        return rng.integers(1, 2 ** 30, shape).astype(variable.dtype)
    if name in ("gamma", "moving_variance"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32) ** (2 if name == "moving_variance" else 1)
    if name == "centers":
        return rng.normal(0.0, 2.0, shape).astype(np.float32)
    if name == "spreads":
        return (0.5 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = shape[0] if len(shape) == 2 else (int(np.prod(shape[:-1])) if len(shape) > 2 else 10)
    return rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape).astype(np.float32)


def build(preset: str, change=None, **overrides) -> keras.Model:
    """The preset with every variable at its fixed value (`_value`); ``change(model)``, if given,
    then alters it (a deliberate break, to show that a comparison notices one)."""
    # Keras numbers auto-named layers and seed generators per process ("seed_generator_3"): afresh,
    # the variables' paths, and so their values, do not depend on what the process built before.
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model(preset, **overrides)
    for variable in model.variables:
        variable.assign(_value(variable))
    if change is not None:
        change(model)
    return model


def inputs():
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (BATCH, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, (BATCH,))


def _gradients(model, images, labels):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {canonical_path(v.path): ops.convert_to_numpy(g) for v, g in zip(model.trainable_variables, grads)}


def sketch_vectors(path: str, size: int) -> np.ndarray:
    """`SKETCHES` fixed standard normal vectors of ``size`` entries, keyed by ``path``."""
    return _rng(path, "sketch").standard_normal((SKETCHES, int(size)))


def sketch(path: str, gradient: np.ndarray) -> np.ndarray:
    """``(g . r_1, ..., g . r_S, |g|, size)`` for the fixed vectors of `sketch_vectors`. An
    entrywise relative change ``e`` of ``g`` moves each product by at most ``e |g| |r_i|``."""
    g = gradient.astype(np.float64).reshape(-1)
    return np.concatenate([sketch_vectors(path, g.size) @ g, [np.linalg.norm(g), g.size]])


def inference(preset: str, model) -> dict[str, np.ndarray]:
    """``logits`` and (attention presets) block 0's ``attention`` of `inputs`."""
    images, _ = inputs()
    out = {"logits": ops.convert_to_numpy(model(images, training=False))}
    if sa_conv.get_config(preset).is_attention:
        probs = ops.convert_to_numpy(sa_conv.attention_probabilities(model, images[:2])[0])
        out["attention"] = probs[:, :, ::QUERY_STEP, :]
    return out


def serving(model, bfloat16: bool = True) -> dict[str, np.ndarray]:
    """``frozen`` and (with ``bfloat16``) ``bfloat16``: the logits of the float32 and bfloat16
    serving copies."""
    images, _ = inputs()
    out = {"frozen": ops.convert_to_numpy(sa_conv.freeze_for_inference(model)(images, training=False))}
    if bfloat16:
        mixed = sa_conv.freeze_for_inference(sa_conv.with_dtype_policy(model, "mixed_bfloat16"))
        out["bfloat16"] = ops.convert_to_numpy(mixed(images, training=False)).astype(np.float32)
    return out


def kept_whole(config, grads: dict[str, np.ndarray]) -> set[str]:
    """The paths of one step's ``grads`` that a recording keeps whole: up to `WHOLE` entries, or
    within the comparison's bound of zero (`tests/test_golden.py`: relative to the largest entry
    of the gradients kept whole)."""
    relative = tolerances.gradient_relative(config, gradient_dtype(config), batch=GRAD_BATCH)
    scale = max(np.abs(g).max() for g in grads.values() if g.size <= WHOLE)
    return {path for path, g in grads.items() if g.size <= WHOLE or np.abs(g).max() <= relative * scale}


def record(preset: str, change=None, part: bool | None = None, layout=None) -> dict[str, np.ndarray]:
    """Every array of the module doc for ``preset``; with ``part`` (by default, for a paper-size
    preset), the arrays of `in_part` only. ``layout``: the keys of a fixture, whose gradients kept
    whole this recording keeps whole (by default, `kept_whole`'s)."""
    images, labels = inputs()
    model = build(preset, change)
    out = inference(preset, model)
    config = sa_conv.get_config(preset)
    part = tiers.is_paper_size(preset) if part is None else part
    attention = config.is_attention
    variants = VARIANTS if attention else {"plain": (False, 0.0)}
    if part:
        variants = {name: variants[name] for name in PART_VARIANTS}
    dtype = gradient_dtype(config)
    whole = {}
    for variant, (remat, rate) in variants.items():
        overrides = dict(remat=remat, attention_dropout=rate) if attention else {}
        grads = _gradients(build(preset, change, dtype=dtype, **overrides), images[:GRAD_BATCH], labels[:GRAD_BATCH])
        recorded = RECORDED_AS[variant]
        if recorded not in whole:
            whole[recorded] = (kept_whole(config, grads) if layout is None else
                               {path for path in grads if f"grad/{recorded}/{path}" in layout})
        for path, g in grads.items():
            if path in whole[recorded]:
                out[f"grad/{variant}/{path}"] = g
            else:
                out[f"sketch/{variant}/{path}"] = sketch(path, g)
    return {**out, **serving(model, bfloat16=not part)}


def recorded_key(key: str) -> str:
    """The key of the fixture's array that the computed array ``key`` is compared with."""
    if key.startswith(("grad/", "sketch/")):
        kind, variant, path = key.split("/", 2)
        return f"{kind}/{RECORDED_AS[variant]}/{path}"
    return key


def stored(preset: str, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays of a recording ``values`` that the fixture of ``preset`` keeps."""
    paper = tiers.is_paper_size(preset)
    return {key: value for key, value in values.items() if recorded_key(key) == key and (not paper or in_part(key))}


# A part of a recording (`record(..., part=True)`): inference, one training step's gradients without
# remat or dropout, and the float32 serving copy: what a paper-size preset records, its forward
# pass, backward pass and serving fold at paper size; the other variants and the bfloat16 copy are
# the same code at every size, recorded by the small presets.
PART_VARIANTS = ("plain",)


def in_part(key: str) -> bool:
    """Whether the recorded array ``key`` is one that ``record(..., part=True)`` computes."""
    if key.startswith(("grad/", "sketch/")):
        return key.split("/")[1] in PART_VARIANTS
    return key != "bfloat16"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fixtures (else: list them)")
    parser.add_argument("--preset", action="append", help="only these presets (repeatable)")
    args = parser.parse_args(argv)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for preset in args.preset or presets():
        if args.write:
            values = stored(preset, record(preset))
            np.savez_compressed(FIXTURES / f"{preset}.npz", **values)
            print(f"{preset}: {len(values)} arrays", flush=True)
        else:
            print(preset)


if __name__ == "__main__":
    main()
