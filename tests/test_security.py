"""Untrusted input: dataset files never run code, and oversized files are refused unread."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest

from trainers import data


class _Reduce:
    """Pickles as ``func(*args)``: what a malicious batch file would contain."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _attacks(marker):
    import builtins
    import posix
    import subprocess

    touch = f"touch {marker}"
    return {
        "os.system": _Reduce(os.system, (touch,)),
        "posix.system": _Reduce(posix.system, (touch,)),
        "builtins.eval": _Reduce(builtins.eval, (f"open({str(marker)!r}, 'w').close()",)),
        "subprocess.Popen": _Reduce(subprocess.Popen, (["touch", str(marker)],)),
        # A reduce nested inside an otherwise valid batch dict.
        "nested": {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"batch_label": _Reduce(os.system, (touch,))},
    }


@pytest.mark.parametrize("attack", ["os.system", "posix.system", "builtins.eval", "subprocess.Popen", "nested"])
def test_pickles_that_run_code_are_refused_before_running(attack, tmp_path, tiny_cifar):
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_attacks(marker)[attack], protocol=2)
    with pytest.raises(data.DatasetError, match="refused without running it") as info:
        data.parse_batch(blob, "data_batch_1")
    assert "data_batch_1" in str(info.value)
    assert not marker.exists()
    # The same through the whole loader: as a batch file, as batches.meta, and inside a .tar.gz.
    path, written = tiny_cifar
    for name in ("data_batch_2", "batches.meta"):
        directory = tmp_path / name / "cifar-10-batches-py"
        directory.mkdir(parents=True)
        for f in os.listdir(path):
            (directory / f).write_bytes((open(os.path.join(path, f), "rb").read()))
        (directory / name).write_bytes(blob)
        with pytest.raises(data.DatasetError, match=f"{name}.*refused without running it"):
            data.load_dataset("cifar10_files", str(directory))
        archive = tmp_path / name / "cifar-10-python.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(directory, arcname="cifar-10-batches-py")
        with pytest.raises(data.DatasetError, match=f"{name}.*refused without running it"):
            data.load_dataset("cifar10", str(archive))
    assert not marker.exists()


def test_the_global_named_in_the_refusal():
    with pytest.raises(data.DatasetError, match=r"asks for (posix|os)\.system"):
        data.safe_unpickle(pickle.dumps(_Reduce(os.system, ("true",)), protocol=2), "f")


def test_official_pickles_still_load(tiny_cifar):
    # Protocols 2 (the official files') to 5, numpy arrays and bytes included.
    batch = {b"data": np.arange(3072 * 2, dtype=np.int64).astype(np.uint8).reshape(2, 3072),
             b"labels": [1, 2], b"batch_label": b"training batch 1 of 5", b"filenames": [b"a.png", b"b.png"]}
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        split = data.parse_batch(pickle.dumps(batch, protocol=protocol), "x")
        assert split.labels.tolist() == [1, 2] and split.images.shape == (2, 32, 32, 3)
    assert len(data.load_cifar10_files(tiny_cifar[0]).train) == 250


def test_oversized_files_and_members_are_refused_unread(tmp_path, tiny_cifar, monkeypatch):
    monkeypatch.setattr(data, "MAX_FILE_BYTES", 1000)
    with pytest.raises(data.DatasetError, match="data_batch_1.*far larger than any official CIFAR file"):
        data.load_cifar10_files(tiny_cifar[0])
    archive = data.write_cifar10_files(str(tmp_path), tiny_cifar[1], archive=True)
    with pytest.raises(data.DatasetError, match="far larger"):
        data.load_cifar10_files(archive)


def test_duplicated_archive_members_are_refused(tmp_path, tiny_cifar):
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tiny_cifar[0], arcname="cifar-10-batches-py")
        blob = open(os.path.join(tiny_cifar[0], "test_batch"), "rb").read()
        info = tarfile.TarInfo("other/test_batch")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(data.DatasetError, match="holds 'test_batch' twice"):
        data.load_cifar10_files(str(archive))


# ------------------------------------------------------------------------------ resume


@pytest.mark.slow
def test_unreadable_newest_checkpoint_falls_back_then_stops_without_deleting(tmp_path):
    from trainers.config import make_config
    from trainers.train import TrainingError, train

    def config(epochs):
        return make_config(overrides=dict(
            model="sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16, dataset="synthetic",
            epochs=epochs, global_batch_size=100, eval_batch_size=100, validation_size=100,
            model_dir=str(tmp_path), strategy="one_device", keep_checkpoints=3))

    train(config(2), log=lambda s: None)
    checkpoints = tmp_path / "checkpoints"
    data_files = sorted(checkpoints.glob("ckpt-*.data-*"))
    assert [p.name.split(".")[0] for p in data_files] == ["ckpt-1", "ckpt-2"]
    newest = data_files[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])  # truncated
    logs = []
    results = train(config(3), log=logs.append)
    assert any("ckpt-2" in line and "unreadable" in line for line in logs), logs
    assert results["resumed_from_epoch"] == 1 and results["epochs"] == 3
    before = sorted(p.name for p in checkpoints.iterdir())
    for path in checkpoints.glob("ckpt-*.data-*"):
        path.write_bytes(b"\0" * 10)
    with pytest.raises(TrainingError, match=f"None of the 3 checkpoint\\(s\\) in {checkpoints}.*Nothing was deleted"):
        train(config(4), log=lambda s: None)
    assert sorted(p.name for p in checkpoints.iterdir()) == before


# ------------------------------------------------------------------------------ serving limits

_SERVE = r"""
import io, json, struct, sys
import numpy as np, tensorflow as tf
from PIL import Image

served = tf.saved_model.load(sys.argv[1])
results = {}

def png(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()

def jpeg(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format="JPEG")
    return buffer.getvalue()

def attempt(name, fn):
    try:
        out = fn()
        results[name] = "ok:" + str(out["probabilities"].shape if "probabilities" in out else out["attention"].shape)
    except tf.errors.InvalidArgumentError as exc:
        results[name] = "refused:" + " ".join(exc.message.split())[:1500]

encoded = served.signatures["predict_encoded"]
images = served.signatures["serving_default"]
maps = served.signatures["attention_maps"]
attempt("huge_png", lambda: encoded(image_bytes=tf.constant([png(5000, 4000)])))
attempt("big_jpeg", lambda: encoded(image_bytes=tf.constant([jpeg(120, 100)])))
attempt("small_png_after_refusals", lambda: encoded(image_bytes=tf.constant([png(40, 30)])))
attempt("thin_png", lambda: encoded(image_bytes=tf.constant([png(5000, 1)])))  # 5,000 pixels; 32 x 160,000 resized
attempt("wide_png", lambda: encoded(image_bytes=tf.constant([png(300, 32)])))  # 32 x 300 resized: within
attempt("gif", lambda: encoded(image_bytes=tf.constant([b"GIF89a" + b"\0" * 40])))
attempt("huge_gif", lambda: encoded(image_bytes=tf.constant([b"GIF89a" + struct.pack("<HH", 5000, 4000) + b"\0" * 40])))
attempt("huge_bmp", lambda: encoded(image_bytes=tf.constant([b"BM" + b"\0" * 16 + struct.pack("<iiHH", 5000, -4000, 1, 24)
                                                             + b"\0" * 40])))
attempt("four_bit_bmp", lambda: encoded(image_bytes=tf.constant([b"BM" + b"\0" * 16 + struct.pack("<iiHH", 8, 8, 1, 4)
                                                                 + b"\0" * 40])))
attempt("text", lambda: encoded(image_bytes=tf.constant([b"hello, not an image"])))
attempt("truncated_png", lambda: encoded(image_bytes=tf.constant([png(40, 30)[:20]])))
attempt("batch_5", lambda: images(images=tf.zeros((5, 32, 32, 3), tf.uint8)))
attempt("batch_5_encoded", lambda: encoded(image_bytes=tf.constant([png(8, 8)] * 5)))
attempt("batch_5_maps", lambda: maps(images=tf.zeros((5, 32, 32, 3), tf.uint8), query_pixel=tf.constant([1, 1])))
attempt("batch_4", lambda: images(images=tf.zeros((4, 32, 32, 3), tf.uint8)))
print(json.dumps(results))
"""


def test_an_image_of_the_inputs_own_size_is_served_at_a_limit_of_that_size(tmp_path):
    """--max_image_pixels of the model's input size serves square images up to it, none larger."""
    import io

    import tensorflow as tf
    from PIL import Image

    import sa_conv
    from export.export import ExportError, export

    sa_conv.build_model("sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16).save(tmp_path / "m.keras")
    with pytest.raises(ExportError, match=r"--max_image_pixels=1023 is below the model's input of 32 x 32 = 1024 "
                                          r"pixels: predict_encoded would refuse every image"):
        export(model_path=str(tmp_path / "m.keras"), export_dir=str(tmp_path / "exported"),
               max_image_pixels=32 * 32 - 1, tf_serving_files=False, log=lambda s: None)
    assert not (tmp_path / "exported").exists()  # refused before anything is written
    version = export(model_path=str(tmp_path / "m.keras"), export_dir=str(tmp_path / "exported"),
                     max_image_pixels=32 * 32, tf_serving_files=False, log=lambda s: None)
    encoded = tf.saved_model.load(version).signatures["predict_encoded"]

    def png(width, height):
        buffer = io.BytesIO()
        Image.new("RGB", (width, height)).save(buffer, format="PNG")
        return buffer.getvalue()

    assert encoded(image_bytes=tf.constant([png(32, 32), png(16, 16)]))["probabilities"].shape == (2, 10)
    for (width, height), error in (((33, 32), "image larger than max_image_pixels=1024"),
                                   ((32, 31), "image too elongated")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            encoded(image_bytes=tf.constant([png(width, height)]))


@pytest.mark.slow
def test_serving_limits_hold_in_a_fresh_process(tmp_path):
    import json
    import subprocess
    import sys

    import sa_conv
    from export.export import export
    from tests.conftest import PROJECT_ROOT

    model = sa_conv.build_model("sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16)
    model.save(tmp_path / "m.keras")
    version = export(model_path=str(tmp_path / "m.keras"), export_dir=str(tmp_path / "exported"),
                     max_image_pixels=100 * 100, max_batch_size=4, log=lambda s: None)
    metadata = json.load(open(f"{version}/assets.extra/metadata.json"))
    assert metadata["limits"] == {"max_image_pixels": 10000, "max_batch_size": 4}
    proc = subprocess.run([sys.executable, "-c", _SERVE, version], capture_output=True, text=True, timeout=300,
                          cwd=PROJECT_ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["huge_png"].startswith("refused:") and "max_image_pixels=10000" in results["huge_png"]
    assert results["big_jpeg"].startswith("refused:") and "max_image_pixels=10000" in results["big_jpeg"]
    assert results["small_png_after_refusals"] == "ok:(1, 10)"
    assert results["thin_png"].startswith("refused:") and "image too elongated" in results["thin_png"], results
    assert results["wide_png"] == "ok:(1, 10)"
    assert results["gif"].startswith("refused:") and "empty image" in results["gif"]
    for name in ("huge_gif", "huge_bmp"):  # sizes from the header, a top-down BMP's negative height included
        assert results[name].startswith("refused:") and "max_image_pixels=10000" in results[name], results
    assert results["four_bit_bmp"].startswith("refused:") and "other than 8, 24, 32 bits" in results["four_bit_bmp"]
    assert results["text"].startswith("refused:") and "not a PNG, JPEG, BMP or GIF" in results["text"]
    assert results["truncated_png"].startswith("refused:")
    for name in ("batch_5", "batch_5_encoded", "batch_5_maps"):
        assert results[name].startswith("refused:") and "max_batch_size=4" in results[name], results
    assert results["batch_4"] == "ok:(4, 10)"
