"""Property-based tests of the input boundaries: whatever the bytes, settings or requests, the
outcome is a result or the documented error type with a message, never another exception.
Each test's ``max_examples`` is the number of generated cases it runs."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainers import cli, data
from sa_conv.errors import ConfigError, DatasetError

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_batch(n=3):
    rows = np.arange(n * 3072, dtype=np.int64).astype(np.uint8).reshape(n, 3072)
    return pickle.dumps({b"data": rows, b"labels": list(range(n)), b"batch_label": b"b"}, protocol=2)


def _parse(blob):
    try:
        split = data.parse_batch(blob, "fuzzed")
    except DatasetError as exc:
        assert "fuzzed" in str(exc) or "CIFAR" in str(exc)
        return None
    assert split.images.dtype == np.uint8 and split.images.shape[1:] == (32, 32, 3)
    assert split.labels.min(initial=0) >= 0 and split.labels.max(initial=0) <= 9
    return split


@FAST
@given(st.integers(min_value=0, max_value=len(_valid_batch()) - 1))
def test_truncated_batch_files(cut):
    assert _parse(_valid_batch()[:cut]) is None


@FAST
@given(st.lists(st.tuples(st.integers(0, len(_valid_batch()) - 1), st.integers(0, 7)), min_size=1, max_size=8))
def test_bit_flipped_batch_files(flips):
    blob = bytearray(_valid_batch())
    for offset, bit in flips:
        blob[offset] ^= 1 << bit
    _parse(bytes(blob))


def test_a_corrupt_memo_index_is_refused_without_growing_the_memo():
    """A bit flip that turns a memo write into a long one with a large index (the index of a
    ``LONG_BINPUT``) made the unpickler allocate and fill a memo of that size (21 GB, killed by
    the kernel): the file is refused as corrupt, allocating nothing of that size."""
    import struct
    import tracemalloc

    blob = bytearray(_valid_batch())
    put = blob.index(pickle.BINPUT)  # the first memo write: BINPUT <1-byte index>
    blob[put: put + 2] = pickle.LONG_BINPUT + struct.pack("<I", 2 ** 24)
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match="truncated or corrupt"):
            data.parse_batch(bytes(blob), "fuzzed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 ** 24  # the memo alone would be 8 bytes a slot, 2 ** 25 slots


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=5),
    st.binary(max_size=5), st.lists(st.integers(-20, 20), max_size=5),
    st.builds(lambda shape, dtype: np.zeros(shape, dtype),
              st.lists(st.integers(0, 4), max_size=3).map(tuple),
              st.sampled_from([np.uint8, np.int64, np.float32, np.bool_])),
)


@FAST
@given(st.dictionaries(st.sampled_from([b"data", b"labels", b"batch_label", "data", "labels", b"extra"]),
                       _VALUES, max_size=5))
def test_batch_dicts_of_wrong_keys_types_and_shapes(entries):
    _parse(pickle.dumps(entries, protocol=2))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                                 "test_batch", "batches.meta", "junk"]), max_size=9),
       st.sampled_from(["valid", "empty", "garbage"]))
def test_archives_with_missing_duplicated_or_bad_members(members, content):
    blob = {"valid": _valid_batch(), "empty": b"", "garbage": b"\x80\x02garbage"}[content]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i, name in enumerate(members):
            info = tarfile.TarInfo(f"d{i % 2}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fuzz-{os.getpid()}.tar.gz")
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    try:
        loaded = data.load_cifar10_files(path)
        assert len(loaded.train) == 15 and len(loaded.test) == 3
    except DatasetError:
        pass
    finally:
        os.remove(path)


# ------------------------------------------------------------------ settings and flags

_SETTING_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                            st.text(max_size=8), st.lists(st.integers(), max_size=3))


def _config_types():
    from export.export import ExportConfig
    from trainers.config import TrainConfig
    from trainers.tune import TuneConfig
    from programs.visualize import VisualizeConfig

    return [TrainConfig, TuneConfig, ExportConfig, VisualizeConfig]


@pytest.mark.parametrize("index", range(4))
def test_program_settings(index):
    config_cls = _config_types()[index]
    names = cli.field_names(config_cls) + ["unknown_key", "epoch"]

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(names), _SETTING_VALUES, max_size=4))
    def check(values):
        try:
            cli.make(config_cls, values)
        except ConfigError as exc:
            assert str(exc)

    check()


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"hyperparameters": st.lists(st.dictionaries(
    st.sampled_from(["name", "type", "values", "value", "min", "max", "step", "sampling"]),
    st.one_of(st.sampled_from(["num_layers", "encoding", "learning_rate", "choice", "int", "float", "fixed",
                               "log", "linear", "bogus"]),
              st.integers(-3, 5), st.floats(-1, 1), st.lists(st.integers(0, 3), max_size=3), st.none())),
    max_size=3)}, optional={"base_model": st.sampled_from(["sa_quadratic_small", "resnet18", "nope"])}))
def test_search_spaces(space):
    from trainers.tune import load_search_space

    try:
        load_search_space(space)
    except ConfigError as exc:
        assert str(exc)


# ------------------------------------------------------------------ serving


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import tensorflow as tf

    import sa_conv
    from export.export import export

    directory = tmp_path_factory.mktemp("served")
    model = sa_conv.build_model("sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16)
    model.save(directory / "m.keras")
    version = export(model_path=str(directory / "m.keras"), export_dir=str(directory / "exported"),
                     max_image_pixels=64 * 64, max_batch_size=8, log=lambda s: None)
    return tf.saved_model.load(version).signatures


_MAGIC = st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"BM"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_MAGIC, st.binary(max_size=64)), min_size=0, max_size=3))
def test_serving_random_bytes(served, blobs):
    import tensorflow as tf

    request = tf.constant([magic + body for magic, body in blobs], dtype=tf.string)
    try:
        out = served["predict_encoded"](image_bytes=request)
        assert out["probabilities"].shape == (len(blobs), 10)
    except tf.errors.InvalidArgumentError as exc:
        assert exc.message


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10), st.integers(-40, 40), st.integers(-40, 40))
def test_serving_batches_and_query_pixels(served, batch, row, col):
    import tensorflow as tf

    images = tf.zeros((batch, 32, 32, 3), tf.uint8)
    try:
        out = served["attention_maps"](images=images, query_pixel=tf.constant([row, col], tf.int32))
        assert 1 <= batch <= 8 and 0 <= row < 16 and 0 <= col < 16
        assert out["attention"].shape == (batch, 1, 9, 16, 16)
    except tf.errors.InvalidArgumentError as exc:
        assert not (1 <= batch <= 8 and 0 <= row < 16 and 0 <= col < 16), exc.message


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("latin-1"))),
       st.sampled_from([".json", ".yaml"]))
def test_config_files_of_any_text(text, suffix):
    from trainers.config import read_config_file

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fuzz-{os.getpid()}{suffix}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        values = read_config_file(path)
        assert isinstance(values, dict)
    except ConfigError as exc:
        assert path in str(exc)
    finally:
        os.remove(path)
