"""What the repository tracks: model files only as test fixtures, and little enough that a clone
stays quick. A trained model, an export or a checkpoint belongs in a release or a run directory;
every copy committed stays in the history of every clone."""

import re
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT

FIXTURES = "tests/fixtures/"
# Keras, HDF5 and NumPy archives, LiteRT, ONNX and PyTorch files.
MODEL_SUFFIXES = (".keras", ".h5", ".hdf5", ".npz", ".tflite", ".onnx", ".ckpt", ".pt", ".pth", ".safetensors")
# TensorFlow's checkpoints (``ckpt-1.index``, ``ckpt-1.data-00000-of-00001`` and the ``checkpoint``
# index file) and SavedModels (``saved_model.pb`` and its ``variables/``).
MODEL_NAMES = re.compile(r"checkpoint|saved_model\.pb(txt)?|fingerprint\.pb|.+\.index|.+\.data-\d+-of-\d+")
MAX_TRACKED_BYTES = 10_000_000


def is_model_file(path: str) -> bool:
    """Whether the repository path ``path`` is a model, its weights or a checkpoint."""
    *folders, name = path.split("/")
    return (name.lower().endswith(MODEL_SUFFIXES) or bool(MODEL_NAMES.fullmatch(name))
            or (folders[-1:] == ["variables"] and name.startswith("variables.")))


def _git(*args) -> str:
    """The output of ``git args`` in the project's own checkout; skips outside one (an sdist, a
    Bazel sandbox, a copy without git)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if top.returncode != 0 or top.stdout.strip() != str(PROJECT_ROOT.resolve()):
        pytest.skip(f"{PROJECT_ROOT} is not a git checkout of its own")
    return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout


def test_model_files_are_tracked_only_as_test_fixtures():
    tracked = _git("ls-files", "-z").split("\0")
    assert len(tracked) > 100  # the listing really is the repository's
    assert any(is_model_file(path) for path in tracked if path.startswith(FIXTURES))  # the rule sees the fixtures
    assert [path for path in tracked if is_model_file(path) and not path.startswith(FIXTURES)] == []


@pytest.mark.parametrize("path,model", [
    ("model.keras", True), ("export/1/saved_model.pb", True), ("export/1/variables/variables.index", True),
    ("export/1/variables/variables.data-00000-of-00001", True), ("run/checkpoints/checkpoint", True),
    ("run/checkpoints/ckpt-3.index", True), ("weights.H5", True), ("model_int8.tflite", True),
    ("docs/index.md", False), ("sa_conv/serving.py", False), ("tests/test_export.py", False),
    ("benchmarks/results/serving.json", False), ("trainers/checkpoints.py", False)])
def test_what_counts_as_a_model_file(path, model):
    assert is_model_file(path) == model


def test_the_files_tracked_at_head_total_at_most_10_mb():
    """Blob sizes at HEAD (what a clone checks out), ``git ls-tree -l`` (a submodule has none)."""
    sizes = [int(line.split()[3]) for line in _git("ls-tree", "-r", "-l", "HEAD").splitlines()
             if line.split()[3] != "-"]
    assert len(sizes) > 100
    assert sum(sizes) <= MAX_TRACKED_BYTES, f"{sum(sizes) / 1e6:.1f} MB tracked at HEAD"
