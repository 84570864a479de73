"""`pip install sa-conv` gives the layers (Keras + NumPy, any backend) without the training,
search and plotting dependencies, which are extras. Runs in both virtualenvs: the main one
(everything installed) and the backends one (``make test-backends``: the layers-only install
plus JAX and PyTorch, no TensorFlow), where the last test checks the packages are really absent."""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT

# What the layers must not need: training data, search, plots, config files, TensorBoard.
TRAINING_ONLY = ("tensorflow_datasets", "keras_tuner", "sklearn", "matplotlib", "yaml", "tensorboard")
DISTRIBUTIONS = {"tensorflow-datasets", "keras-tuner", "scikit-learn", "scipy", "matplotlib", "pyyaml", "tensorboard"}


def _requirements():
    """(name, extra or None) of every requirement in the installed sa-conv's metadata."""
    found = []
    for line in importlib.metadata.requires("sa-conv") or []:
        name = re.match(r"[A-Za-z0-9_.\-]+", line).group(0).lower().replace("_", "-")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", line)
        found.append((name, extra.group(1) if extra else None))
    return found


def test_the_plain_install_requires_keras_and_numpy_only():
    assert sorted(name for name, extra in _requirements() if extra is None) == ["keras", "numpy"]


def test_training_search_and_plots_are_extras():
    extras = {}
    for name, extra in _requirements():
        if extra:
            extras.setdefault(extra, set()).add(name)
    assert {"tensorflow-datasets", "absl-py", "pyyaml"} <= extras["train"]
    assert {"keras-tuner", "tensorboard", "scipy", "scikit-learn"} <= extras["search"]
    assert extras["plots"] == {"matplotlib"}
    assert {"pandas", "tabulate"} <= extras["benchmarks"] and not {"pandas", "tabulate"} & extras["all"]
    assert DISTRIBUTIONS <= extras["all"]  # what `make` installs, with cpu and test
    assert not any("tensorflow" == n or n.startswith("tensorflow-cpu") for n in extras["all"])  # cpu or gpu decides


def _installed_closure(names):
    """``names`` and every distribution they require, transitively, as far as they are installed."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower().replace("_", "-")
                 for r in requires if "extra" not in r]
    return seen


@pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="needs the main venv, where every extra is installed")
def test_the_test_extra_pulls_none_of_the_training_dependencies():
    """``make test-backends`` installs ``.[test]`` as the layers-only venv: whatever the test extra
    pulls in, transitively, lands there. (scipy comes with JAX in that venv anyway.) NNCF, which
    needs scikit-learn, belongs to the ``openvino`` extra for that reason."""
    test_extra = [name for name, extra in _requirements() if extra == "test"]
    assert _installed_closure(test_extra) & (DISTRIBUTIONS - {"scipy"}) == set()
    assert "scikit-learn" in _installed_closure(["nncf"])  # the closure follows requirements


def _site_packages_without(blocked, into):
    """A directory of links to everything in this interpreter's site-packages except the
    top-level packages ``blocked`` (and their metadata): those packages, as if not installed."""
    import keras

    site = pathlib.Path(keras.__file__).resolve().parents[1]
    into.mkdir()
    prefixes = tuple(b.lower() for b in blocked) + ("pyyaml", "scikit_learn")
    for entry in site.iterdir():
        if not entry.name.lower().startswith(prefixes) and not entry.name.endswith(".pth"):
            (into / entry.name).symlink_to(entry)
    return into


def test_importing_and_using_the_layers_needs_no_training_dependency(tmp_path):
    """In a fresh process that sees this interpreter's packages except the training, search and
    plotting ones (as after ``pip install sa-conv``): import sa_conv, build the paper's model at
    a small size with the reference's content encoding, run it, save and reload it."""
    site = _site_packages_without(TRAINING_ONLY, tmp_path / "site")
    script = f"""
import importlib.util, json, sys
import numpy as np
import keras
import sa_conv
model = sa_conv.build_model("sa_content_plus_learned_bias_small", num_layers=1)
x = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("float32")
y = keras.ops.convert_to_numpy(model(x))
path = {str(tmp_path / "m.keras")!r}
model.save(path)
z = keras.ops.convert_to_numpy(keras.models.load_model(path)(x))
print(json.dumps({{"close": bool(np.allclose(y, z, atol=1e-5)), "shape": list(y.shape),
                  "installed": sorted(m for m in {TRAINING_ONLY!r} if importlib.util.find_spec(m))}}))
"""
    # -S: no site-packages but the filtered one (and no .pth files); the project from its source.
    out = subprocess.run([sys.executable, "-S", "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{PROJECT_ROOT}{os.pathsep}{site}"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"close": True, "shape": [2, 10], "installed": []}


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="runs in the layers-only venv (make test-backends), which has no TensorFlow")
def test_the_layers_only_venv_has_none_of_the_training_dependencies():
    """The backends venv installs ``-e '.[test]'`` plus JAX and PyTorch: had the plain install
    pulled the training stack, it would be here. (scipy comes with JAX itself.)"""
    present = [m for m in TRAINING_ONLY if importlib.util.find_spec(m) is not None]
    assert present == []


def test_every_library_module_imports_without_tensorflow_on_another_backend():
    """Under JAX or PyTorch (``make test-backends``), every module of ``sa_conv`` imports and
    TensorFlow is not loaded: the library has no TensorFlow-only module. (`sa_conv.plotting`,
    which needs matplotlib, is left out.)"""
    import keras

    if keras.backend.backend() == "tensorflow":
        pytest.skip("runs under the other backends (make test-backends)")
    script = """
import importlib, json, pkgutil, sys
import sa_conv
names = [m.name for m in pkgutil.walk_packages(sa_conv.__path__, "sa_conv.")
         if m.name != "sa_conv.plotting"]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": len(names), "tensorflow": "tensorflow" in sys.modules}))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["modules"] >= 25 and result["tensorflow"] is False
