"""Every preset, with fixed weights, computes what it computed before the one-path redesign
(tests/fixtures/golden, recorded by `tests.golden` at the commit before it): inference logits,
attention maps, the gradients of one training step with and without remat and attention dropout,
and the frozen float32 and bfloat16 serving copies."""

import numpy as np
import pytest

from tests import golden

pytest.importorskip("tensorflow", reason="the training step's gradients are taken with tf.GradientTape")

RTOL = 1e-6
# Gradients, relative to the step's gradient scale. The fixtures were recorded with TensorFlow's
# default kernels on an AVX2 CPU (Eigen); under oneDNN (TF_ENABLE_ONEDNN_OPTS=1, as CI's full run)
# the same computation sums in another order, and a gradient, summed over the batch, the pixels
# and six blocks of backward passes, moved by up to about 2e-6 of the step's largest gradient
# entry (measured). 1e-5 leaves room for that; a changed computation moves gradients by far more
# (a dropout mask drawn from another seed moved them by 1e-2 to 3e-1 of it).
GRADIENT_TOL = 1e-5


def _paper_size(preset):
    return not preset.endswith("_small") and preset != "resnet18"


@pytest.fixture(params=golden.presets())
def recorded(request, made_once):
    """``(preset, the fixture's arrays, what it computes now)``; computed once per test run, however
    a random order interleaves the four tests of a preset with others and spreads them over
    workers (a module-scoped fixture recomputed it after each interruption: up to 4x a paper model)."""
    preset = request.param
    if _paper_size(preset) and request.config.getoption("--fast"):
        pytest.skip("paper-size presets run in the full suite")
    want = dict(np.load(golden.FIXTURES / f"{preset}.npz"))
    directory = made_once(f"golden-{preset}", lambda d: np.savez(d / "got.npz", **golden.record(preset)))
    return preset, want, dict(np.load(directory / "got.npz"))


def test_the_same_arrays_are_recorded(recorded):
    _, want, got = recorded
    assert sorted(got) == sorted(want)


def test_inference_logits_and_attention_maps(recorded):
    _, want, got = recorded
    for key in ("logits", "attention"):
        if key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=RTOL * np.abs(want[key]).max())
            assert np.abs(want[key]).std() > 0  # the recorded values vary: a constant cannot pass


def test_training_gradients_with_and_without_remat_and_attention_dropout(recorded):
    preset, want, got = recorded
    whole = [k for k in want if k.startswith("grad/")]
    sketched = [k for k in want if k.startswith("sketch/")]
    variants = {k.split("/")[1] for k in whole + sketched}
    assert variants == (set(golden.VARIANTS) if preset != "resnet18" else {"plain"})
    # The scale of a step's gradients: the largest entry of any gradient of the same variant. A
    # gradient that is zero but for rounding (the key bias, which the softmax removes) is held to it.
    scale = {v: max(np.abs(want[k]).max() for k in whole if k.split("/")[1] == v) for v in variants}
    for key in whole:
        np.testing.assert_allclose(got[key], want[key], rtol=GRADIENT_TOL, atol=GRADIENT_TOL * scale[key.split("/")[1]],
                                   err_msg=key)
    for key in sketched:
        path = key.split("/", 2)[2]
        *products, norm, size = want[key]
        assert got[key][-1] == size and norm > 0
        bound = GRADIENT_TOL * norm * np.linalg.norm(golden.sketch_vectors(path, size), axis=1)
        np.testing.assert_array_less(np.abs(got[key][:-2] - products), bound, err_msg=key)
        np.testing.assert_allclose(got[key][-2], norm, rtol=GRADIENT_TOL, err_msg=key)


def test_serving_copies(recorded):
    _, want, got = recorded
    np.testing.assert_allclose(got["frozen"], want["frozen"], rtol=RTOL, atol=RTOL * np.abs(want["frozen"]).max())
    # bfloat16 keeps 8 significant bits: one rounding is up to 2**-9 of a value, and the copy
    # rounds every activation of every layer. Reordering two additions or casts moves a logit by
    # a few such roundings of the logits' scale; 2**-6 of it leaves room for that and not for a
    # changed computation (the float32 copy's logits differ from the bfloat16 copy's by more).
    scale = np.abs(want["frozen"]).max()
    np.testing.assert_allclose(got["bfloat16"], want["bfloat16"], rtol=0, atol=2 ** -6 * scale)
    assert (got["bfloat16"].argmax(-1) == want["bfloat16"].argmax(-1)).all()
