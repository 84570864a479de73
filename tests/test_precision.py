"""--mixed_precision through the trainer: bfloat16 and float16 (with loss scaling) end to end."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import sa_conv
from trainers import distribute
from trainers import train as train_lib
from trainers.config import make_config


@pytest.fixture(autouse=True)
def _global_policy_untouched():
    yield
    assert keras.config.dtype_policy().name == "float32"  # the trainer's models carry their own policy


def _config(tmp_path, policy, **overrides):
    settings = dict(
        model="sa_quadratic_small", num_layers=1, dataset="synthetic", global_batch_size=32, eval_batch_size=100,
        validation_size=100, epochs=2, strategy="one_device", dropout=0.0, model_dir=str(tmp_path / policy),
        mixed_precision=policy)
    return make_config(overrides={**settings, **overrides})


@pytest.fixture
def float32_run(made_once):
    """The float32 run's ``(results, history)``, trained once per test run for both policies."""
    root = made_once("precision-float32", lambda d: train_lib.train(_config(d, "float32"), log=lambda s: None))
    return tuple(json.loads((root / "float32" / name).read_text()) for name in ("results.json", "history.json"))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_like_float32(policy, float32_run, tmp_path):
    """Two epochs on the synthetic data: float32 variables, 16-bit compute, float32 logits, and
    the float32 run's loss curve to within 16-bit rounding. The saved model reloads with its
    policy and reproduces the trainer's test accuracy.

    The tolerance (each epoch's mean training loss within 10%, or 0.02, of float32's): bfloat16
    keeps 8 significant bits, so every product is rounded by up to 2^-8 (0.4%) relative, and
    float16 10 bits; after a few hundred SGD steps those roundings have moved the weights onto a
    nearby trajectory, not the same one. What the band rules out is a broken step: a missing
    cast, an overflow or an unscaled float16 gradient gives NaN, no decrease, or a loss off by
    far more than 10% within the first epoch."""
    config = _config(tmp_path, policy)
    keras.utils.set_random_seed(config.seed)  # the float32 run's initial weights (train() seeds it)
    trainer = train_lib.Trainer(config, log=lambda s: None)
    results = trainer.run()
    dtype = policy.split("_")[1]
    block = sa_conv.attention_blocks(trainer.model)[0]
    assert block.compute_dtype == dtype and block.variable_dtype == "float32"
    assert block.attention.compute_dtype == dtype and keras.config.dtype_policy().name == "float32"
    assert all(v.dtype == "float32" for v in trainer.model.trainable_variables)
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
    reference, history32 = float32_run
    history = json.loads((tmp_path / policy / "history.json").read_text())
    for ours, theirs in zip(history, history32):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=0.1, abs=0.02)
    assert results["train_loss"] < 0.5 * history[0]["train_loss"]  # it learns
    assert results["test_accuracy"] >= reference["test_accuracy"] - 0.05
    model = keras.models.load_model(tmp_path / policy / "model.keras")
    assert model.get_layer("block_0").compute_dtype == dtype
    logits = model(trainer.task.test_split.images[:200], training=False)
    assert logits.dtype == "float32"  # the classifier's output layer stays float32
    accuracy = float(np.mean(np.argmax(logits, -1) == trainer.task.test_split.labels[:200]))
    assert accuracy == pytest.approx(results["test_accuracy"], abs=0.03)


def test_float16_overflow_skips_the_step_and_lowers_the_loss_scale(tmp_path):
    """The LossScaleOptimizer path: a loss scale that overflows float16 gradients makes the step a
    no-op on the weights and halves the scale; the next steps train."""
    trainer = train_lib.Trainer(_config(tmp_path, "mixed_float16", epochs=1), log=lambda s: None)
    trainer.prepare()
    optimizer = trainer.optimizer
    optimizer.dynamic_scale.assign(2.0 ** 40)  # float16 overflows at 65504
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    iterator = iter(distribute.distribute_dataset(trainer.strategy, trainer.task.train_dataset(0)))
    sums = trainer.train_steps(iterator, tf.constant(1)).numpy()
    assert np.isfinite(sums[0])  # the reported loss is the unscaled one
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 39
    for variable, old in zip(trainer.model.trainable_variables, before):
        np.testing.assert_array_equal(variable.numpy(), old, err_msg=variable.path)
    optimizer.dynamic_scale.assign(2.0 ** 8)
    trainer.train_steps(iterator, tf.constant(3)).numpy()
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 8  # no overflow: the scale holds
    changed = [not np.array_equal(v.numpy(), old) for v, old in zip(trainer.model.trainable_variables, before)]
    assert sum(changed) >= len(changed) - 2  # the step applied (centers of far heads may get ~0 gradient)


def test_gelu_of_bfloat16_activations_is_evaluated_in_float32_forward_and_backward():
    """The MLP's GELU under mixed_bfloat16: float32 arithmetic on the bfloat16 input, rounded once
    to bfloat16 at the end (the gradient likewise); bfloat16 intermediates would round at every step."""
    from sa_conv.transformer import exact_gelu

    x = tf.constant(np.random.default_rng(0).normal(0, 2, 4096), tf.bfloat16)
    x32 = tf.cast(x, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, x32])
        y, y32 = exact_gelu(x), exact_gelu(x32)
    assert y.dtype == tf.bfloat16
    np.testing.assert_array_equal(y.numpy(), tf.cast(y32, tf.bfloat16).numpy())
    grad, grad32 = tape.gradient(y, x), tape.gradient(y32, x32)
    np.testing.assert_array_equal(grad.numpy(), tf.cast(grad32, tf.bfloat16).numpy())


CONTENT_MODELS = [("sa_gated_small", {}), ("sa_content_plus_learned_bias_small", {}),
                  ("sa_content_plus_learned_bias_small", {"encoding": "content_with_relative_keys"})]


def _one_block(preset, overrides, dtype):
    keras.utils.set_random_seed(0)
    return sa_conv.build_model(preset, dtype=dtype, num_layers=1, **overrides)


@pytest.mark.parametrize("preset, overrides", CONTENT_MODELS)
def test_content_attention_under_bfloat16_keeps_its_batch_of_probabilities_in_bfloat16(preset, overrides):
    """A training step under mixed_bfloat16 makes no float32 copy of the ``(batch, heads, N, N)``
    logits or probabilities, forward or backward (such casts cost more than the softmax itself);
    the scores the layer returns are float32 as documented."""
    model = _one_block(preset, overrides, "mixed_bfloat16")
    images = tf.constant(np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)), tf.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(images).graph
    attention = sa_conv.attention_blocks(model)[0].attention
    grid = sa_conv.attention_grid(model)[0]
    full = (2, attention.num_heads, grid[0] * grid[1], grid[0] * grid[1])
    casts = [op.name for op in graph.get_operations() if op.type == "Cast" and tuple(op.outputs[0].shape) == full]
    assert casts == [] and any(op.type == "Softmax" for op in graph.get_operations())
    _, scores = attention(tf.zeros((2, *grid, attention.input_dim), tf.bfloat16), return_attention_scores=True)
    assert scores.dtype == "float32" and tuple(scores.shape) == full


@pytest.mark.parametrize("preset, overrides", CONTENT_MODELS)
def test_content_attention_under_bfloat16_follows_float32_within_its_rounding(preset, overrides):
    """One block under mixed_bfloat16 against the same weights in float32: the logits within a
    relative (L2) error of 2^-5, the gradient of every attention weight but the biases within 2^-3.

    bfloat16 rounds to 8 significant bits (2^-8 relative). The block rounds a value about 20 times
    in series forward (`tests.tolerances.depth`), as many again backward; independent roundings add
    in quadrature: about 2^-5.8 forward, 2^-5.3 both ways (0.3% and 1.2% measured
    under oneDNN). TensorFlow's own bfloat16 softmax also rounds exp's argument, ``|x - max|`` times
    2^-8 each: 0.5% and 4.9% there. A bfloat16 path that drops the logits' 1/sqrt(d) is off by
    1.2-11% in its logits and 170-1700% in its gradients."""
    images = tf.constant(np.random.default_rng(1).uniform(0, 255, (8, 32, 32, 3)), tf.float32)
    labels = tf.constant(np.arange(8) % 10)
    results = []
    for dtype in ("float32", "mixed_bfloat16"):
        model = _one_block(preset, overrides, dtype)
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=False), tf.float32)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        attention = {v.path: tf.cast(tf.convert_to_tensor(g), tf.float32).numpy()
                     for v, g in zip(model.trainable_variables, gradients) if "attention/" in v.path}
        results.append((logits.numpy(), attention))
    (logits32, gradients32), (logits16, gradients16) = results

    def relative(a, b):
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    assert relative(logits16, logits32) < 2 ** -5
    # Not the biases': a bias's gradient sums terms over every pixel that nearly cancel (a key bias's
    # exactly: softmax ignores a constant), so rounding is most of what is left of it.
    errors = {name: relative(gradients16[name], g) for name, g in gradients32.items() if not name.endswith("bias")}
    assert len(errors) >= 4 and max(errors.values()) < 2 ** -3, errors
