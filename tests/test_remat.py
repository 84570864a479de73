"""Rematerialized transformer blocks: same gradients, recomputed activations, the trainer's --remat."""

import json

import keras
from keras.src import testing
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import sa_conv
from trainers import footprint
from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.transformer import TransformerBlock
from trainers import train as train_lib
from trainers.task import attention_dropout_note, remat_blocks
from trainers.config import ConfigError, make_config


class TestTransformerBlockRemat(testing.TestCase):
    def test_layer(self):
        self.run_layer_test(
            TransformerBlock,
            init_kwargs={"mlp_size": 16, "dropout": 0.1, "remat": True,
                         "attention_config": {"num_heads": 4, "encoding": "quadratic", "attention_dropout": 0.1}},
            input_shape=(2, 4, 4, 8),
            expected_output_shape=(2, 4, 4, 8),
            expected_num_trainable_weights=14,
            expected_num_non_trainable_weights=0,
            expected_num_seed_generators=3,
            supports_masking=False,
            run_training_check=False,  # keras.remat needs a traced training call (tested below)
        )


@pytest.mark.parametrize("encoding", ["quadratic", "learned", "content_plus_learned_bias"])
def test_recomputed_dropout_gradient_equals_autodiff_of_the_drawn_mask(encoding):
    """With ``recompute_gradient`` (what a rematerialized block sets), the aggregation of
    position-only attention with dropout keeps only the seed of the mask: its gradient draws the
    mask again and recomputes one product per head. Output and gradients, for the input and every
    weight, equal plain autodiff through the same mask (the layer without ``recompute_gradient``)."""
    rate = 0.3
    x = tf.constant(np.random.default_rng(5).normal(size=(2, 4, 6, 4)).astype(np.float32))
    layers = [MultiHeadSelfAttention2D(3, output_dim=5, encoding=encoding, max_grid_size=6, attention_dropout=rate,
                                       seed=2, recompute_gradient=recompute) for recompute in (True, False)]
    for layer in layers:
        layer(x)
    layers[0].set_weights(layers[1].get_weights())
    recomputes = layers[0].aggregation_for((4, 6)).recomputes_dropout_gradient
    assert recomputes == sa_conv.get_encoding(encoding).position_only
    assert not layers[1].aggregation_for((4, 6)).recomputes_dropout_gradient
    seed = tf.constant([7, 11], "int32")
    upstream = tf.constant(np.random.default_rng(5).normal(size=(2, 4, 6, 5)).astype(np.float32))
    results = []
    for layer in layers:
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, training=True, dropout_seed=seed)
            loss = tf.reduce_sum(out * upstream)
        results.append((out, tape.gradient(loss, [x] + layer.trainable_weights)))
    (out_a, grads_a), (out_b, grads_b) = results
    np.testing.assert_allclose(np.asarray(out_a), np.asarray(out_b), rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(out_a) - np.asarray(layers[0](x))).max() > 1e-3  # the mask did drop weights
    for name, a, b in zip(["input"] + [w.path for w in layers[0].trainable_weights], grads_a, grads_b):
        assert a is not None and b is not None, name
        scale = max(np.abs(np.asarray(b)).max(), 1e-6)
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-5, err_msg=name)


def _models(**overrides):
    config = sa_conv.get_config("sa_quadratic_small", num_layers=2, **overrides)
    plain = sa_conv.build_model(config)
    remat = sa_conv.build_model(config.replace(remat=True))
    assert len(plain.variables) == len(remat.variables)  # remat adds no variable (nor seed state)
    for a, b in zip(plain.variables, remat.variables):
        b.assign(a)  # weights and dropout seed states
    return plain, remat


def _step(model, images):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(images, training=True)))
        return loss, tape.gradient(loss, model.trainable_variables)

    return step


@pytest.mark.parametrize("overrides", [
    dict(dropout=0.1, attention_dropout=0.1),  # dense path, three dropouts per block
    dict(dropout=0.0, attention_dropout=0.0),  # separable path
    dict(encoding="content_plus_learned_bias", dropout=0.1, attention_dropout=0.1),
])
def test_remat_gives_the_same_gradients(overrides):
    """Two consecutive steps (the dropout seeds advance): loss and every gradient equal to float32
    rounding. A recomputation that drew new dropout masks would differ by far more."""
    keras.utils.set_random_seed(3)
    plain, remat = _models(**overrides)
    images = tf.constant(np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3)), tf.float32)
    steps = _step(plain, images), _step(remat, images)
    previous = None
    for _ in range(2):
        (loss_a, grads_a), (loss_b, grads_b) = steps[0](), steps[1]()
        assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
        grads_a = [tf.convert_to_tensor(g).numpy() for g in grads_a]
        grads_b = [tf.convert_to_tensor(g).numpy() for g in grads_b]
        largest = max(np.abs(g).max() for g in grads_a)
        for variable, a, b in zip(plain.trainable_variables, grads_a, grads_b):
            # Relative to the variable's gradient, but not below 1e-4 of the largest: some are
            # analytically 0 (content attention's key bias: softmax ignores a per-query constant)
            # and hold only rounding noise.
            scale = max(np.abs(a).max(), 1e-4 * largest)
            np.testing.assert_allclose(b / scale, a / scale, atol=1e-5, err_msg=variable.path)
        if previous is not None and overrides["dropout"]:
            assert float(loss_a) != previous  # new masks each step: the seeds did advance
        previous = float(loss_a)


@pytest.mark.parametrize("encoding,attention_recomputed", [("quadratic", False), ("content_plus_learned_bias", True)])
def test_remat_recomputes_the_block_in_the_backward_pass(encoding, attention_recomputed):
    """The backward pass runs each rematerialized block's tail (all after the attention) again,
    and only then; the attention too for content encodings. Position-only attention with dropout
    is not recomputed: its aggregation's gradient recomputes one product per head instead."""
    plain, remat = _models(dropout=0.1, attention_dropout=0.1, encoding=encoding)
    images = tf.constant(np.zeros((2, 32, 32, 3)), tf.float32)
    for model, tails, attends in ((plain, 1, 1), (remat, 2, 1 + attention_recomputed)):
        block = model.get_layer("block_0")
        # The tail starts with the attention output map: count its calls and the attention's
        # (public methods, patched per instance).
        targets = {"tail": (block.attention_output, "call"), "attend": (block.attention, "call")}
        calls = {"tail": 0, "attend": 0}
        for name, (owner, method) in targets.items():
            def counted(*a, _name=name, _method=getattr(owner, method), **k):
                calls[_name] += 1
                return _method(*a, **k)
            setattr(owner, method, counted)
        try:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(images, training=True))
            tape.gradient(loss, model.trainable_variables)
            assert calls == {"tail": tails, "attend": attends}, model.name
            calls.update(tail=0, attend=0)
            model(images, training=False)  # inference: each once
            assert calls == {"tail": 1, "attend": 1}
        finally:
            for owner, method in targets.values():
                delattr(owner, method)


def test_remat_is_saved_and_reloaded(tmp_path):
    model = sa_conv.build_model("sa_quadratic_small", remat=True)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [b.remat for b in sa_conv.attention_blocks(loaded)] == [True, True, False]  # not the last
    # A rematerialized block's separable attention recomputes its gradient too.
    assert [b.attention.recompute_gradient for b in sa_conv.attention_blocks(loaded)] == [True, True, False]
    x = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(loaded(x), model(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ estimate


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 512), layers=st.integers(1, 8), dropout=st.sampled_from([0.0, 0.1]))
def test_activation_estimate_scales_and_remat_keeps_one_block(batch, layers, dropout):
    config = sa_conv.get_config("sa_quadratic", num_layers=layers, attention_dropout=dropout)
    full = footprint.training_activation_bytes(config, batch)
    assert full == batch * footprint.training_activation_bytes(config, 1)
    block = footprint.block_activation_floats(config) * 4 * batch
    assert full == layers * block
    kept = footprint.training_activation_bytes(config, batch, remat=True)
    # One block (whose separable attention recomputes its gradient's intermediates) + every
    # block's input (and, with attention dropout, its attention's output).
    block = footprint.block_activation_floats(config, remat=True) * 4 * batch
    assert kept == block + (2 if dropout else 1) * layers * batch * 4 * 16 * 16 * 400
    if layers > 1:
        assert kept < full


def test_activation_estimate_counts_per_example_attention():
    """With attention dropout (or content logits) the (heads, N, N) probabilities exist per example."""
    base = sa_conv.get_config("sa_quadratic")
    n, heads = 256, 9
    with_dropout = footprint.block_activation_floats(base)
    without = footprint.block_activation_floats(base.replace(attention_dropout=0.0))
    # Without dropout the separable path keeps 2 more (N, heads * D) tensors instead; in a
    # rematerialized block none (its gradient recomputes them head by head).
    assert with_dropout - without == 3 * heads * n * n - 2 * n * heads * 400
    without_remat = footprint.block_activation_floats(base.replace(attention_dropout=0.0), remat=True)
    assert without - without_remat == 3 * n * heads * 400
    assert footprint.block_activation_floats(base, remat=True) == with_dropout  # the dense path is the same
    assert footprint.training_activation_bytes(sa_conv.get_config("resnet18"), 100) == 0


# ------------------------------------------------------------------------------ trainer


def _trainer(tmp_path, **overrides):
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=2, dataset="synthetic", global_batch_size=8, eval_batch_size=50,
        validation_size=50, epochs=1, max_steps=3, strategy="one_device", model_dir=str(tmp_path), **overrides))
    logs = []
    keras.utils.set_random_seed(config.seed)  # as train() does: every run starts from the same weights
    trainer = train_lib.Trainer(config, log=logs.append)
    return trainer, logs


def test_attention_dropout_note_names_the_dense_paths_cost_and_the_choice(tmp_path):
    """Where attention dropout keeps a separable encoding on the dense path in training, the run
    says what that costs on its grid and how to take the separable path; nowhere else."""
    paper = sa_conv.get_config("sa_quadratic")  # attention dropout 0.1, 16x16
    assert "--attention_dropout=0.1" in attention_dropout_note(paper) and "16x16" in attention_dropout_note(paper)
    assert f" {3 * 9 * 256 ** 2 * 4 / 2 ** 20:,.1f} MiB " in attention_dropout_note(paper)
    large = attention_dropout_note(paper.replace(image_size=96, max_grid_size=48))
    assert "48x48" in large and f" {3 * 9 * 2304 ** 2 * 4 / 2 ** 20:,.1f} MiB " in large and "separable" in large
    for config in (paper.replace(attention_dropout=0.0), paper.replace(fast_position_attention=False),
                   paper.replace(image_size=8),  # a 4x4 grid: the dense path is the faster there anyway
                   sa_conv.get_config("sa_content_plus_learned_bias"), sa_conv.get_config("resnet18")):
        assert attention_dropout_note(config) is None
    trainer, logs = _trainer(tmp_path, attention_dropout=0.1)
    trainer.prepare()
    assert sum("makes training take the dense attention path on this 16x16 grid" in line for line in logs) == 1


def test_auto_remat_follows_the_memory_budget(tmp_path):
    trainer, logs = _trainer(tmp_path / "a", remat="auto", memory_budget_gb=1e-3)
    trainer.prepare()
    assert trainer.model_config.remat and [b.remat for b in sa_conv.attention_blocks(trainer.model)] == [True, False]
    assert any("Rematerializing" in line and "--memory_budget_gb=0.001" in line for line in logs)
    trainer, _ = _trainer(tmp_path / "b", remat="auto")  # default 4 GB: small presets do not need it
    trainer.prepare()
    assert not trainer.model_config.remat
    config = sa_conv.get_config("sa_quadratic")
    assert remat_blocks(make_config(), config, 100, log=lambda s: None)  # the paper presets do
    assert not remat_blocks(make_config(overrides={"remat": "none"}), config, 100, log=lambda s: None)
    with pytest.raises(ConfigError, match="no transformer blocks"):
        remat_blocks(make_config(overrides={"remat": "blocks", "model": "resnet18"}),
                               sa_conv.get_config("resnet18"), 100)
    with pytest.raises(ConfigError, match="memory_budget_gb must be positive"):
        make_config(overrides={"memory_budget_gb": 0})


def test_trainer_with_remat_trains_the_same_weights(tmp_path, monkeypatch):
    """Three SGD steps with dropout through the trainer's strategy loop, --remat=blocks against
    --remat=none: the same weights and loss. The Trainer itself never sets the allocator (the
    run's entry point does: the next test)."""
    calls = []
    monkeypatch.setattr(train_lib.process, "keep_freed_memory", lambda keep: calls.append(keep) or keep)
    runs = {}
    for mode in ("none", "blocks"):
        trainer, _ = _trainer(tmp_path / mode, remat=mode, dropout=0.1, attention_dropout=0.1,
                              mixed_precision="float32")  # the bounds below are float32's
        results = trainer.run()
        runs[mode] = (trainer.model, results)
        with open(tmp_path / mode / "config.json") as f:
            assert json.load(f)["resolved_model"]["remat"] is (mode == "blocks")
    assert calls == []
    (plain, a), (remat, b) = runs["none"], runs["blocks"]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    for u, v in zip(plain.trainable_variables, remat.trainable_variables):
        np.testing.assert_allclose(v.numpy(), u.numpy(), rtol=1e-4, atol=1e-6, err_msg=u.path)


@pytest.mark.parametrize("remat,keep,expected", [("none", None, True), ("blocks", None, False),
                                                 ("blocks", True, True), ("none", False, False)])
def test_freed_memory_is_returned_by_default_when_blocks_are_rematerialized(remat, keep, expected, tmp_path,
                                                                             monkeypatch):
    """The run's entry point (`train`) sets the allocator from the trainer's decision, made when
    the trainer is prepared (the training itself is not needed: `Trainer.run` is replaced)."""
    calls = []
    monkeypatch.setattr(train_lib.process, "keep_freed_memory", lambda keep: calls.append(keep) or keep)
    monkeypatch.setattr(train_lib.Trainer, "run", lambda self: {"remat": self.model_config.remat})
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=2, dataset="synthetic", global_batch_size=8, eval_batch_size=50,
        validation_size=50, epochs=1, max_steps=3, strategy="one_device", model_dir=str(tmp_path), remat=remat,
        keep_freed_memory=keep))
    results = train_lib.train(config, log=lambda s: None)
    assert bool(results["remat"]) == (remat == "blocks")
    assert calls == [expected]  # glibc's thresholds are raised only when memory is kept


def test_rematerialized_blocks_train_and_the_library_adds_no_logging_filter():
    """A rematerialized block with dropout passes its integer seeds through `keras.remat`; its
    gradients are finite, and the block installs no logging filter of its own (the programs add
    `SEED_WATCH_FILTER` in their entry point, `trainers.process`)."""
    import logging

    before = list(logging.getLogger("tensorflow").filters)
    block = TransformerBlock(mlp_size=16, dropout=0.1, remat=True,
                             attention_config=dict(num_heads=4, encoding="quadratic", attention_dropout=0.1))
    x = tf.random.normal((2, 4, 4, 8))

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(block(x, training=True))
        return tape.gradient(loss, block.trainable_variables)

    values = grads()
    assert len(values) == len(block.trainable_variables) > 0
    assert all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in values)
    assert logging.getLogger("tensorflow").filters == before
