"""Untrusted input: dataset files never run code, and oversized files are refused unread."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest

from sa_conv import data


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
