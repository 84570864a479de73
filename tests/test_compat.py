"""Models saved before the encoding redesign (tests/fixtures/legacy, see its README) still load
and compute the same outputs."""

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv  # noqa: F401  (registers the classes the files name, as a user would import it)

from tests.conftest import PROJECT_ROOT

LEGACY = PROJECT_ROOT / "tests" / "fixtures" / "legacy"


@pytest.mark.parametrize("name", ["sa_quadratic_small", "sa_quadratic_full_small", "sa_learned_small",
                                  "sa_learned_content_small"])
def test_keras_files_saved_before_the_redesign_load_unchanged(name):
    expected = np.load(LEGACY / "expected.npz")
    model = keras.models.load_model(LEGACY / f"{name}.keras")
    got = ops.convert_to_numpy(model(expected["images"], training=False))
    np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6)
    assert np.abs(expected[name]).max() > 1e-3  # real outputs, not zeros
