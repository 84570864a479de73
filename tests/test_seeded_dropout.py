"""`sa_conv.seeded_dropout` on its own: masks from seeds, the head-by-head Eq. (6) with dropout,
its hand-written gradient, `after`'s data dependency (kept by Grappler and by XLA) and
`rematerialize` with absent arguments."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from sa_conv.seeded_dropout import (GivenSeed, after, apply_keep_mask, draw_keep_mask, rematerialize,
                                    seeded_sum_over_heads, sum_over_heads)

SEED = tf.constant([7, 11], tf.int32)


def test_a_seed_gives_one_mask_and_another_seed_another():
    a = ops.convert_to_numpy(draw_keep_mask((4, 50, 50), SEED, 0.3))
    b = ops.convert_to_numpy(draw_keep_mask((4, 50, 50), SEED, 0.3))
    c = ops.convert_to_numpy(draw_keep_mask((4, 50, 50), SEED + 1, 0.3))
    assert a.dtype == bool and (a == b).all() and (a != c).mean() > 0.3
    assert abs(a.mean() - 0.7) < 0.02  # 10,000 draws: std 0.005
    assert GivenSeed(SEED).next() is SEED


def test_apply_keep_mask_is_inverted_dropout():
    x = np.array([[1.0, -2.0], [3.0, np.inf]], np.float32)
    keep = np.array([[True, False], [True, False]])
    got = ops.convert_to_numpy(apply_keep_mask(x, keep, 0.75))
    np.testing.assert_array_equal(got, [[4.0, 0.0], [12.0, 0.0]])  # a dropped inf is 0, not NaN
    assert apply_keep_mask(x, None, 0.5) is x


def _case(shared, seed=0, batch=2, heads=3, n=5, d=4, out=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, n, d)).astype(np.float32)
    logits = rng.normal(size=(heads, n, n) if shared else (batch, heads, n, n))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    kernel = rng.normal(size=(heads * d, out)).astype(np.float32)
    return x, probs.astype(np.float32), kernel


def _dense_with_mask(x, probs, kernel, keep, rate):
    """Eq. (6) with a dropped ``P`` in one einsum, float64: ``concat_h(Dropout(P_h) X) W``."""
    batch, heads = keep.shape[:2]
    p = np.broadcast_to(probs, keep.shape) * keep / (1.0 - rate)
    mixed = np.einsum("bhqk,bkd->bqhd", p.astype(np.float64), x.astype(np.float64)).reshape(batch, x.shape[1], -1)
    return mixed @ kernel


@pytest.mark.parametrize("shared", [True, False])
def test_sum_over_heads_equals_the_concatenated_heads(shared):
    x, probs, kernel = _case(shared)
    keep = ops.convert_to_numpy(draw_keep_mask((2, 3, 5, 5), SEED, 0.4))
    got = ops.convert_to_numpy(sum_over_heads(x, probs, kernel, keep, 0.4))
    np.testing.assert_allclose(got, _dense_with_mask(x, probs, kernel, keep, 0.4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_seeded_sum_and_its_gradient_equal_autodiff_of_the_same_mask(shared):
    """Forward: `sum_over_heads` with the seed's mask. Backward: the hand-written gradient (mask
    drawn again) equals TensorFlow's autodiff through `sum_over_heads` with that mask."""
    x, probs, kernel = (tf.constant(a) for a in _case(shared, seed=3))
    rate = 0.3
    keep = draw_keep_mask((2, 3, 5, 5), SEED, rate)
    upstream = tf.constant(np.random.default_rng(4).normal(size=(2, 5, 3)).astype(np.float32))

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([x, probs, kernel])
            y = fn()
            loss = tf.reduce_sum(y * upstream)
        return [y] + tape.gradient(loss, [x, probs, kernel])

    seeded = grads(lambda: seeded_sum_over_heads(x, probs, kernel, SEED, rate))
    plain = grads(lambda: sum_over_heads(x, probs, kernel, keep, rate))
    assert seeded[2].shape == probs.shape
    for got, want in zip(seeded, plain):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_after_changes_no_value_not_even_for_nan_or_inf():
    for value in (1.5, np.nan, np.inf, -np.inf, 0.0):
        got = after(SEED, tf.fill((2, 3), tf.constant(value, tf.float32)))
        assert got.dtype == SEED.dtype
        np.testing.assert_array_equal(got.numpy(), SEED.numpy())


def _mask_of(x, seed, tie):
    """A keep-mask whose value depends on ``seed`` only; ``tie`` decides whether its draw waits
    for ``x * 2``."""
    return draw_keep_mask((4,), after(seed, x * 2.0) if tie else seed, 0.5)


def _grappler_reads_x(tie):
    """Whether, after TensorFlow's graph optimizations (Grappler, as the runtime applies them),
    the random draw still has the placeholder ``x`` among its inputs."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer  # the optimizer the runtime runs

    fn = tf.function(lambda x, seed: _mask_of(x, seed, tie)).get_concrete_function(
        tf.TensorSpec((3,), tf.float32, name="x"), tf.TensorSpec((2,), tf.int32, name="seed"))
    meta = tf.compat.v1.train.export_meta_graph(graph_def=fn.graph.as_graph_def(), graph=fn.graph)
    meta.collection_def["train_op"].node_list.value.extend([fn.outputs[0].op.name])
    graph = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    nodes = {n.name: n for n in graph.node}
    draws = [n.name for n in graph.node if n.op.startswith("StatelessRandomUniform")]
    assert len(draws) == 1
    seen, todo = set(), list(draws)
    while todo:
        name = todo.pop().split(":")[0].lstrip("^")
        if name not in seen:
            seen.add(name)
            todo += list(nodes[name].input)
    return "x" in seen


def _xla_reads_x(tie):
    """Whether XLA's optimized program still reads ``x`` (its first parameter): the output
    depends on ``seed`` alone, so ``x`` is read only if the dependency survived."""
    fn = tf.function(lambda x, seed: _mask_of(x, seed, tie), jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(tf.ones((3,)), SEED)(stage="optimized_hlo")
    entry = hlo[hlo.index("\nENTRY"):]
    param = re.search(r"%(\S+) = f32\[3\]\S* parameter\(0\)", entry).group(1)
    return len(re.findall(rf"%{re.escape(param)}\b", entry)) > 1


@pytest.mark.parametrize("reads_x", [_grappler_reads_x, _xla_reads_x], ids=["grappler", "xla"])
def test_after_keeps_the_draw_waiting_for_the_tensor_through_graph_optimizations(reads_x):
    """The point of `after`: the mask of a block is drawn once that block's tensor exists, not
    at the start of the step. The runtime orders ops by data dependencies only, so the
    dependency must survive Grappler and XLA's simplifier (``where(isnan(t), 0, 0)`` is not
    folded to a constant). Without `after`, neither program reads ``x``: the check can fail."""
    assert reads_x(tie=True)
    assert not reads_x(tie=False)


def test_rematerialize_passes_nones_through_and_matches_the_plain_call():
    dense = keras.layers.Dense(3, kernel_initializer="ones")
    dense.build((None, 3))
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    calls = []

    def block(x, seed, scale):
        calls.append((seed is None, scale is None))
        y = dense(x)
        return y if scale is None else y * scale

    with tf.GradientTape() as tape:
        tape.watch(x)
        y = rematerialize(block, x, None, tf.constant(2.0))
        loss = tf.reduce_sum(y)
    grad = tape.gradient(loss, x)
    np.testing.assert_allclose(y.numpy(), block(x, None, tf.constant(2.0)).numpy())
    np.testing.assert_allclose(grad.numpy(), np.full((2, 3), 6.0))  # d/dx sum(2 * x @ ones(3, 3))
    assert set(calls) == {(True, False)}
