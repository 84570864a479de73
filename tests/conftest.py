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


def pytest_configure(config):
    np.set_printoptions(precision=4, suppress=True)
