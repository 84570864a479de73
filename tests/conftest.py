"""Shared fixtures: the real CIFAR-10 subset in ../shared (when present) and tiny datasets
that the tests write themselves in the official python format."""

import os
import pathlib

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]
CIFAR10_MINI = pathlib.Path(
    os.environ.get("SA_CONV_CIFAR10_MINI", PROJECT_ROOT.parent / "shared/datasets/cifar10-mini")
)


@pytest.fixture(scope="session")
def cifar10_mini_dir():
    """The real CIFAR-10 subset (4,170 train / 1,000 test images) shipped in ../shared."""
    if not (CIFAR10_MINI / "cifar-10-batches-py" / "data_batch_1").is_file():
        pytest.skip(f"real CIFAR-10 subset not found at {CIFAR10_MINI} (set SA_CONV_CIFAR10_MINI)")
    return str(CIFAR10_MINI)


@pytest.fixture(scope="session")
def tiny_cifar(tmp_path_factory):
    """A small dataset in the official format, written by the test session itself.

    Returns (path to cifar-10-batches-py, the CifarData written).
    """
    from sa_conv import data

    generated = data.make_synthetic(num_train=250, num_test=50, seed=3)
    directory = tmp_path_factory.mktemp("tiny_cifar")
    return data.write_cifar10_files(str(directory), generated), generated


@pytest.fixture(scope="session")
def real_images(tiny_cifar):
    """A few real CIFAR-10 images when ../shared is present, else the tiny generated ones."""
    from sa_conv import data

    if (CIFAR10_MINI / "cifar-10-batches-py" / "test_batch").is_file():
        return data.load_cifar10_files(str(CIFAR10_MINI)).test.images[:16]
    return tiny_cifar[1].test.images[:16]


def gradients(loss_fn, x, variables):
    """Gradients of the scalar ``loss_fn(x)`` with respect to the input ``x`` and ``variables``
    (Keras variables), as numpy arrays, on whichever Keras backend runs."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(x)
        return [np.asarray(g) for g in tape.gradient(loss, [x, *variables])]
    if backend == "jax":
        import jax

        values = [v.value for v in variables]
        gx, gv = jax.grad(lambda x, values: _stateless(loss_fn, x, variables, values), argnums=(0, 1))(x, values)
        return [np.asarray(gx), *map(np.asarray, gv)]
    if backend == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        for v in variables:
            v.value.grad = None
        loss_fn(x).backward()
        return [x.grad.numpy(), *(v.value.grad.numpy() for v in variables)]
    raise NotImplementedError(backend)


def _stateless(loss_fn, x, variables, values):
    import keras

    with keras.StatelessScope(state_mapping=list(zip(variables, values))):
        return loss_fn(x)


def pytest_configure(config):
    np.set_printoptions(precision=4, suppress=True)
