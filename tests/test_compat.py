"""Models saved before the encoding redesign (tests/fixtures/legacy, see its README) still load
and compute the same outputs; former names (encodings, presets, constants) still work."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv  # noqa: F401  (registers the classes the files name, as a user would import it)

from tests import tolerances
from tests.conftest import PROJECT_ROOT

LEGACY = PROJECT_ROOT / "tests" / "fixtures" / "legacy"


@pytest.mark.parametrize("name", ["sa_quadratic_small", "sa_quadratic_full_small", "sa_learned_small",
                                  "sa_learned_content_small"])
def test_keras_files_saved_before_the_redesign_load_unchanged(name):
    expected = np.load(LEGACY / "expected.npz")
    model = keras.models.load_model(LEGACY / f"{name}.keras")
    if name == "sa_learned_content_small":  # its encoding then, "learned_content", loads under the current name
        assert {b.attention.encoding for b in sa_conv.attention_blocks(model)} == {"content_with_relative_keys"}
    got = ops.convert_to_numpy(model(expected["images"], training=False))
    np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6)
    assert np.abs(expected[name]).max() > 1e-3  # real outputs, not zeros


@pytest.mark.parametrize("name", ["frozen_sa_quadratic_small", "frozen_sa_learned_small",
                                  "frozen_sa_content_plus_learned_bias_small"])
def test_serving_copies_saved_when_serving_was_a_flag_of_the_layers_load_unchanged(name, tmp_path):
    """Frozen models written while serving was a set of flags of the training layers
    (``inference_constants``, ``fold_attention_output``; tests/fixtures/legacy/README.md) load,
    serve the same outputs, and save and load again."""
    expected = np.load(LEGACY / "expected_frozen.npz")
    model = keras.models.load_model(LEGACY / f"{name}.keras")
    got = ops.convert_to_numpy(model(expected["images"], training=False))
    np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6)
    assert np.abs(expected[name]).max() > 1e-3
    model.save(tmp_path / "again.keras")
    again = keras.models.load_model(tmp_path / "again.keras")
    np.testing.assert_allclose(ops.convert_to_numpy(again(expected["images"], training=False)), got, rtol=1e-6,
                               atol=1e-7)


# Serving copies written by the former serving classes (`ServingTransformerBlock` holding
# `PrecomputedAttention`, `FoldedContentAttention`, `PrecomputedGatedAttention` or a copy of the
# trained attention; tests/fixtures/legacy/README.md), which now load as
# `sa_conv.attention.LegacyServingAttention`: (preset, overrides) they were made from.
SERVING_FIXTURES = {
    "sa_quadratic_small": ("sa_quadratic_small", dict(fast_position_attention=True, image_size=32)),
    "sa_learned_small": ("sa_learned_small", dict(fast_position_attention=False, image_size=16)),
    "sa_content_plus_learned_bias_small": ("sa_content_plus_learned_bias_small", dict(image_size=16)),
    "sa_gated_small": ("sa_gated_small", dict(image_size=16)),
    "sa_learned_content_small": ("sa_quadratic_small", dict(encoding="content_with_relative_keys", image_size=16)),
}


@pytest.mark.parametrize("name", sorted(SERVING_FIXTURES))
def test_serving_copies_saved_by_the_serving_classes_load_unchanged(name, tmp_path):
    """A serving copy saved by `sa_conv.freeze_for_inference` with the former serving classes loads,
    serves the same outputs (to float32's bound for the computation) and saves and loads again."""
    expected = np.load(LEGACY / "expected_serving.npz")
    preset, overrides = SERVING_FIXTURES[name]
    config = sa_conv.get_config(preset, num_layers=1, hidden_size=16, mlp_size=16, **overrides)
    images = expected[f"{name}/images"].astype(np.float32)
    model = keras.models.load_model(LEGACY / f"serving_{name}.keras")
    got = ops.convert_to_numpy(model(images, training=False))
    tolerances.assert_close_to_scale(got, expected[name], tolerances.float32_relative(config), name)
    model.save(tmp_path / "again.keras")
    again = keras.models.load_model(tmp_path / "again.keras")
    tolerances.assert_close_to_scale(ops.convert_to_numpy(again(images, training=False)), got,
                                     tolerances.float32_relative(config), name)


def test_a_trained_model_saved_with_the_former_serving_flags_loads_and_trains(tmp_path):
    """A model as trained, saved while `TransformerBlock` had ``fold_attention_output`` (false):
    it loads as the training block, gives the same logits and still trains."""
    expected = np.load(LEGACY / "expected_trained_77b9071.npz")
    model = keras.models.load_model(LEGACY / "trained_77b9071_sa_content_plus_learned_bias_small.keras")
    assert [type(b) for b in sa_conv.attention_blocks(model)] == [sa_conv.TransformerBlock]
    np.testing.assert_allclose(ops.convert_to_numpy(model(expected["images"], training=False)), expected["logits"],
                               rtol=1e-5, atol=1e-6)
    assert np.abs(expected["logits"]).max() > 1e-3
    model(expected["images"], training=True)  # a training call: the block trains, it is no serving copy


def test_a_checkpoint_written_before_the_redesign_resumes(tmp_path):
    """A run directory written before the Task split and the renames (tests/fixtures/legacy/run):
    today's trainer, with the run's own flags (the old preset name included), restores every
    model and optimizer variable from its checkpoint and trains on from epoch 1."""
    import shutil

    pytest.importorskip("tensorflow", reason="the trainer runs on TensorFlow (not in the layers-only venv)")
    from trainers.config import make_config
    from trainers.train import Trainer

    run = tmp_path / "run"
    shutil.copytree(LEGACY / "run", run)
    config = make_config(overrides=dict(
        model="sa_learned_content_small", num_layers=1, hidden_size=16, mlp_size=16, dataset="synthetic",
        epochs=2, global_batch_size=50, eval_batch_size=100, validation_size=100, model_dir=str(run),
        strategy="one_device", jit_compile=False))
    logs = []
    trainer = Trainer(config, log=logs.append, interactive=False)
    trainer.prepare()
    epoch, history = trainer.restore()
    assert (epoch, len(history)) == (1, 1)
    assert any("holds no dropout seed states" in line for line in logs)  # it predates them
    expected = np.load(run / "expected_weights.npz")
    saved = [expected[f"arr_{i}"] for i in range(len(expected.files))]
    current = [ops.convert_to_numpy(v) for v in trainer.model.weights] + \
        [ops.convert_to_numpy(v) for v in trainer.optimizer.variables]
    assert len(current) == len(saved)
    for got, want in zip(current, saved):
        np.testing.assert_array_equal(got, want)
    history, _ = trainer.train_epochs(epoch, history, save=False)
    assert [h["epoch"] for h in history] == [1, 2] and np.isfinite(history[-1]["train_loss"])


@pytest.mark.parametrize("old,new", [("learned_plus_content", "content_plus_learned_bias"),
                                     ("learned_content", "content_with_relative_keys")])
def test_former_encoding_names_resolve_to_the_current_ones(old, new, tmp_path):
    assert sa_conv.ENCODING_ALIASES[old] == new and old not in sa_conv.ENCODINGS
    assert sa_conv.get_encoding(old) is sa_conv.get_encoding(new)
    layer = sa_conv.MultiHeadSelfAttention2D(2, encoding=old, max_grid_size=4, seed=1)
    assert layer.encoding == new and layer.get_config()["encoding"] == new
    assert sa_conv.get_config("sa_quadratic_small", encoding=old).encoding == new
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6)).astype(np.float32)
    twin = sa_conv.MultiHeadSelfAttention2D(2, encoding=new, max_grid_size=4, seed=1)
    layer.build(x.shape)
    twin.build(x.shape)
    twin.set_weights(layer.get_weights())  # same variables in the same order: the same layer
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x)), ops.convert_to_numpy(twin(x)))


def test_former_preset_names_resolve_to_the_current_ones():
    from trainers.config import ConfigError, make_config

    for old, new in sa_conv.PRESET_ALIASES.items():
        assert sa_conv.get_config(old) == sa_conv.get_config(new) and new in sa_conv.PRESETS
        config = make_config(overrides=dict(model=old, encoding="learned_plus_content"))
        assert (config.model, config.encoding) == (new, "content_plus_learned_bias")  # the run records these
    assert sa_conv.get_config("sa_learned_content").encoding == "content_plus_learned_bias"
    with pytest.raises(ConfigError, match="--encoding: Unknown encoding 'learned_plus'"):
        make_config(overrides=dict(encoding="learned_plus"))
    with pytest.raises(ValueError, match="Unknown preset 'sa_learned_contents'"):
        sa_conv.get_config("sa_learned_contents")


@pytest.mark.parametrize("module", ["sa_conv", "sa_conv.preprocessing"])
def test_former_constant_names_warn_and_give_the_reference_constants(module):
    import importlib

    mod = importlib.import_module(module)
    sa_conv.preprocessing.FORMER_CONSTANTS.forget_warnings()
    with pytest.warns(DeprecationWarning, match="CIFAR10_STD is deprecated.*REFERENCE_PIXEL_STD") as record:
        std = mod.CIFAR10_STD
    assert record[0].filename == __file__  # points at the caller
    with pytest.warns(DeprecationWarning, match="REFERENCE_PIXEL_MEAN"):
        mean = mod.CIFAR10_MEAN
    assert (mean, std) == (sa_conv.REFERENCE_PIXEL_MEAN, sa_conv.REFERENCE_PIXEL_STD) == (
        (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
    with pytest.raises(AttributeError, match="has no attribute 'CIFAR10_VAR'"):
        getattr(mod, "CIFAR10_VAR")


def test_an_alias_cannot_shadow_or_steal_a_name():
    from sa_conv.encodings import base

    with pytest.raises(ValueError, match="'learned' is the name of a registered encoding"):
        base.register_encoding("test_alias", aliases=("learned",))(sa_conv.QuadraticEncoding)
    with pytest.raises(ValueError, match="'learned_content' is already a former name"):
        base.register_encoding("test_alias", aliases=("learned_content",))(sa_conv.QuadraticEncoding)
    assert "test_alias" not in sa_conv.ENCODINGS
    base.register_encoding("test_alias", aliases=("test_old",))(sa_conv.QuadraticEncoding)
    try:
        assert sa_conv.get_encoding("test_old").name == "test_alias"
    finally:
        sa_conv.encodings.unregister_encoding("test_alias")
    assert "test_old" not in sa_conv.ENCODING_ALIASES


FORMER = [("encoding", "learned_content", "content_with_relative_keys", lambda n: sa_conv.get_encoding(n).name),
          ("preset", "sa_learned_content_small", "sa_content_plus_learned_bias_small",
           lambda n: sa_conv.config.canonical_preset(n)),
          ("constant", "CIFAR10_MEAN", "REFERENCE_PIXEL_MEAN", lambda n: getattr(sa_conv, n)),
          ("class", "LearnedContentEncoding", "ContentWithRelativeKeysEncoding",
           lambda n: getattr(sa_conv.encodings, n).__name__)]


@pytest.mark.parametrize("kind,old,new,use", FORMER, ids=[f[0] for f in FORMER])
def test_every_former_name_warns_once_naming_the_new_one(kind, old, new, use):
    """One mechanism (`sa_conv.aliases.FormerNames`) for encodings, presets, constants and
    classes: the first use of a former name warns, naming the new one, at the caller; later uses
    are silent and give the same thing."""
    import warnings

    from sa_conv import aliases

    tables = [sa_conv.ENCODING_ALIASES, sa_conv.PRESET_ALIASES, sa_conv.preprocessing.FORMER_CONSTANTS,
              sa_conv.encodings.FORMER_CLASSES]
    assert all(isinstance(t, aliases.FormerNames) for t in tables)
    table = next(t for t in tables if t.kind == kind)
    assert table[old] == new
    table.forget_warnings()
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: the {kind} is now named {new}") as first:
        value = use(old)
    assert len(first) == 1 and first[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        again, current = use(old), use(new)
    assert again == value == current


def test_the_content_encodings_are_two_classes_named_for_what_they_compute():
    assert sa_conv.ENCODINGS["content_plus_learned_bias"].cls is sa_conv.ContentPlusLearnedBiasEncoding
    assert sa_conv.ENCODINGS["content_with_relative_keys"].cls is sa_conv.ContentWithRelativeKeysEncoding
    assert sa_conv.ENCODINGS["content_plus_learned_bias"].has_position_bias
    assert not sa_conv.ENCODINGS["content_with_relative_keys"].has_position_bias


def test_moved_modules_still_import_from_their_former_path_with_a_warning():
    """`sa_conv.data`, `sa_conv.cli`, ... moved to `trainers` (`sa_conv.aliases.MODULES`): the
    former path gives the new module itself, with a DeprecationWarning naming it, at the importing
    line. In a fresh interpreter: an import is cached, and each warns once per process."""
    import json
    import subprocess
    import sys

    from sa_conv import aliases

    pytest.importorskip("tensorflow", reason="the moved modules are the programs', which run on TensorFlow")
    probe = (
        "import importlib, json, warnings\n"
        "from sa_conv import aliases\n"
        "found = {}\n"
        "for old, new in aliases.MODULES.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    found[old] = [module is importlib.import_module(new), [str(w.message) for w in caught\n"
        "                  if issubclass(w.category, DeprecationWarning)]]\n"
        "print(json.dumps(found))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(found) == set(aliases.MODULES) == {"sa_conv.data", "sa_conv.image_files", "sa_conv.cli", "sa_conv.files",
                                                  "sa_conv.footprint"}
    for old, (same, messages) in found.items():
        assert same, old
        assert messages == [f"{old} is deprecated: the module is now named {aliases.MODULES[old]}."], old
