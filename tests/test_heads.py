"""Degenerate heads: planted ones are found; pruning them is exact when their value rows are
zero; the pruned model trains, saves, reloads and exports; reset re-draws only those heads."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from sa_conv import heads

IMAGES = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)


def _np(x):
    return np.asarray(ops.convert_to_numpy(x))


def _model(preset="sa_quadratic_small", **kwargs):
    keras.utils.set_random_seed(0)
    return sa_conv.build_model(preset, num_layers=2, hidden_size=16, mlp_size=16, **kwargs)


def test_planted_degenerate_heads_are_found():
    iso = _model()
    enc = sa_conv.attention_blocks(iso)[1].attention.position_encoding
    spreads = _np(enc.spreads)
    spreads[[2, 7]] = [1e-3, 0.0]  # s^2 = 1e-6 and 0 < 1e-5
    enc.spreads.assign(spreads)
    assert sa_conv.degenerate_heads(iso) == {1: [2, 7]}
    full = _model("sa_quadratic_full_small")
    enc = sa_conv.attention_blocks(full)[0].attention.position_encoding
    a = _np(enc.spreads)
    a[4] = np.diag([1.0, 0.01])  # precision diag(1, 1e-4): condition 1e4 > 1000
    a[5] = np.diag([1e-3, 1e-3])  # largest eigenvalue 1e-6 < 1e-5
    enc.spreads.assign(a)
    assert sa_conv.degenerate_heads(full) == {0: [4, 5]}
    assert sa_conv.degenerate_heads(full, max_condition=1e5) == {0: [5]}
    assert sa_conv.degenerate_heads(_model("sa_learned_small")) == {}  # no Gaussian heads
    with pytest.raises(ValueError, match="is a serving copy: find the degenerate heads of the trained model"):
        sa_conv.degenerate_heads(sa_conv.freeze_for_inference(iso))  # formerly {}: no heads judged


@pytest.mark.parametrize("preset", ["sa_quadratic_small", "sa_content_plus_learned_bias_small", "sa_mlp_small"])
def test_pruning_heads_with_zero_value_rows_leaves_the_outputs(preset):
    model = _model(preset)
    attention = sa_conv.attention_blocks(model)[0].attention
    kernel = _np(attention.value_kernel_per_head())
    kernel[[1, 5]] = 0.0
    attention.set_value_map(kernel, _np(attention.value_dense.bias))
    pruned = sa_conv.prune_heads(model, {0: [1, 5]})
    assert sa_conv.attention_blocks(pruned)[0].attention.num_heads == 7
    assert sa_conv.attention_blocks(pruned)[1].attention.num_heads == 9
    np.testing.assert_allclose(_np(pruned(IMAGES)), _np(model(IMAGES)), atol=1e-6)
    count = lambda m: sum(int(np.prod(w.shape)) for w in m.trainable_weights)  # noqa: E731
    assert count(pruned) < count(model)


@pytest.mark.slow
def test_pruned_model_trains_saves_reloads_and_exports(tmp_path):
    import tensorflow as tf

    from export.export import export

    pruned = sa_conv.prune_heads(_model(), {0: [0, 1, 2], 1: [8]})
    pruned.compile(optimizer=keras.optimizers.SGD(0.05),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    labels = np.array([0, 1, 2, 3])
    first = pruned.evaluate(IMAGES, labels, verbose=0)
    pruned.fit(IMAGES, labels, epochs=5, verbose=0)
    assert pruned.evaluate(IMAGES, labels, verbose=0) < first
    pruned.save(tmp_path / "pruned.keras")
    reloaded = keras.models.load_model(tmp_path / "pruned.keras")
    np.testing.assert_allclose(_np(reloaded(IMAGES)), _np(pruned(IMAGES)), atol=1e-6)
    version = export(model_path=str(tmp_path / "pruned.keras"), export_dir=str(tmp_path / "exp"), log=lambda s: None)
    served = tf.saved_model.load(version).signatures["serving_default"](images=tf.constant(IMAGES))
    np.testing.assert_allclose(served["probabilities"].numpy(), _np(ops.softmax(pruned(IMAGES))), atol=1e-5)


def test_reset_redraws_only_the_named_heads():
    model = _model()
    enc = sa_conv.attention_blocks(model)[0].attention.position_encoding
    centers, spreads = _np(enc.centers).copy(), _np(enc.spreads).copy()
    sa_conv.reset_heads(model, {0: [3]})
    new_centers, new_spreads = _np(enc.centers), _np(enc.spreads)
    keep = [h for h in range(9) if h != 3]
    np.testing.assert_array_equal(new_centers[keep], centers[keep])
    np.testing.assert_array_equal(new_spreads[keep], spreads[keep])
    assert not np.array_equal(new_centers[3], centers[3])


def test_reset_keeps_a_gated_heads_gate():
    """Gated attention's Gaussian half is redrawn; the gates, the weight of each half, are kept."""
    model = _model("sa_gated_small")
    enc = sa_conv.attention_blocks(model)[0].attention.position_encoding
    enc.gating.assign(np.linspace(-2.0, 2.0, 9).astype("float32"))
    gating, centers = _np(enc.gating).copy(), _np(enc.position.centers).copy()
    sa_conv.reset_heads(model, {0: [3]})
    np.testing.assert_array_equal(_np(enc.gating), gating)
    assert not np.array_equal(_np(enc.position.centers)[3], centers[3])


def test_prune_refuses_attention_that_is_not_a_transformer_block():
    """A converted CNN's `AttentionConv2D` layers have heads, but the pruned copy rebuilds transformer
    blocks only: pruning one would hand back the unpruned model."""
    from sa_conv import conversion

    inputs = keras.Input((8, 8, 3))
    cnn = keras.Model(inputs, keras.layers.Conv2D(4, 3, padding="same")(inputs))
    converted = conversion.convert_model(cnn)
    for prune in (sa_conv.prune_heads, heads.head_slicer):  # the slicer of an optimizer's state too
        with pytest.raises(ValueError, match=r"Block 0 \(AttentionConv2D\) is not a TransformerBlock"):
            prune(converted, {0: [0]})


def test_reset_refuses_an_encoding_that_does_not_name_its_gaussian_weights(monkeypatch):
    """A user's encoding with Gaussian heads but no gaussian_weights(): nothing to redraw, said so."""
    model = _model()
    monkeypatch.setattr(type(sa_conv.attention_blocks(model)[0].attention.position_encoding), "gaussian_weights",
                        lambda self: [])
    with pytest.raises(ValueError, match="names no gaussian_weights"):
        sa_conv.reset_heads(model, {0: [1]})


def test_head_errors():
    model = _model()
    with pytest.raises(ValueError, match="Block 5 does not exist"):
        sa_conv.prune_heads(model, {5: [0]})
    with pytest.raises(ValueError, match="heads 0..8; got \\[9\\]"):
        sa_conv.prune_heads(model, {0: [9]})
    with pytest.raises(ValueError, match="keep at least one"):
        sa_conv.prune_heads(model, {0: list(range(9))})
    with pytest.raises(ValueError, match="no Gaussian heads"):
        sa_conv.reset_heads(_model("sa_learned_small"), {0: [1]})
    with pytest.raises(ValueError, match="prune the trained model, then"):
        sa_conv.prune_heads(sa_conv.freeze_for_inference(model), {0: [1]})


def test_trainer_resets_degenerate_heads_after_an_epoch(tmp_path):
    from trainers.config import make_config
    from trainers.train import Trainer

    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16, dataset="synthetic", epochs=1,
        global_batch_size=100, eval_batch_size=100, validation_size=100, model_dir=str(tmp_path),
        strategy="one_device", reset_degenerate_heads=True, learning_rate=0.01))
    logs = []
    trainer = Trainer(config, log=logs.append)
    trainer.prepare()
    encoding = sa_conv.attention_blocks(trainer.model)[0].attention.position_encoding
    spreads = _np(encoding.spreads)
    spreads[6] = 0.0  # s = 0 has zero gradient: it stays degenerate through training
    encoding.spreads.assign(spreads)
    history, _ = trainer.train_epochs(0, [], save=False)
    assert history[-1]["reset_heads"] == {"0": [6]}
    assert any("Re-initialized degenerate heads (block: heads): 0: [6]" in line for line in logs)
    assert sa_conv.degenerate_heads(trainer.model) == {}


def _prune_config(tmp_path, epochs, **kwargs):
    from trainers.config import make_config

    return make_config(overrides={**dict(
        model="sa_quadratic_small", num_layers=2, hidden_size=16, mlp_size=16, dataset="synthetic",
        epochs=epochs, global_batch_size=100, eval_batch_size=100, validation_size=100,
        model_dir=str(tmp_path), strategy="one_device", prune_degenerate_heads=True, learning_rate=0.01,
    ), **kwargs})


@pytest.mark.slow
def test_trainer_prunes_degenerate_heads_and_resumes_the_pruned_model(tmp_path):
    from trainers.train import Trainer

    logs = []
    trainer = Trainer(_prune_config(tmp_path, epochs=1), log=logs.append)
    trainer.prepare()
    full_parameters = sum(int(np.prod(v.shape)) for v in trainer.model.trainable_variables)
    encoding = sa_conv.attention_blocks(trainer.model)[1].attention.position_encoding
    spreads = _np(encoding.spreads)
    spreads[[2, 5]] = 0.0  # s = 0 has zero gradient: these heads stay degenerate
    encoding.spreads.assign(spreads)
    history, _ = trainer.train_epochs(0, [], save=True)

    assert history[-1]["pruned_heads"] == {"1": [2, 5]}
    assert history[-1]["num_heads"] == [9, 7]
    assert any("Pruned degenerate heads (block: heads): 1: [2, 5]" in line for line in logs)
    pruned_parameters = sum(int(np.prod(v.shape)) for v in trainer.model.trainable_variables)
    assert history[-1]["parameters"] == pruned_parameters < full_parameters
    # The momentum of a kept head survives pruning: head 6 of block 1 is now head 4.
    spreads = sa_conv.attention_blocks(trainer.model)[1].attention.position_encoding.spreads
    spreads_index = [v.path for v in trainer.model.trainable_variables].index(spreads.path)
    assert np.any(_np(trainer.optimizer.momentums[spreads_index]) != 0)
    assert int(trainer.optimizer.iterations.numpy()) == history[-1]["step"]

    # A rerun with more epochs restores the pruned architecture from the checkpoint, then trains on.
    resumed = Trainer(_prune_config(tmp_path, epochs=2), log=logs.append)
    resumed.prepare()
    epoch, restored_history = resumed.restore()
    assert epoch == 1 and restored_history[-1]["num_heads"] == [9, 7]
    for a, b in zip(resumed.model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed.optimizer.variables, trainer.optimizer.variables):
        np.testing.assert_array_equal(_np(a), _np(b))

    results = Trainer(_prune_config(tmp_path, epochs=2), log=logs.append).run()
    assert results["epochs"] == 2 and results["parameters"] == pruned_parameters
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    assert [b.attention.num_heads for b in sa_conv.attention_blocks(reloaded)] == [9, 7]
    assert np.isfinite(_np(reloaded(IMAGES))).all()


def test_pruning_flags_are_checked(tmp_path):
    from sa_conv.errors import ConfigError
    from trainers.train import Trainer

    with pytest.raises(ConfigError, match="choose one"):
        _prune_config(tmp_path, epochs=1, reset_degenerate_heads=True)
    trainer = Trainer(_prune_config(tmp_path, epochs=1, model="sa_learned_small"))
    with pytest.raises(ConfigError, match="--prune_degenerate_heads needs a model whose heads are Gaussian"):
        trainer.prepare()
    from trainers.tune import SaConvHyperModel

    with pytest.raises(ConfigError, match="keras-tuner cannot reload"):
        SaConvHyperModel({}, _prune_config(tmp_path, epochs=1), strategy=None, dataset=None)
