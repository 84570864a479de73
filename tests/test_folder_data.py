"""Your own images: ``--dataset=folder:PATH`` (`trainers.image_files`, `trainers.data.FolderSource`)
and ``--image_size``: headers read before decoding, corrupt and non-image files skipped and counted,
streaming tf.data at the chosen size, and a generated folder that trains, evaluates, exports and
serves with its class names."""

import io
import json
import os
import struct

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers import data as data_lib
from trainers import image_files
from tests import image_formats
from sa_conv.errors import DatasetError

CLASSES = ("cat", "dog", "zebra")


def _image(rng, height, width, label):
    """A class-dependent image: the class's colour plus noise (learnable in a few steps)."""
    colour = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200]][label], np.float32)
    return np.clip(colour + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)


def _bmp(image):
    """A 24-bit bottom-up BMP (written by hand: TensorFlow encodes no BMP)."""
    height, width, _ = image.shape
    row = (width * 3 + 3) // 4 * 4
    pixels = b"".join(image[y, :, ::-1].tobytes().ljust(row, b"\0") for y in range(height - 1, -1, -1))
    header = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return header + info + pixels


def _write(path, blob):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)


def make_folder(root, per_class=12, seed=0, splits=None):
    """Mixed-size JPEG and PNG images (plus one BMP and one GIF per class) and, per split, five bad
    files: a truncated JPEG, random bytes named .png, a PNG header announcing 10^10 pixels, a
    .txt file and an empty .jpg. Returns ``{reason: count}`` of the bad files planted."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    planted = {}
    for split in splits or [None]:
        base = os.path.join(root, split) if split else root
        for label, name in enumerate(CLASSES):
            for i in range(per_class):
                height, width = int(rng.integers(12, 60)), int(rng.integers(12, 60))
                image = _image(rng, height, width, label)
                if i % 2:
                    _write(os.path.join(base, name, f"{i}.jpg"), tf.io.encode_jpeg(image, quality=95).numpy())
                else:
                    _write(os.path.join(base, name, f"{i}.png"), tf.io.encode_png(image).numpy())
            _write(os.path.join(base, name, "bitmap.bmp"), _bmp(_image(rng, 20, 30, label)))
            gif = io.BytesIO()
            Image.fromarray(_image(rng, 24, 18, label)).save(gif, format="GIF")
            _write(os.path.join(base, name, "frame.gif"), gif.getvalue())
        jpeg = tf.io.encode_jpeg(_image(rng, 40, 40, 0)).numpy()
        _write(os.path.join(base, "cat", "truncated.jpg"), jpeg[: len(jpeg) // 2])
        _write(os.path.join(base, "dog", "noise.png"), rng.integers(0, 256, 500, dtype=np.uint8).tobytes())
        huge = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 100_000, 100_000) + b"\0" * 20
        _write(os.path.join(base, "dog", "huge.png"), huge)
        _write(os.path.join(base, "zebra", "notes.txt"), b"not an image")
        _write(os.path.join(base, "zebra", "empty.jpg"), b"")
        for reason, count in (("corrupt (does not decode)", 1), ("not a readable PNG/JPEG/BMP/GIF header", 2),
                              ("more than 40,000,000 pixels", 1), ("not an image file (by extension)", 1)):
            planted[reason] = planted.get(reason, 0) + count
    return planted


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("photos"))
    return root, make_folder(root)


# ------------------------------------------------------------------------------ headers


@settings(max_examples=30, deadline=None)
@given(height=st.integers(1, 70), width=st.integers(1, 70), fmt=st.sampled_from(["png", "jpeg", "bmp"]))
def test_header_size_reads_every_format_without_decoding(height, width, fmt, tmp_path_factory):
    image = np.zeros((height, width, 3), np.uint8)
    blob = {"png": lambda: tf.io.encode_png(image).numpy(), "jpeg": lambda: tf.io.encode_jpeg(image).numpy(),
            "bmp": lambda: _bmp(image)}[fmt]()
    path = str(tmp_path_factory.mktemp("h") / f"x.{fmt}")
    _write(path, blob)
    assert image_files.header_size(path) == (fmt, height, width)


FORMATS = image_formats.files()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_decodes_to_its_pixels_and_reads_its_size_from_the_header(name, tmp_path):
    """Grayscale, palette, RGBA, 16-bit, CMYK: the pixels another decoder (Pillow) reads, to the
    rounding of a JPEG decoder; the size from the header, as a file and as a graph (serving's)."""
    blob, want = FORMATS[name]
    path = str(tmp_path / image_formats.file_name(name))
    _write(path, blob)
    assert image_files.header_size(path) == (name.split("_")[0], image_formats.HEIGHT, image_formats.WIDTH)
    assert tuple(image_files.encoded_size(tf.constant(blob)).numpy()) == (image_formats.HEIGHT, image_formats.WIDTH)
    got = image_files.decode(path).numpy()
    assert got.shape == want.shape and got.dtype == np.uint8
    if name.startswith("jpeg"):  # two libjpeg builds: IDCT and chroma upsampling round differently
        difference = np.abs(got.astype(int) - want)
        assert difference.mean() < 2 and difference.max() <= 16
    else:
        np.testing.assert_array_equal(got, want)
    if name.startswith(("bmp", "gif")):  # TensorFlow decodes these as RGB only: converted after
        np.testing.assert_array_equal(image_files.decode(tf.constant(blob), channels=1, from_bytes=True).numpy(),
                                      tf.image.rgb_to_grayscale(got).numpy())
        assert (image_files.decode(path, channels=4).numpy() == np.dstack([got, np.full(got.shape[:2], 255)])).all()


def test_a_bmp_of_a_depth_the_decoder_cannot_read_is_skipped_with_its_reason(tmp_path):
    for name, (blob, _) in FORMATS.items():
        _write(str(tmp_path / "one" / image_formats.file_name(name)), blob)
    _write(str(tmp_path / "one" / "bits.bmp"), image_formats.one_bit_bmp())
    with pytest.raises(ValueError, match="BMP of 1 bits per pixel"):
        image_files.header_size(str(tmp_path / "one" / "bits.bmp"))
    scan = image_files.scan_folder(str(tmp_path), 16, data_lib.resize_and_crop)
    assert len(scan.splits["train"]) == len(FORMATS)
    assert {k: len(v) for k, v in scan.skipped.items()} == {
        "BMP of a depth other than 8, 24, 32 bits per pixel": 1}


def test_corrupt_files_are_counted_in_the_summary_without_a_decoder_line_each(tmp_path, capfd):
    """TensorFlow's JPEG decoder prints an error line per truncated file (from C++, on file
    descriptor 2); the scan holds those back and counts the files."""
    rng = np.random.default_rng(0)
    for i in range(3):
        image = _image(rng, 30, 30, 0)
        _write(str(tmp_path / "cat" / f"{i}.png"), tf.io.encode_png(image).numpy())
        jpeg = tf.io.encode_jpeg(image).numpy()
        _write(str(tmp_path / "cat" / f"cut{i}.jpg"), jpeg[: len(jpeg) // 2])
        png = tf.io.encode_png(image).numpy()
        _write(str(tmp_path / "cat" / f"cut{i}.png"), png[: len(png) // 2])
    capfd.readouterr()
    scan = image_files.scan_folder(str(tmp_path), 16, data_lib.resize_and_crop)
    err = capfd.readouterr().err
    assert len(scan.splits["train"]) == 3 and len(scan.skipped["corrupt (does not decode)"]) == 6
    assert "Premature end" not in err and "jpeg" not in err.lower(), err
    assert scan.skipped_summary().startswith("skipped 6 files: 6 corrupt (does not decode)")


def test_header_size_refuses_what_is_not_an_image(tmp_path):
    for name, blob in {"a.png": b"\x89PNG\r\n", "b.jpg": b"\xff\xd8\xff", "c.gif": b"GIF89a", "d.bin": b"hello"}.items():
        _write(str(tmp_path / name), blob)
        with pytest.raises(ValueError):
            image_files.header_size(str(tmp_path / name))


# ------------------------------------------------------------------------------ resizing


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80), st.integers(1, 80), st.integers(1, 48), st.booleans())
def test_resize_and_crop_gives_the_size_asked_for_any_input(height, width, size, training):
    image = tf.constant(np.random.default_rng(0).integers(0, 256, (height, width, 3)), tf.uint8)
    out = data_lib.resize_and_crop(image, size, training, tf.constant([1, 2], tf.int64) if training else None)
    assert out.shape == (size, size, 3) and out.dtype == tf.uint8


def test_resize_and_crop_scales_the_shorter_side_and_centers():
    """A 20x40 image at 10: resized to 10x20, and the center crop is its columns 5..15."""
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, 10:30] = 255  # the central half, white
    out = data_lib.resize_and_crop(tf.constant(image), 10).numpy()
    assert out.shape == (10, 10, 3) and out[:, 1:-1].min() == 255  # the white band, centered
    assert out.min() > 128  # an off-center crop would reach the black sides (antialiasing blurs the edge)
    same = np.random.default_rng(1).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    np.testing.assert_array_equal(data_lib.resize_and_crop(tf.constant(same), 16).numpy(), same)
    seed = tf.constant([3, 4], tf.int64)
    first = data_lib.resize_and_crop(tf.constant(image), 10, True, seed).numpy()
    np.testing.assert_array_equal(first, data_lib.resize_and_crop(tf.constant(image), 10, True, seed).numpy())
    crops = {data_lib.resize_and_crop(tf.constant(image), 10, True, tf.constant([s, 0], tf.int64)).numpy().tobytes()
             for s in range(20)}
    assert len(crops) > 3  # random crops along the longer side, and flips


# ------------------------------------------------------------------------------ scanning


def test_scan_keeps_the_images_and_counts_each_bad_file(folder):
    root, planted = folder
    logs = []
    data = data_lib.load_dataset(f"folder:{root}", seed=0, image_size=16, log=logs.append)
    assert data.label_names == CLASSES
    total = len(data.train) + len(data.test)
    assert total == 3 * (12 + 2)  # every JPEG, PNG, BMP and GIF; none of the bad files
    assert len(data.test) == round(0.1 * total) and data.validation is None
    assert all(p.endswith((".png", ".jpg", ".bmp", ".gif")) for p in data.train.paths + data.test.paths)
    note = data.notes[0]
    assert note.startswith(f"folder:{root}: 3 classes") and "at 16x16" in note
    for reason, count in planted.items():
        assert f"{count} {reason}" in note
    assert "skipped 5 files" in note


def test_statistics_are_those_of_the_center_crops(folder):
    root, _ = folder
    data = data_lib.load_dataset(f"folder:{root}", seed=0, image_size=16)
    crops = np.concatenate([b for b, _ in data_lib.make_dataset(data.train, 7, training=False).as_numpy_iterator()])
    assert crops.shape == (len(data.train), 16, 16, 3)
    mean, std = data_lib.channel_statistics(crops)
    fields = data.model_fields()
    assert fields["image_size"] == 16 and fields["num_classes"] == 3
    np.testing.assert_allclose(fields["pixel_mean"], mean, atol=1e-6)
    np.testing.assert_allclose(fields["pixel_std"], std, atol=1e-6)


def test_the_folder_streams_with_random_crops_in_training(folder):
    root, _ = folder
    data = data_lib.load_dataset(f"folder:{root}", seed=0, image_size=16)
    a = list(data_lib.make_dataset(data.train, 8, training=True, seed=5).as_numpy_iterator())
    b = list(data_lib.make_dataset(data.train, 8, training=True, seed=5).as_numpy_iterator())
    c = list(data_lib.make_dataset(data.train, 8, training=True, seed=6).as_numpy_iterator())
    assert len(a) == len(data.train) // 8 and a[0][0].shape == (8, 16, 16, 3) and a[0][0].dtype == np.uint8
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(xa, xc) for (xa, _), (xc, _) in zip(a, c))
    labels = np.concatenate([y for _, y in a])
    assert set(labels) <= {0, 1, 2}


def test_split_folders_are_used_as_given(tmp_path):
    make_folder(str(tmp_path), per_class=4, splits=["train", "validation", "test"])
    data = data_lib.load_dataset(f"folder:{tmp_path}", image_size=8)
    assert (len(data.train), len(data.validation), len(data.test)) == (18, 18, 18)
    assert all("/validation/" in p for p in data.validation.paths)
    assert all("/test/" in p for p in data.test.paths)


def test_a_run_on_a_relative_folder_is_found_from_another_directory(tmp_path, monkeypatch):
    """config.json records where the data is, absolute: the export's checks (and sa-conv-visualize)
    read the run's images wherever they run; a run recorded without it says why they are generated."""
    from export import verify
    from trainers import run_files
    from trainers import train as train_lib
    from trainers.config import make_config

    make_folder(str(tmp_path / "work" / "data"), per_class=4, splits=["train", "test"])
    monkeypatch.chdir(tmp_path / "work")
    train_lib.train(make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, hidden_size=8, mlp_size=8, num_heads=4, dataset="folder:data",
        image_size=8, global_batch_size=6, eval_batch_size=6, epochs=1, max_steps=1, strategy="one_device",
        model_dir="run")), log=lambda s: None)
    config = run_files.read_config("run")
    assert config["data_location"] == {"dataset": f"folder:{tmp_path / 'work' / 'data'}", "data_dir": None}
    monkeypatch.chdir(tmp_path)
    images, source = verify.verification_images({"train_config": config}, (8, 8, 3))
    assert source == "test images" and images.shape == (16, 8, 8, 3)
    from programs import visualize

    assert visualize.write_augmented("work/run", 2, str(tmp_path / "aug"), log=lambda s: None).endswith(".png")
    del config["data_location"]
    images, source = verify.verification_images({"train_config": config}, (8, 8, 3))
    assert source == "generated images (the run's data, folder:data, is not readable here)"


def test_the_trainer_says_which_data_settings_a_folder_leaves_unused(tmp_path):
    from trainers.config import make_config
    from trainers.task import Task

    make_folder(str(tmp_path / "d"), per_class=4, splits=["train", "validation", "test"])
    settings = dict(dataset=f"folder:{tmp_path / 'd'}", image_size=8, global_batch_size=6, eval_batch_size=6)
    logs = []
    task = Task(make_config(overrides=dict(settings, validation_size=5, data_dir=str(tmp_path))), log=logs.append)
    assert len(task.val_split) == 18  # the folder's validation/, not 5 held out of train/
    assert f"--data_dir={tmp_path} is unused: --dataset=folder:{tmp_path / 'd'} does not read it." in logs
    assert "--validation_size=5 is unused: the data has its own validation split (18 images)." in logs
    logs.clear()
    Task(make_config(overrides=settings), log=logs.append)
    assert not [line for line in logs if "unused" in line]
    logs.clear()
    Task(make_config(overrides=dict(dataset="synthetic", validation_size=5, data_dir=str(tmp_path))), log=logs.append)
    assert [line for line in logs if "unused" in line] == [
        f"--data_dir={tmp_path} is unused: --dataset=synthetic does not read it."]  # its validation split is drawn


@pytest.mark.parametrize("layout,message", [
    ({"train/cat/a.txt": b"x", "test/dog/b.txt": b"x"}, "classes \\['dog'\\] that"),
    ({"validation/cat/a.txt": b"x"}, "no train/ folder"),
    ({"train/cat/a.txt": b"x", "extra/b.txt": b"x"}, "mixes split folders"),
    ({"a.txt": b"x"}, "no class subfolders"),
    ({"cat/a.txt": b"x"}, "has no readable images"),
])
def test_bad_layouts_name_the_problem(tmp_path, layout, message):
    for name, blob in layout.items():
        _write(str(tmp_path / name), blob)
    with pytest.raises(DatasetError, match=message):
        data_lib.load_dataset(f"folder:{tmp_path}", image_size=8)


def test_a_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="no such directory"):
        data_lib.load_dataset(f"folder:{tmp_path / 'nope'}")


def test_in_memory_data_resizes_to_image_size():
    data = data_lib.make_synthetic(num_train=20, num_test=10)
    (x, _), = data_lib.make_dataset(data.test, 10, training=False, image_size=48).as_numpy_iterator()
    assert x.shape == (10, 48, 48, 3)
    upsampled = tf.image.resize(data.test.images, (48, 48), antialias=True).numpy()
    np.testing.assert_allclose(x, np.clip(np.round(upsampled), 0, 255), atol=1)
    (t, _), = data_lib.make_dataset(data.train, 20, training=True, image_size=48, seed=1).as_numpy_iterator()
    assert t.shape == (20, 48, 48, 3)
    assert data.model_fields(48)["image_size"] == 48


# ------------------------------------------------------------------------------ end to end


def test_visualize_takes_a_runs_test_images_from_the_split_its_seed_held_out(folder, tmp_path):
    """A folder without test/ holds out its test images by the run's --seed: image i of a seed-5 run
    is that run's test image, not seed 0's (which that run may have trained on)."""
    from programs import visualize
    from trainers import run_files

    root, _ = folder
    run = tmp_path / "run"
    run.mkdir()
    (run / run_files.CONFIG).write_text(json.dumps({"dataset": f"folder:{root}", "seed": 5}))
    images, _ = visualize.load_images("0,1,2", None, None, str(run), (16, 16, 3))
    held_out = {seed: data_lib.head(data_lib.load_dataset(f"folder:{root}", seed=seed, image_size=16).test, 3)
                for seed in (0, 5)}
    np.testing.assert_array_equal(images, held_out[5])
    assert not np.array_equal(held_out[0], held_out[5])  # the two seeds hold out other images


@pytest.mark.slow
def test_a_search_on_a_folder_trains_at_image_size(folder, tmp_path):
    """The search loads the folder as its trials train it: scanned at ``--image_size``."""
    import csv

    from trainers import tune as tune_lib
    from trainers.config import make_config

    root, _ = folder
    base = make_config(overrides=dict(dataset=f"folder:{root}", image_size=16, global_batch_size=8, eval_batch_size=8,
                                      validation_size=4, epochs=1, strategy="one_device", mixed_precision="float32"))
    config = tune_lib.TuneConfig(tuner="random", max_trials=1, max_epochs=1, search_space="tiny",
                                 directory=str(tmp_path), project_name="p")
    summary = tune_lib.tune(config, base, log=lambda s: None)
    with open(tmp_path / "p" / "trials.csv") as f:
        [row] = list(csv.DictReader(f))
    assert float(row["objective"]) >= 0 and summary["best"]["trial_id"] == row["trial_id"]


@pytest.mark.slow
def test_a_folder_trains_evaluates_exports_and_serves_with_class_names(folder, tmp_path):
    from export import export as export_lib
    from trainers import train as train_lib
    from trainers.config import make_config

    root, _ = folder
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, hidden_size=24, mlp_size=24, num_heads=4, dataset=f"folder:{root}",
        image_size=16, global_batch_size=8, eval_batch_size=8, validation_size=4, epochs=3, strategy="one_device",
        dropout=0.0, learning_rate=0.05, model_dir=str(tmp_path / "run")))
    logs = []
    results = train_lib.train(config, log=logs.append)
    assert any("skipped 5 files" in line for line in logs)
    assert results["label_names"] == list(CLASSES)
    assert results["test_accuracy"] >= 0.6  # colours: learnable in three epochs; chance is 1/3
    version = export_lib.export(model_dir=str(tmp_path / "run"), export_dir=str(tmp_path / "out"),
                                log=lambda s: None)
    meta = json.load(open(os.path.join(version, "assets.extra", "metadata.json")))
    assert meta["class_names"] == list(CLASSES)
    assert meta["verification"]["images"].endswith("test images")  # the folder's own, at 16x16
    served = tf.saved_model.load(version).signatures["predict_encoded"]
    rng = np.random.default_rng(9)
    blobs = [tf.io.encode_jpeg(_image(rng, 30, 70, 2), quality=95).numpy(), tf.io.encode_png(_image(rng, 50, 20, 0)).numpy()]
    out = served(image_bytes=tf.constant(blobs))
    assert [n.decode() for n in out["class_names"].numpy()] == ["zebra", "cat"]
    # sa-conv-visualize reads the run's test images by index, at its 16x16, as evaluation crops them.
    from programs import visualize

    images, names = visualize.load_images("0,2", None, None, str(tmp_path / "run"), (16, 16, 3))
    test = data_lib.load_dataset(f"folder:{root}", seed=0, image_size=16).test
    np.testing.assert_array_equal(images, data_lib.head(test, 3)[[0, 2]])
    assert [name.split(" (")[1].rstrip(")") for name in names] == [CLASSES[int(test.labels[i])] for i in (0, 2)]
