"""The reference importer's PyTorch path (`sa_conv.reference.read_state_dict` on a checkpoint,
through ``torch.load``): a file written with ``torch.save`` as the reference's train.py writes
``best.checkpoint``, read back and imported. Needs torch, so it runs in ``make test-backends``'s
virtualenv (no TensorFlow: nothing here imports it) and is skipped where torch is absent."""

import collections
import json
import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="reading PyTorch checkpoints needs torch (make test-backends has it)")

from sa_conv import reference  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "reference", "content_plus_learned_bias.npz")


def _fixture():
    with np.load(FIXTURE) as data:
        fixture = {k: data[k] for k in data.files}
    state = {k[len("state/"):]: v for k, v in fixture.items() if k.startswith("state/")}
    return fixture, state


@pytest.mark.parametrize("layout", ["train_py", "data_parallel_bare"])
def test_torch_checkpoint_reads_to_the_state_dict_and_imports_the_reference_function(layout, tmp_path):
    """The reference's train.py saves ``{"epoch", "test_accuracy", "model_state_dict"}``; a
    model wrapped in ``DataParallel`` has every name prefixed with ``module.``, and a bare state
    dict is read too. Each tensor reads back unchanged (its dtype too: the int64 buffers), and the
    model imported from it computes the reference's logits on the fixture's images."""
    fixture, state = _fixture()
    tensors = collections.OrderedDict((k, torch.from_numpy(v)) for k, v in state.items())
    path = tmp_path / "best.checkpoint"
    if layout == "train_py":
        torch.save({"epoch": 12, "test_accuracy": 0.5, "model_state_dict": tensors}, path)
    else:
        torch.save(collections.OrderedDict((f"module.{k}", v) for k, v in tensors.items()), path)
    read = reference.read_state_dict(str(path))
    assert list(read) == list(state)
    for name, value in state.items():
        assert isinstance(read[name], np.ndarray) and read[name].dtype == value.dtype, name
        np.testing.assert_array_equal(read[name], value, err_msg=name)
    model = reference.import_reference(read, json.loads(str(fixture["config"])))
    logits = keras.ops.convert_to_numpy(model(fixture["images"], training=False))
    np.testing.assert_allclose(logits, fixture["logits"], rtol=0, atol=1e-4)


def test_a_torch_file_that_is_not_a_state_dict_is_refused(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(reference.ReferenceImportError, match="holds a Tensor, not a state dict"):
        reference.read_state_dict(str(path))
