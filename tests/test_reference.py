"""Parity with the reference implementation (epfml/attention-cnn), without torch.

The fixtures of ``tests/fixtures/reference`` were written by ``tools/make_reference_fixtures.py``
from the reference's own code: its state dict, 8 images, its eval-mode logits and layer 0's
attention probabilities. After `load_reference_weights`, sa-conv must compute the same function.
ResNet18 is too large for a fixture: its layout is checked against a numpy forward pass of the
reference's architecture on a state dict made here with the reference's tensor names and shapes.
"""

import json
import os

import epfml_reference
import keras
import numpy as np
import pytest
import tensorflow as tf

import sa_conv
from sa_conv import reference

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "reference")
ENCODINGS = list(epfml_reference.ENCODING_FLAGS)  # one fixture per variant, named by sa-conv encoding
GRID = 16


def _fixture(name):
    with np.load(os.path.join(FIXTURES, f"{name}.npz")) as data:
        return {k: data[k] for k in data.files}


def _state(fixture):
    return {k[len("state/"):]: v for k, v in fixture.items() if k.startswith("state/")}


def _config(fixture):
    return json.loads(str(fixture["config"]))


def _imported(name):
    fixture = _fixture(name)
    return fixture, reference.import_reference(_state(fixture), _config(fixture))


def test_fixtures_are_small():
    total = sum(os.path.getsize(os.path.join(FIXTURES, f)) for f in os.listdir(FIXTURES))
    assert total < 3e6


@pytest.mark.parametrize("name", ENCODINGS)
def test_imported_model_computes_the_reference_function(name):
    fixture, model = _imported(name)
    logits = np.asarray(model(fixture["images"], training=False))
    np.testing.assert_allclose(logits, fixture["logits"], rtol=0, atol=1e-4)
    # Layer 0's probabilities, reference layout [(batch,) qi, qj, head, ki, kj] at the stored
    # query rows and columns; sa-conv's [batch, head, query, key], row-major pixels.
    probs = np.asarray(sa_conv.attention_probabilities(model, fixture["images"])[0])
    q = fixture["query_positions"]
    ours = probs.reshape(len(probs), -1, GRID, GRID, GRID, GRID)[:, :, q[:, None], q[None, :]]
    theirs = fixture["probabilities"]
    if theirs.ndim == 5:  # position only: the same for every image
        theirs = np.broadcast_to(theirs, (len(probs),) + theirs.shape)
    theirs = np.moveaxis(theirs, 3, 1)
    np.testing.assert_allclose(ours[: len(theirs)], theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ENCODINGS)
def test_trainer_steps_from_imported_weights_match_the_reference_optimizer(name, tmp_path):
    """Same weights, same batch: the trainer's loss, coupled weight decay (not on centers and
    spreads) and PyTorch-form SGD, one step per learning rate (0 first, so the momentum buffer
    must take that step's gradient), give the reference's logits after its own steps."""
    from trainers.config import make_config
    from trainers.optimizers import PyTorchSGD
    from trainers.task import Task

    fixture = _fixture(name)
    config = {**_config(fixture), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = reference.import_reference(_state(fixture), config)
    task = Task(make_config(overrides=dict(
        dataset="synthetic", global_batch_size=len(fixture["images"]), momentum_form="pytorch",
        weight_decay=1e-4, model_dir=str(tmp_path))), log=lambda s: None)
    optimizer = PyTorchSGD(learning_rate=0.0, momentum=0.9)
    optimizer.build(model.trainable_variables)
    for lr in fixture["train_learning_rates"]:
        optimizer.learning_rate = float(lr)
        grads, _ = task.gradients(model, optimizer, fixture["images"], fixture["labels"])
        optimizer.apply(grads, model.trainable_variables)
    logits = np.asarray(model(fixture["images"], training=False))
    assert np.abs(fixture["trained_logits"] - fixture["logits"]).max() > 0.5  # the steps moved the model
    np.testing.assert_allclose(logits, fixture["trained_logits"], rtol=0, atol=1e-5)


def test_reference_configs_pick_the_matching_encoding_and_sizes():
    for encoding in ENCODINGS:
        config = reference.model_config(_config(_fixture(encoding)))
        assert (config.encoding, config.num_layers, config.num_heads, config.hidden_size, config.mlp_size,
                config.pooling_width, config.max_grid_size) == (encoding, 3, 9, 64, 128, 2, 16)


def test_the_fixture_configs_are_what_epfml_reference_says():
    """The fixtures were written from `epfml_reference`'s small config and flags; the importer
    reads the encoding back from the flags, and sa-conv fields translate back to the same config."""
    for encoding in ENCODINGS:
        config = _config(_fixture(encoding))
        assert config == epfml_reference.reference_config(encoding)
        assert epfml_reference.encoding_of(config) == encoding
        fields = epfml_reference.model_fields(config)
        assert epfml_reference.reference_config(**fields) == config
    with pytest.raises(ValueError, match="has no 'mlp' attention"):
        epfml_reference.reference_config("mlp")
    with pytest.raises(ValueError, match="'image_size' has no reference config key"):
        epfml_reference.reference_config("learned", image_size=64)


def test_paper_size_content_model_has_the_reference_parameter_count():
    # The reference builds 29,601,882 parameters at the paper size (learned 2-D + content).
    paper = {**_config(_fixture("content_plus_learned_bias")), "hidden_size": 400, "num_hidden_layers": 6,
             "intermediate_size": 512}
    model = sa_conv.build_model(reference.model_config(paper))
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 29_601_882
    assert sa_conv.get_config("sa_content_plus_learned_bias").encoding == "content_plus_learned_bias"


def test_derived_buffers_are_ignored_and_not_required():
    fixture = _fixture("quadratic")
    state = _state(fixture)
    assert "attention_mask" in state and "encoder.layer.0.attention.self.relative_indices" not in state
    learned = _state(_fixture("learned"))
    assert "encoder.layer.0.attention.self.relative_indices" in learned
    without = {k: v for k, v in learned.items() if not k.endswith(("relative_indices", "attention_mask"))}
    a = reference.import_reference(learned, _config(_fixture("learned")))
    b = reference.import_reference(without, _config(_fixture("learned")))
    for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)


def test_unmatched_tensors_are_errors_that_name_them():
    fixture = _fixture("quadratic")
    config = _config(fixture)
    model = sa_conv.build_model(reference.model_config(config))
    state = _state(fixture)
    extra = {**state, "encoder.layer.0.attention.self.extra_scale": np.ones(3, np.float32)}
    with pytest.raises(reference.ReferenceImportError, match=r"unused encoder\.layer\.0\.attention\.self\.extra_scale"):
        reference.load_reference_weights(model, extra)
    missing = {k: v for k, v in state.items() if k != "encoder.layer.2.output.LayerNorm.bias"}
    with pytest.raises(reference.ReferenceImportError,
                       match=r"missing encoder\.layer\.2\.output\.LayerNorm\.bias \(for block_2/output_norm/beta"):
        reference.load_reference_weights(model, missing)
    wrong = {**state, "classifier.weight": np.zeros((10, 65), np.float32)}
    with pytest.raises(reference.ReferenceImportError, match=r"classifier\.weight has shape \(10, 65\)"):
        reference.load_reference_weights(model, wrong)
    # The learned tables on a quadratic model: every one of them is named as unused.
    learned = _state(_fixture("learned"))
    with pytest.raises(reference.ReferenceImportError, match="row_embeddings"):
        reference.load_reference_weights(model, learned)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(reference.ReferenceImportError):
        reference.load_reference_weights(model, extra)
    for x, y in zip(before, model.get_weights()):  # nothing is half-imported
        np.testing.assert_array_equal(x, y)


def test_encodings_without_a_reference_counterpart_are_refused():
    assert set(reference.ENCODING_TENSORS) == set(epfml_reference.ENCODING_FLAGS)  # each maps its own tensors
    model = sa_conv.build_model("sa_sinusoidal_small", num_layers=1)
    with pytest.raises(reference.ReferenceImportError, match="'sinusoidal' encoding has no counterpart"):
        reference.load_reference_weights(model, {})


@pytest.mark.parametrize("key,value,message", [
    ("attention_gaussian_blur_trick", True, "convolution approximation"),
    ("share_position_encoding", True, "shared by all layers"),
    ("hidden_act", "relu", "exact GELU"),
    ("dataset", "/data/mine", "only Cifar10 and Cifar100"),
    ("model", "vgg11", "imports the reference's 'bert' and 'resnet18'"),
])
def test_unsupported_reference_settings_are_named(key, value, message):
    config = {**_config(_fixture("quadratic")), key: value}
    with pytest.raises(reference.ReferenceImportError, match=message):
        reference.model_config(config)


@pytest.mark.slow
def test_command_imports_a_checkpoint_and_its_export_serves_the_reference_probabilities(tmp_path):
    from export.export import export
    from programs.import_reference import import_checkpoint

    fixture = _fixture("content_plus_learned_bias")
    checkpoint = tmp_path / "ckpt.npz"
    np.savez(checkpoint, **_state(fixture))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_config(fixture)))
    model_dir = tmp_path / "imported"
    path = import_checkpoint(str(checkpoint), str(config), str(model_dir), log=lambda s: None)
    results = json.loads((model_dir / "results.json").read_text())
    assert results["preset"] == "reference_content_plus_learned_bias" and results["parameters"] == 415_242
    with pytest.raises(sa_conv.SaConvError, match="exists"):
        import_checkpoint(str(checkpoint), str(config), str(model_dir), log=lambda s: None)

    version = export(model_dir=str(model_dir), export_dir=str(tmp_path / "exported"), log=lambda s: None)
    served = tf.saved_model.load(version).signatures["serving_default"]
    probabilities = served(images=tf.constant(fixture["images"]))["probabilities"].numpy()
    expected = np.asarray(keras.ops.softmax(fixture["logits"].astype(np.float64), axis=-1))
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-4)
    assert keras.models.load_model(path).name == "reference_content_plus_learned_bias"


def test_torch_checkpoints_without_torch_say_how_to_convert(tmp_path):
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here")
    except ImportError:
        pass
    path = tmp_path / "best.checkpoint"
    path.write_bytes(b"not read")
    with pytest.raises(reference.ReferenceImportError, match=r"pip install \.\[reference\]"):
        reference.read_state_dict(str(path))


# ------------------------------------------------------------------------------ ResNet18

def _reference_resnet_state(rng):
    """A state dict with the reference ResNet18's names and PyTorch layouts."""
    state = {}

    def conv_bn(prefix, conv, bn, out, inp, k):
        state[f"{prefix}{conv}.weight"] = rng.normal(0, np.sqrt(2 / (inp * k * k)), (out, inp, k, k)).astype(np.float32)
        state[f"{prefix}{bn}.weight"] = rng.uniform(0.5, 1.5, out).astype(np.float32)
        state[f"{prefix}{bn}.bias"] = rng.normal(0, 0.1, out).astype(np.float32)
        state[f"{prefix}{bn}.running_mean"] = rng.normal(0, 0.1, out).astype(np.float32)
        state[f"{prefix}{bn}.running_var"] = rng.uniform(0.5, 1.5, out).astype(np.float32)
        state[f"{prefix}{bn}.num_batches_tracked"] = np.array(7)

    conv_bn("", "conv1", "bn1", 64, 3, 3)
    inp = 64
    for stage, planes in enumerate((64, 128, 256, 512), 1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            p = f"layer{stage}.{block}."
            conv_bn(p, "conv1", "bn1", planes, inp, 3)
            conv_bn(p, "conv2", "bn2", planes, planes, 3)
            if stride != 1 or inp != planes:
                conv_bn(p + "shortcut.", "0", "1", planes, inp, 1)
            inp = planes
    state["linear.weight"] = rng.normal(0, 0.05, (10, 512)).astype(np.float32)
    state["linear.bias"] = rng.normal(0, 0.05, 10).astype(np.float32)
    return state


def _conv(x, w, stride, pad):
    """PyTorch's conv2d (NCHW input, OIHW kernel, symmetric zero padding), in numpy."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, i, k, _ = w.shape
    h = (x.shape[2] - k) // stride + 1
    cols = np.stack([x[:, :, a:a + stride * h:stride, b:b + stride * h:stride]
                     for a in range(k) for b in range(k)], axis=2)  # (n, i, k*k, h, h)
    return np.einsum("nikyx,oik->noyx", cols, w.reshape(o, i, k * k))


def _numpy_resnet18(state, x):
    def bn(x, p):
        scale = state[p + ".weight"] / np.sqrt(state[p + ".running_var"] + 1e-5)
        return (x - state[p + ".running_mean"][:, None, None]) * scale[:, None, None] + state[p + ".bias"][:, None, None]

    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    out = relu(bn(_conv(x, state["conv1.weight"], 1, 1), "bn1"))
    for stage in range(1, 5):
        for block in range(2):
            p = f"layer{stage}.{block}."
            stride = 2 if stage > 1 and block == 0 else 1
            y = relu(bn(_conv(out, state[p + "conv1.weight"], stride, 1), p + "bn1"))
            y = bn(_conv(y, state[p + "conv2.weight"], 1, 1), p + "bn2")
            shortcut = out
            if p + "shortcut.0.weight" in state:
                shortcut = bn(_conv(out, state[p + "shortcut.0.weight"], stride, 0), p + "shortcut.1")
            out = relu(y + shortcut)
    pooled = out.mean(axis=(2, 3))  # avg_pool2d(4) on the 4x4 map
    return pooled @ state["linear.weight"].T + state["linear.bias"]


def test_resnet18_layout_matches_a_numpy_forward_of_the_reference_architecture():
    rng = np.random.default_rng(0)
    state = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in _reference_resnet_state(rng).items()}
    model = reference.import_reference(state, {"model": "resnet18", "dataset": "Cifar10"})
    images = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    x = (images / 255.0 - np.array(epfml_reference.PIXEL_MEAN)) / np.array(epfml_reference.PIXEL_STD)
    expected = _numpy_resnet18(state, x.transpose(0, 3, 1, 2))
    logits = np.asarray(model(images, training=False))
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
    assert not any(k.endswith("num_batches_tracked") for k in [w.path for w in model.weights])


@pytest.mark.parametrize("name", ["quadratic", "content_plus_learned_bias"])
def test_initialization_draws_from_the_reference_distributions(name):
    """Every weight starts from the distribution of its reference counterpart: the same bound
    (PyTorch's U(+-1/sqrt(fan_in)) for Linear weights and biases, N(0, 1) tables) and, for
    tensors large enough to tell, the same spread. The fixture's weights are the reference's
    initial draws (rounded; LayerNorm perturbed, so LayerNorm is checked for ones and zeros)."""
    fixture = _fixture(name)
    state = _state(fixture)
    keras.utils.set_random_seed(0)
    model = sa_conv.build_model(reference.model_config(_config(fixture)))
    checked = 0
    for key, variable, transform in reference.weight_map(model):
        ours = np.asarray(keras.ops.convert_to_numpy(variable))
        if "LayerNorm" in key:
            assert np.all(ours == (1.0 if key.endswith("weight") else 0.0)), key
            continue
        theirs = state[key]
        if "attention_centers" in key or "attention_spreads" in key:
            continue  # N(0, 2) and 1 + N(0, 0.01) in both: too few values to compare
        if "embeddings" in key:  # N(0, 1)
            assert 0.9 < ours.std() / theirs.std() < 1.1, key
        else:  # PyTorch's Linear: U(+-1/sqrt(fan_in)), fan_in of the layer's weight (out, in)
            bound = 1 / np.sqrt(state[key.replace(".bias", ".weight")].shape[1])
            assert np.abs(theirs).max() <= bound * 1.01, key
            assert 0.8 * bound < np.abs(ours).max() <= bound, key
            if theirs.size >= 500:
                assert 0.93 < ours.std() / theirs.std() < 1.07, key
        checked += 1
    assert checked >= 20
