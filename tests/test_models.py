"""Models and presets: parameter counts, forward and training steps, serialization, errors."""

import keras
import numpy as np
import pytest

import sa_conv
from sa_conv.config import ModelConfig
from tests import tiers

# The paper's Table 1 recomputed from its code; these must match exactly.
PAPER_PARAMETERS = {
    "sa_quadratic": 12_086_844,
    "sa_quadratic_full": 12_087_006,
    "sa_learned": 12_278_682,
    "sa_content_plus_learned_bias": 29_601_882,  # the reference's count (content_plus_learned_bias)
    "resnet18": 11_173_962,
}
# Presets beyond the paper's table, counted once: they must not drift either.
OTHER_PARAMETERS = {
    "sa_gated": 13_992_450,  # the quadratic model plus per-head query and key maps of D / heads channels
}
SMALL_PARAMETERS = {"sa_quadratic_small": 175_323}  # the README's and the studies' small model
SMALL = [name for name in sa_conv.PRESETS if name.endswith("_small")]


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def _images(n=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def test_preset_list():
    assert set(PAPER_PARAMETERS) <= set(sa_conv.preset_names())
    assert len(SMALL) == 7 and {name[: -len("_small")] for name in SMALL} <= set(sa_conv.preset_names())


@pytest.mark.parametrize("name", list(PAPER_PARAMETERS) + list(OTHER_PARAMETERS) + list(SMALL_PARAMETERS))
def test_preset_parameter_counts(name):
    assert _trainable(sa_conv.build_model(name)) == {**PAPER_PARAMETERS, **OTHER_PARAMETERS, **SMALL_PARAMETERS}[name]


def _train_step(model, images, labels, steps=2, optimizer=None):
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    losses = [float(model.train_on_batch(images, labels)) for _ in range(steps)]
    changed = sum(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    return losses, changed


# At paper size in `make test-all`: in `make test` the golden recording of paper sa_quadratic holds
# its forward pass and a step's gradients, and every small twin fits a batch.
@pytest.mark.slow
@pytest.mark.parametrize("name", tiers.presets(list(PAPER_PARAMETERS) + list(OTHER_PARAMETERS), in_make_test=()))
def test_paper_presets_run_a_forward_and_training_step(name):
    model = sa_conv.build_model(name)
    images, labels = _images(2), np.array([3, 7])
    logits = _np(model(images, training=False))
    assert logits.shape == (2, 10) and np.isfinite(logits).all()
    losses, changed = _train_step(model, images, labels, steps=1)
    assert np.isfinite(losses).all() and changed > 0.9 * len(model.trainable_weights)


# One preset in the fast tier: the backends' pass (JAX, PyTorch) trains a model too.
@pytest.mark.parametrize("name", [n if n == "sa_quadratic_small" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SMALL])
def test_small_presets_fit_a_batch(name):
    """A training step really trains: the loss on one fixed batch falls. One block: the others are
    the same code, and every preset's gradients through all its blocks are checked in test_golden."""
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model(name, dropout=0.0, num_layers=1)
    images, labels = _images(16, seed=1), np.arange(16) % 10
    losses, changed = _train_step(model, images, labels, steps=15, optimizer=keras.optimizers.Adam(3e-3))
    assert changed == len(model.trainable_weights)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("name", tiers.presets(list(PAPER_PARAMETERS) + SMALL, in_make_test=()))
def test_keras_file_round_trip(name, tmp_path):
    model = sa_conv.build_model(name)
    images = _images(3)
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert restored.name == name
    np.testing.assert_array_equal(model.predict(images, verbose=0), restored.predict(images, verbose=0))


def test_uint8_and_float_inputs_agree():
    model = sa_conv.build_model("sa_quadratic_small")
    images = _images(2)
    np.testing.assert_allclose(_np(model(images)), _np(model(images.astype(np.float32))), atol=1e-6)


def test_normalization_constants_are_applied():
    layer = sa_conv.PixelNormalization()
    pixel = np.full((1, 1, 1, 3), 255 * 0.4914, np.float32)
    out = keras.ops.convert_to_numpy(layer(pixel))[0, 0, 0]
    assert abs(out[0]) < 1e-5
    np.testing.assert_allclose(out[1:], (0.4914 - np.array([0.4822, 0.4465])) / np.array([0.1994, 0.2010]), rtol=1e-5)


def test_overrides_and_config():
    model = sa_conv.build_model("sa_quadratic", num_layers=2, hidden_size=32, mlp_size=16)
    assert len(sa_conv.attention_blocks(model)) == 2
    config = sa_conv.get_config("sa_learned_small")
    assert config.encoding == "learned" and config.num_layers == 3 and config.hidden_size == 64
    model = sa_conv.build_model(ModelConfig(num_layers=1, hidden_size=16, mlp_size=8, num_heads=4))
    assert model.output_shape == (None, 10)


def test_attention_probabilities_of_a_model():
    model = sa_conv.build_model("sa_content_plus_learned_bias_small")
    probs = sa_conv.attention_probabilities(model, _images(2))
    assert len(probs) == 3
    for p in probs:
        p = keras.ops.convert_to_numpy(p)
        assert p.shape == (2, 9, 256, 256)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)


def test_attention_probabilities_of_a_sequential_model_start_at_its_first_layer():
    """A Sequential lists no InputLayer: every block's scores are read, each from its own input."""
    from sa_conv.transformer import TransformerBlock

    blocks = [TransformerBlock(8, attention_config={"num_heads": 2, "encoding": "content_plus_learned_bias"},
                               name=f"block_{i}") for i in range(2)]
    model = keras.Sequential([keras.Input((4, 4, 8)), *blocks])
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype(np.float32)
    probs = sa_conv.attention_probabilities(model, x)
    assert len(probs) == 2  # formerly one: block_0 was skipped and block_1 read the raw input
    _, first = blocks[0](x, training=False, return_attention_scores=True)
    _, second = blocks[1](blocks[0](x, training=False), training=False, return_attention_scores=True)
    for got, want in zip(probs, (first, second)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-6)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(encoding="gauss"), "Unknown encoding 'gauss'"),
        (dict(num_heads=0), "num_heads must be a positive integer"),
        (dict(hidden_size=-4), "hidden_size must be a positive integer"),
        (dict(encoding="content_with_relative_keys", hidden_size=63), "hidden_size must be even, got 63"),
        (dict(encoding="learned", max_grid_size=8), "grid is 16x16 but max_grid_size is 8"),
        (dict(encoding="content_plus_learned_bias", max_grid_size=15), "grid is 16x16 but max_grid_size is 15"),
        (dict(encoding="content_with_relative_keys", max_grid_size=8), "set max_grid_size >= 16"),
        (dict(pooling_width=3), "not divisible by pooling_width 3"),
        (dict(image_channels=1), "image_channels=1 needs pixel_mean, one value per channel"),
        (dict(dropout=1.5), "dropout must be in"),
        (dict(num_layer=3), "Unknown model config field"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        sa_conv.build_model("sa_quadratic_small", **overrides)


@pytest.mark.parametrize("encoding", ["quadratic", "gated", "sinusoidal"])
def test_encodings_without_offset_tables_take_any_grid(encoding):
    """max_grid_size bounds only the tables of learned offsets: these encodings have none."""
    model = sa_conv.build_model("sa_quadratic_small", encoding=encoding, max_grid_size=8)
    assert model(np.zeros((1, 32, 32, 3), np.uint8)).shape == (1, 10)


def test_pixel_normalization_refuses_statistics_of_other_channels():
    from sa_conv.preprocessing import PixelNormalization

    with pytest.raises(ValueError, match="statistics of 3 channels; its input has 1"):
        PixelNormalization()(np.zeros((1, 4, 4, 1), np.uint8))
    one = PixelNormalization(mean=(0.5,), std=(0.25,))(np.full((1, 2, 2, 1), 255, np.uint8))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(one), 2.0)  # (1 - 0.5) / 0.25


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown preset 'vit'.*sa_quadratic"):
        sa_conv.build_model("vit")


def test_resnet_presets_refuse_attention_overrides():
    with pytest.raises(ValueError, match=r"resnet20 \(architecture resnet20\) has no attention: dropout would"):
        sa_conv.build_model("resnet20", dropout=0.3)
    with pytest.raises(ValueError, match=r"the config \(architecture resnet20\) has no attention: num_heads would"):
        sa_conv.build_model(sa_conv.get_config("resnet20"), num_heads=4)
    config = sa_conv.get_config("resnet20", stochastic_depth=0.1, image_size=16, num_classes=4)
    assert (config.stochastic_depth, config.image_size, config.num_classes) == (0.1, 16, 4)
    assert {"encoding", "num_heads", "dropout", "remat"} <= config.ignored_fields()
    assert not {"stochastic_depth", "initialization", "image_size", "pixel_mean"} & config.ignored_fields()
    assert sa_conv.get_config("sa_quadratic_small").ignored_fields() == frozenset()


def test_no_weight_decay_finds_the_encodings_of_a_wrapped_model():
    model = sa_conv.build_model("sa_quadratic_small")
    wrapped = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.RandomFlip(), model])
    twice = keras.Sequential([keras.Input((32, 32, 3)), wrapped])
    declared = sa_conv.no_weight_decay(model)
    assert len(declared) == 6 and {v.path.rsplit("/", 1)[1] for v in declared} == {"centers", "spreads"}
    for outer in (wrapped, twice):  # formerly none: the blocks are layers of the inner model
        assert [id(v) for v in sa_conv.no_weight_decay(outer)] == [id(v) for v in declared]


def test_wrong_input_rank_is_rejected():
    model = sa_conv.build_model("sa_quadratic_small")
    with pytest.raises(ValueError):
        model(np.zeros((2, 32, 32), np.uint8))


def test_a_keras_quantized_value_map_is_refused_where_its_kernel_is_read_by_hand():
    """keras.Model.quantize stores a Dense's kernel as int8 with a scale only its call applies: the
    separable and gated paths and the serving fold, which take the kernel by hand, refuse it (they
    computed with the unscaled int8 values, ~100x off); the dense path calls the layer and serves."""
    x = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    for preset, overrides in (("sa_quadratic_small", {}), ("sa_gated_small", {})):
        model = sa_conv.build_model(preset, num_layers=1, **overrides)
        model.quantize("int8")
        with pytest.raises(ValueError, match=r"block_0/attention/value is quantized \(int8, by keras.Model.quantize\)"):
            model(x)
    dense = sa_conv.build_model("sa_quadratic_small", num_layers=1, fast_position_attention=False)
    want = keras.ops.convert_to_numpy(dense(x))
    dense.quantize("int8")
    got = keras.ops.convert_to_numpy(dense(x))
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()  # int8 weights per channel: about 1% here
    with pytest.raises(ValueError, match="is quantized"):
        sa_conv.freeze_for_inference(dense)


def test_model_under_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = sa_conv.build_model("sa_quadratic_small")
        logits = model(_images(2))
        assert keras.backend.standardize_dtype(logits.dtype) == "float32"
        assert np.isfinite(keras.ops.convert_to_numpy(logits)).all()
        _, changed = _train_step(model, _images(4), np.arange(4), steps=1)
        assert changed > 0
    finally:
        keras.mixed_precision.set_global_policy("float32")
