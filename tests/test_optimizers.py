"""trainers.optimizers.PyTorchSGD against torch.optim.SGD's update rule, transcribed in numpy."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.optimizers import PyTorchSGD


def _torch_sgd(w, grads, lrs, momentum):
    """torch.optim.SGD(momentum=mu, dampening=0, nesterov=False): buf = g at the first step, then
    buf = mu buf + g; w -= lr buf."""
    buf = None
    for g, lr in zip(grads, lrs):
        buf = g.copy() if buf is None else momentum * buf + g
        w = w - lr * buf
    return w


def _keras(optimizer, w, grads, lrs):
    variable = keras.Variable(w)
    optimizer.build([variable])
    for g, lr in zip(grads, lrs):
        optimizer.learning_rate.assign(lr)
        optimizer.apply([keras.ops.convert_to_tensor(g)], [variable])
    return keras.ops.convert_to_numpy(variable)


@settings(max_examples=20, deadline=None)
@given(lrs=st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.05]), min_size=1, max_size=8),
       momentum=st.sampled_from([0.0, 0.5, 0.9]), seed=st.integers(0, 100))
def test_matches_torch_sgd_with_a_changing_learning_rate(lrs, momentum, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(5).astype("float32")
    grads = [rng.standard_normal(5).astype("float32") for _ in lrs]
    ours = _keras(PyTorchSGD(0.0, momentum=momentum), w, grads, lrs)
    np.testing.assert_allclose(ours, _torch_sgd(w, grads, lrs, momentum), rtol=1e-5, atol=1e-6)


def test_differs_from_keras_sgd_after_an_epoch_at_lr_zero():
    """The reference's warm-up epoch at lr 0: PyTorch's buffer keeps the gradients and spends them
    at the first step with lr > 0; Keras's momentum stays 0. Same with a constant lr."""
    w, grads = np.zeros(3, "float32"), [np.ones(3, "float32")] * 4
    lrs = [0.0, 0.0, 0.0, 0.1]
    torch_like = _keras(PyTorchSGD(0.0, momentum=0.9), w, grads, lrs)
    keras_sgd = _keras(keras.optimizers.SGD(0.0, momentum=0.9), w, grads, lrs)
    np.testing.assert_allclose(torch_like, -0.1 * (1 + 0.9 + 0.81 + 0.729), rtol=1e-6)
    np.testing.assert_allclose(keras_sgd, -0.1, rtol=1e-6)
    same = [_keras(opt, w, grads, [0.1] * 4) for opt in (PyTorchSGD(0.1, momentum=0.9),
                                                         keras.optimizers.SGD(0.1, momentum=0.9))]
    np.testing.assert_allclose(same[0], same[1], rtol=1e-6)


def test_config_round_trip():
    optimizer = PyTorchSGD(0.05, momentum=0.9)
    clone = PyTorchSGD.from_config(optimizer.get_config())
    assert clone.momentum == pytest.approx(0.9) and float(clone.learning_rate) == pytest.approx(0.05)
    assert keras.optimizers.deserialize(keras.optimizers.serialize(optimizer)).__class__ is PyTorchSGD
