"""Looking inside: query maps, locality metrics, figures, TensorBoard attention summaries."""

import json
import os
import subprocess
import sys

import keras
import matplotlib.image
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import sa_conv
from sa_conv import conversion, inspection, plotting
from sa_conv.attention import MultiHeadSelfAttention2D
from sa_conv.errors import ConfigError
from programs.visualize import write_figures
from tests.conftest import PROJECT_ROOT

RNG = np.random.default_rng(0)


def test_query_map_is_the_right_row_on_a_non_square_grid():
    layer = MultiHeadSelfAttention2D(3, encoding="content_with_relative_keys", max_grid_size=10, seed=1)
    x = RNG.normal(size=(2, 6, 10, 4)).astype(np.float32)
    _, probs = layer(x, return_attention_scores=True)
    probs = ops.convert_to_numpy(probs)
    maps = inspection.query_maps(probs, (6, 10), (4, 7))
    assert maps.shape == (2, 3, 6, 10)
    np.testing.assert_allclose(maps.sum(axis=(-1, -2)), 1.0, atol=1e-5)
    # Row 4 * 10 + 7 of the probabilities, key (r, c) at maps[..., r, c].
    for b, h, r, c in [(0, 0, 0, 9), (1, 2, 5, 0), (1, 1, 3, 4)]:
        assert maps[b, h, r, c] == probs[b, h, 47, r * 10 + c]
    with pytest.raises(ValueError, match="outside the 6x10 attention grid"):
        inspection.query_maps(probs, (6, 10), (6, 0))
    with pytest.raises(ValueError, match="do not fit a 10x6 grid"):
        inspection.query_maps(probs[:, :, :59], (10, 6), (0, 0))


def test_converted_convolution_heads_are_one_hot_and_local():
    conv = keras.layers.Conv2D(4, 3, padding="same")
    conv.build((None, None, None, 2))
    layer = conversion.conv_to_attention(conv).attention
    grid = (9, 11)
    _, probs = layer(RNG.normal(size=(1, *grid, 2)).astype(np.float32), return_attention_scores=True)
    maps = inspection.query_maps(probs, grid, (4, 5))[0]
    for h, (dy, dx) in enumerate(conversion.shifts(3).astype(int)):
        assert maps[h, 4 + dy, 5 + dx] > 1 - 1e-6
    metrics = inspection.locality_metrics(probs, grid)
    for h, (dy, dx) in enumerate(conversion.shifts(3)):
        m = metrics[h]
        assert m["mean_distance"] == pytest.approx(np.hypot(dy, dx), abs=1e-5)
        assert m["mass_3x3"] == pytest.approx(1.0, abs=1e-6)
        assert m["entropy"] == pytest.approx(0.0, abs=1e-4)
        assert m["peak_offset"] == pytest.approx([dy, dx])


def test_uniform_attention_metrics():
    n = 4 * 4
    probs = np.full((1, 1, n, n), 1.0 / n)
    m = inspection.locality_metrics(probs, (4, 4), queries=[5])[0]
    assert m["entropy"] == pytest.approx(np.log(n))
    rows, cols = np.divmod(np.arange(n), 4)
    assert m["mean_distance"] == pytest.approx(np.hypot(rows - 1, cols - 1).mean())
    assert m["mass_3x3"] == pytest.approx(4 / 16)  # the first maximum is the corner (0, 0): 2x2 inside
    table = inspection.format_metrics([[m]])
    assert "distance" in table and "2.773" in table


@pytest.fixture(scope="module")
def small_model():
    keras.utils.set_random_seed(2)
    return sa_conv.build_model("sa_quadratic_full_small", num_layers=2)


def test_figures_have_the_layer_by_head_layout(small_model, real_images, tmp_path):
    result = write_figures(small_model, real_images[:2], str(tmp_path), query=(3, 12), log=lambda s: None)
    names = sorted(os.listdir(tmp_path))
    assert names == ["attention_image0.png", "attention_image1.png", "attention_mean.png", "centers.png", "locality.json"]
    image = matplotlib.image.imread(tmp_path / "attention_image0.png")
    # 2 layers x (9 heads + input column) cells of 1.6 inches at 80 dpi, plus the title band.
    assert image.shape[1] == int(10 * 1.6 * 80)
    assert image.shape[0] == int((2 * 1.6 + 0.6) * 80)
    maps = np.stack([inspection.query_maps(p, (16, 16), (3, 12)) for p in plotting.model_attention(small_model, real_images[:2])], 1)
    fig = plotting.attention_grid_figure(maps[0], (3, 12), real_images[0], 2)
    assert len(fig.axes) == 2 * 10
    cells = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("head") or ax.get_ylabel()]
    assert len(cells) >= 9
    np.testing.assert_allclose(fig.axes[1].images[0].get_array(), maps[0, 0, 0])
    locality = json.load(open(tmp_path / "locality.json"))
    assert len(locality["layers"]) == 2 and len(locality["layers"][0]) == 9
    assert result["query"] == (3, 12)


def test_each_map_is_scaled_to_its_peak_and_a_flat_one_is_drawn_pale():
    """A map's colour scale tops at its peak, but a nearly uniform map (here exactly 1/N) is drawn
    on a scale of 4/N, a quarter of the way up, and every map says its peak; a head counts as
    attending nowhere (`near_uniform`) below twice uniform's 1/N at its peak."""
    peaked = np.full((4, 4), 0.02)
    peaked[1, 2] = 0.7
    flat, wide = np.full((4, 4), 1 / 16), np.full((4, 4), 0.7 / 15)
    wide[0, 0] = 0.3  # 4.8 times uniform at its peak: wide, but it has a place
    fig = plotting.attention_grid_figure(np.stack([peaked, flat, wide])[None], (1, 1))
    cells = [ax for ax in fig.axes if ax.images]
    assert [ax.images[0].norm.vmax for ax in cells] == pytest.approx([0.7, 4 / 16, 0.3])
    assert [ax.get_xlabel() for ax in cells] == ["peak 0.7", "peak 0.062", "peak 0.3"]
    assert [plotting.near_uniform(m) for m in (peaked, flat, wide)] == [False, True, False]
    assert plotting.near_uniform(np.full((16, 16), 1 / 256)) and not plotting.near_uniform(
        np.pad(np.full((8, 8), 1 / 64), 4))  # an 8x8 block of a 16x16 grid: 4 times uniform's 1/256
    # Judged against the map's own mean: maps rounded to 4 decimals (a uniform one sums to 0.9984)
    # or scaled are read as they are.
    assert plotting.near_uniform(np.full((16, 16), 0.0039)) and plotting.near_uniform(flat / 2)
    assert not plotting.near_uniform(peaked / 2) and plotting.scale_top(flat / 2) == pytest.approx(4 / 32)


def test_centers_figure_contours(small_model):
    fig = plotting.centers_figure(small_model, (8, 8))
    assert len(fig.axes) == 2
    ellipses = [p for p in fig.axes[0].patches if type(p).__name__ == "Ellipse"]
    assert len(ellipses) == 2 * 9  # 50% and 90% for each head
    enc = small_model.get_layer("block_0").attention.position_encoding
    centers = ops.convert_to_numpy(enc.centers)
    first = ellipses[0]
    assert first.center == pytest.approx((8 + centers[0, 1], 8 + centers[0, 0]))
    # The 90% contour encloses the 50% one.
    assert ellipses[1].width > ellipses[0].width and ellipses[1].height > ellipses[0].height


def test_isotropic_contour_radius():
    """50% mass of exp(-alpha ||d||^2): radius sqrt(ln 2 / alpha)."""
    alpha = 0.5
    patch = plotting.contour_ellipse(np.zeros(2), 2 * alpha * np.eye(2), 0.5)
    assert patch.width / 2 == pytest.approx(np.sqrt(np.log(2) / alpha))


def test_attention_summaries_callback_writes_images(small_model, real_images, tmp_path):
    from trainers.attention_summaries import AttentionSummaries

    callback = AttentionSummaries(real_images[:2], str(tmp_path), every=2)
    callback.set_model(small_model)
    for epoch in range(4):
        callback.on_epoch_end(epoch)
    tags = []
    for event_file in os.listdir(tmp_path):
        for event in tf.compat.v1.train.summary_iterator(str(tmp_path / event_file)):
            for value in event.summary.value:
                tags.append((value.tag, event.step))
                tensor = tf.make_ndarray(value.tensor)
                height, width = int(tensor[0]), int(tensor[1])
                assert height > 100 and width > 100
    assert sorted(tags) == [("attention/centers", 2), ("attention/centers", 4), ("attention/maps", 2), ("attention/maps", 4)]


@pytest.mark.slow
def test_trainer_flag_writes_attention_summaries(tiny_cifar, tmp_path):
    from trainers.config import make_config
    from trainers.train import train

    train(make_config(overrides=dict(model="sa_quadratic_small", num_layers=1, dataset="cifar10_files",
                                     data_dir=tiny_cifar[0], validation_size=50, epochs=2,
                                     global_batch_size=64, model_dir=str(tmp_path),
                                     attention_summaries_every=1, strategy="one_device")), log=lambda s: None)
    files = os.listdir(tmp_path / "logs" / "attention")
    steps = sorted({e.step for f in files for e in tf.compat.v1.train.summary_iterator(str(tmp_path / "logs" / "attention" / f))
                    if e.summary.value})
    assert steps == [1, 2]


def test_cli(small_model, tmp_path, cifar10_mini_dir):
    path = tmp_path / "m.keras"
    small_model.save(path)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "programs.visualize", f"--model_path={path}", f"--output_dir={tmp_path / 'out'}",
         "--images=0,3", "--query_pixel=8,8", "--dataset=cifar10_files", f"--data_dir={cifar10_mini_dir}"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mass 3x3" in proc.stdout
    assert (tmp_path / "out" / "attention_image1.png").is_file()
    # A query off the grid is the project's error (which the program exits 2 with: test_cli.py).
    from programs import visualize

    with pytest.raises(ConfigError, match="outside the 16x16 attention grid"):
        visualize.visualize_run(visualize.VisualizeConfig(
            model_path=str(path), query_pixel="40,1", dataset="cifar10_files", data_dir=cifar10_mini_dir,
            output_dir=str(tmp_path / "o2")), log=lambda line: None)


def test_augmented_grid_shows_a_runs_training_images_with_their_labels(tmp_path):
    """--augmented=N draws the run's first training images of epoch 1 as its settings make them
    (recorded in config.json), titled with their classes, mixed ones with their weights."""
    from PIL import Image

    from programs import visualize
    from trainers import train as train_lib
    from trainers.config import make_config

    run = tmp_path / "run"
    config = make_config(overrides=dict(model="sa_quadratic_small", num_layers=1, dataset="synthetic", epochs=1,
                                        max_steps=1, global_batch_size=50, validation_size=100, strategy="one_device",
                                        augmentation="pad_crop_flip,mixup", model_dir=str(run)))
    train_lib.Trainer(config, log=lambda line: None, interactive=False).run()
    result = visualize.visualize_run(visualize.VisualizeConfig(model_dir=str(run), augmented=12,
                                                               output_dir=str(tmp_path / "out")), log=lambda line: None)
    (path,) = result["paths"]
    with Image.open(path) as image:
        width, height = image.size
    assert path.endswith("augmented.png") and width > 2 * height > 0  # 8 columns, 2 rows
    names = ["cat", "dog", "ship"]
    assert visualize.augmented_titles(np.array([2, 0]), names) == ["ship", "cat"]
    assert visualize.augmented_titles(np.array([[0.25, 0.0, 0.75], [0.0, 1.0, 0.0]]), names) == \
        ["0.75 ship + 0.25 cat", "1.00 dog"]
    with pytest.raises(ConfigError, match="--augmented shows a run's augmentation: give its --model_dir"):
        visualize.VisualizeConfig(model_path="m.keras", augmented=4).validate()
