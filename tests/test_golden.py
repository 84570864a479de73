"""Every preset, with fixed weights, computes what it computed before the one-path redesign
(tests/fixtures/golden, recorded by `tests.golden` at the commit before it): inference logits,
attention maps, the gradients of one training step with and without remat and attention dropout,
and the frozen float32 and bfloat16 serving copies (a paper-size preset: the part of `golden.in_part`;
a remat variant against the same step's recording without remat, `golden.RECORDED_AS`). ResNet18's
gradients were recorded again later, in float64 (`golden.gradient_dtype`): within 1.5e-6 of their
scale of the float32 recording before the redesign; its other arrays are that recording's.
ResNet-20's fixture was recorded when the preset was added (float64 gradients too): it holds later
changes to it."""

import numpy as np
import pytest

import sa_conv
from tests import golden, tiers, tolerances

pytest.importorskip("tensorflow", reason="the training step's gradients are taken with tf.GradientTape")

# Every comparison allows what two correct evaluations may differ by on any CPU and kernel set,
# derived from the precision and the depth of the computation (`tests.tolerances`), and no more:
# `test_each_bound_fails_on_a_real_change` shows each one failing on a changed computation.


@pytest.fixture(params=tiers.presets(golden.presets(), tiers.GOLDEN_PAPER_IN_MAKE_TEST))
def recorded(request, made_once):
    """``(preset, the fixture's arrays, what it computes now)``; computed once per test run
    (`test_each_bound_fails_on_a_real_change` reads the small quadratic preset's too)."""
    return _recorded(request.param, made_once)


@pytest.fixture
def recorded_small(made_once):
    return _recorded("sa_quadratic_small", made_once)


def _recorded(preset, made_once):
    want = dict(np.load(golden.FIXTURES / f"{preset}.npz"))
    directory = made_once(f"golden-{preset}", lambda d: np.savez(d / "got.npz", **golden.record(preset, layout=want)))
    return preset, want, dict(np.load(directory / "got.npz"))


def check_inference(preset, want, got):
    """Logits through every block, block 0's attention probabilities through one: float32."""
    config = sa_conv.get_config(preset)
    for key, blocks in (("logits", None), ("attention", 1)):
        if key in want:
            tolerances.assert_close_to_scale(got[key], want[key], tolerances.float32_relative(config, blocks), key)
            assert np.abs(want[key]).std() > 0  # the recorded values vary: a constant cannot pass


def check_gradients(preset, want, got):
    """One training step's gradients, in `golden.gradient_dtype` through the forward and the
    backward pass, relative to the step's gradient scale; a sketched gradient norm-wise
    (``|g . r| <= e |g| |r|``). Each variant computed against its recorded one (`golden.RECORDED_AS`)."""
    config = sa_conv.get_config(preset)
    relative = tolerances.gradient_relative(config, golden.gradient_dtype(config), batch=golden.GRAD_BATCH)
    whole = [k for k in got if k.startswith("grad/")]
    sketched = [k for k in got if k.startswith("sketch/")]
    variants = {k.split("/")[1] for k in whole + sketched}
    every = set(golden.VARIANTS) if config.is_attention else {"plain"}
    assert variants == every or variants == every & set(golden.PART_VARIANTS)
    # The scale of a step's gradients: the largest entry of any gradient of the same variant. A
    # gradient that is zero but for rounding (the key bias, which the softmax removes) is held to it.
    scale = {v: max(np.abs(want[k]).max() for k in want if k.startswith(f"grad/{v}/"))
             for v in {golden.RECORDED_AS[v] for v in variants}}
    for key in whole:
        recorded = golden.recorded_key(key)
        np.testing.assert_allclose(got[key], want[recorded], rtol=0, atol=relative * scale[recorded.split("/")[1]],
                                   err_msg=key)
    for key in sketched:
        path = key.split("/", 2)[2]
        *products, norm, size = want[golden.recorded_key(key)]
        assert got[key][-1] == size and norm > 0
        bound = relative * norm * np.linalg.norm(golden.sketch_vectors(path, size), axis=1)
        np.testing.assert_array_less(np.abs(got[key][:-2] - products), bound, err_msg=key)
        np.testing.assert_allclose(got[key][-2], norm, rtol=relative, err_msg=key)


def check_serving(preset, want, got):
    """The float32 serving copy against its recording; the bfloat16 copy against the float32
    copy computed on this machine (not against a bfloat16 recording: another CPU rounds bfloat16
    elsewhere, natively or emulated), to bfloat16's bound."""
    config = sa_conv.get_config(preset)
    tolerances.assert_close_to_scale(got["frozen"], want["frozen"], tolerances.float32_relative(config), "frozen")
    if "bfloat16" not in want:  # a part of the recording (`golden.in_part`)
        return
    bound = tolerances.bfloat16_relative(config)
    # No class check: the fixed weights' margins (0.01-0.46 of the scale) are all within what
    # bfloat16 may move two logits by; the bfloat16 export tests check classes on clear images.
    tolerances.assert_close_to_scale(got["bfloat16"], got["frozen"], bound, "bfloat16")


def test_each_preset_computes_what_it_recorded(recorded):
    """The same arrays; inference logits and attention maps, the training gradients with and
    without remat and attention dropout, the serving copies. One test per preset: the recording
    is computed once, and no worker waits for another to compute it."""
    preset, want, got = recorded
    assert sorted(golden.stored(preset, got)) == sorted(want)
    assert {golden.recorded_key(k) for k in got} == set(want)
    check_inference(preset, want, got)
    check_gradients(preset, want, got)
    check_serving(preset, want, got)


def _scaled(path, factor):
    """A change of `golden.build`: the variable at ``path`` times ``factor``."""
    def change(model):
        (variable,) = [v for v in model.variables if v.path == path]
        variable.assign(variable.numpy() * factor)
    return change


def _dropped(layer):
    """A change of `golden.build`: the layer at ``layer`` (a path prefix) outputs zeros."""
    def change(model):
        for variable in model.variables:
            if variable.path.startswith(layer + "/"):
                variable.assign(np.zeros(variable.shape, variable.dtype))
    return change


def test_each_bound_fails_on_a_real_change(recorded_small):
    """Each comparison above refuses a changed computation of a small preset: a weight moved by
    1e-3 of itself (block 1's MLP output kernel: logits, gradients, the float32 serving copy;
    block 0's quadratic centers: its attention map) and, for the bfloat16 copy, a dropped term
    (block 1's attention output, kernel and bias at zero), which its looser bound must still see."""
    preset, want, got = recorded_small
    check_inference(preset, want, got)  # unchanged, they pass
    check_gradients(preset, want, got)
    check_serving(preset, want, got)
    # The plain variant's gradients and the float32 serving copy: the moved arrays the checks below read.
    moved = golden.record(preset, _scaled("block_1/output/kernel", 1 + 1e-3), part=True, layout=want)
    with pytest.raises(AssertionError, match="logits"):
        check_inference(preset, want, {**got, "logits": moved["logits"]})
    with pytest.raises(AssertionError, match="grad/"):
        check_gradients(preset, want, {**got, **{k: v for k, v in moved.items() if k.startswith("grad/")}})
    with pytest.raises(AssertionError, match="sketch/"):
        check_gradients(preset, want, {**got, **{k: v for k, v in moved.items() if k.startswith("sketch/")}})
    with pytest.raises(AssertionError, match="frozen"):
        check_serving(preset, want, {**got, "frozen": moved["frozen"]})
    centers = golden.inference(preset, golden.build(preset, _scaled("block_0/attention/position_encoding/centers",
                                                                   1 + 1e-3)))
    with pytest.raises(AssertionError, match="attention"):
        check_inference(preset, want, {**got, "attention": centers["attention"]})
    dropped = golden.serving(golden.build(preset, _dropped("block_1/attention_output")))
    with pytest.raises(AssertionError, match="bfloat16"):
        check_serving(preset, want, {**got, "bfloat16": dropped["bfloat16"]})


def test_the_float64_gradient_bound_fails_on_a_real_change(made_once):
    """ResNet18's gradients, recorded in float64 (`golden.gradient_dtype`) with float32 logits:
    their bound refuses one batch normalization's scale moved by 1e-3 of itself, as the float32
    bounds' test above moves a kernel. (Not a convolution's kernel here: the batch normalization
    after it, in training mode, divides a kernel's scale out.)"""
    preset, want, got = _recorded("resnet18", made_once)
    check_gradients(preset, want, got)
    moved = golden.record(preset, _scaled("stage2_block1_1_bn/gamma", 1 + 1e-3), part=True, layout=want)
    with pytest.raises(AssertionError, match="grad/"):
        check_gradients(preset, want, {**got, **{k: v for k, v in moved.items() if k.startswith("grad/")}})
    with pytest.raises(AssertionError, match="sketch/"):
        check_gradients(preset, want, {**got, **{k: v for k, v in moved.items() if k.startswith("sketch/")}})
