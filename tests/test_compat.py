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


def test_a_checkpoint_written_before_the_redesign_resumes(tmp_path):
    """A run directory written before the Task split and the renames (tests/fixtures/legacy/run):
    today's trainer, with the run's own flags (the old preset name included), restores every
    model and optimizer variable from its checkpoint and trains on from epoch 1."""
    import shutil

    from trainers.config import make_config
    from trainers.train import Trainer

    run = tmp_path / "run"
    shutil.copytree(LEGACY / "run", run)
    config = make_config(overrides=dict(
        model="sa_learned_content_small", num_layers=1, hidden_size=16, mlp_size=16, dataset="synthetic",
        epochs=2, global_batch_size=50, eval_batch_size=100, validation_size=100, model_dir=str(run),
        strategy="one_device", jit_compile=False))
    logs = []
    trainer = Trainer(config, log=logs.append, interactive=False)
    trainer.prepare()
    epoch, history = trainer.restore()
    assert (epoch, len(history)) == (1, 1)
    expected = np.load(run / "expected_weights.npz")
    saved = [expected[f"arr_{i}"] for i in range(len(expected.files))]
    current = [ops.convert_to_numpy(v) for v in trainer.model.weights] + \
        [ops.convert_to_numpy(v) for v in trainer.optimizer.variables]
    assert len(current) == len(saved)
    for got, want in zip(current, saved):
        np.testing.assert_array_equal(got, want)
    history, _ = trainer.train_epochs(epoch, history, save=False)
    assert [h["epoch"] for h in history] == [1, 2] and np.isfinite(history[-1]["train_loss"])
