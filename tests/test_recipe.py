"""The small-data recipe: --recipe, --augmentation (Keras's layers, seeded), --optimizer=adamw,
--stochastic_depth, --ema_momentum, and the small ResNet20 (resume: test_train's kill test)."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import sa_conv
from sa_conv.errors import ConfigError
from sa_conv.transformer import TransformerBlock, exact_gelu
from trainers import augmentation as augmentation_lib
from trainers import data as data_lib
from trainers import train as train_lib
from trainers.config import make_config
from trainers.optimizers import OPTIMIZERS
from trainers.recipes import RECIPES
from trainers.task import Task

TINY = dict(model="sa_quadratic_small", num_layers=2, dataset="synthetic", validation_size=100, global_batch_size=50,
            eval_batch_size=100, strategy="one_device")


def _config(**overrides):
    return make_config(overrides={**TINY, **overrides})


def _split(count=10, seed=0):
    """``count`` random images with labels 0, 1, ..., so that a mixed label names both sources."""
    rng = np.random.default_rng(seed)
    return data_lib.Split(rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8), np.arange(count) % 10)


def _batches(split, config, seed=7, batch=10):
    pipeline = augmentation_lib.Pipeline(config, 10)
    return list(data_lib.make_dataset(split, batch, training=True, seed=seed, augmentation=pipeline).as_numpy_iterator())


# ------------------------------------------------------------------------------ --recipe


def test_recipe_sets_defaults_that_a_config_file_and_flags_override():
    paper, small = _config(), _config(recipe="small_data")
    assert (paper.optimizer, paper.learning_rate, paper.augmentation, paper.ema_momentum) == \
        ("sgd", 0.1, "pad_crop_flip", None)
    for name, value in RECIPES["small_data"].items():
        assert getattr(small, name) == value
    assert small.optimizer == "adamw" and small.stochastic_depth > 0
    file_values = {"recipe": "small_data", "learning_rate": 1e-3}
    config = make_config(file_values, {**TINY, "weight_decay": 0.02})
    assert (config.learning_rate, config.weight_decay, config.optimizer) == (1e-3, 0.02, "adamw")
    with pytest.raises(ConfigError, match="--recipe='big_data' is not one of: paper, small_data"):
        _config(recipe="big_data")


@pytest.mark.parametrize("overrides, message", [
    (dict(augmentation="pad_crop_flip,autoaugment"), "unknown autoaugment; choose from pad_crop_flip, rand_augment"),
    (dict(augmentation="mixup,mixup"), "lists mixup more than once"),
    (dict(rand_augment_factor=1.5), "--rand_augment_factor in \\[0, 1\\]"),
    (dict(random_erasing=2.0), "--random_erasing is a probability"),
    (dict(mixup_alpha=0.0), "--mixup_alpha must be positive"),
    (dict(cutmix_alpha=2.0), "--cutmix_alpha in \\(0, 1\\]"),
    (dict(ema_momentum=1.0), "--ema_momentum must be in \\[0, 1\\) \\(0: off\\)"),
    (dict(ema_momentum=0.99, prune_degenerate_heads=True), "which --ema_momentum averages; choose one"),
    (dict(optimizer="lamb"), "--optimizer='lamb' is not one of: sgd, adamw"),
])
def test_bad_recipe_settings_name_the_flag(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(**overrides)


# ------------------------------------------------------------------------------ --augmentation


def test_augmented_epochs_follow_from_the_seed_alone():
    """Two pipelines of the same seed give the same batches bit for bit (parallel calls and all);
    another epoch's seed gives others. Without pad_crop_flip nor anything else, images pass as they are."""
    split, config = _split(40), _config(recipe="small_data", augmentation=",".join(augmentation_lib.AUGMENTATIONS))
    first, again, other = _batches(split, config), _batches(split, config), _batches(split, config, seed=8)
    for (a, la), (b, lb) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(first[0][0], other[0][0])
    plain = _batches(split, _config(augmentation=""), batch=40)[0][0]
    assert sorted(image.tobytes() for image in plain) == sorted(image.tobytes() for image in split.images)


def test_paper_pipeline_is_the_crop_and_flip_as_before():
    """--augmentation=pad_crop_flip through the pipeline gives what make_dataset gave without
    one: the runs of the paper recipe see the images they always did."""
    split = _split(20)
    ours = _batches(split, _config())
    before = list(data_lib.make_dataset(split, 10, training=True, seed=7).as_numpy_iterator())
    for (a, la), (b, lb) in zip(ours, before, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert ours[0][0].dtype == np.uint8 and ours[0][1].dtype == np.int64


def test_mixup_mixes_two_examples_and_their_labels_by_one_weight():
    """Labels 0-9 are distinct, so a mixed label names both sources and the weight: the image is
    that mixture of the two source images (no crop: the sources are the split's images)."""
    split = _split(10)
    images, labels = _batches(split, _config(augmentation="mixup", mixup_alpha=0.8))[0]
    assert images.dtype == np.float32 and labels.shape == (10, 10)
    np.testing.assert_allclose(labels.sum(1), 1.0, atol=1e-6)
    mixed = 0
    for image, label in zip(images, labels):
        (sources,) = np.nonzero(label > 1e-6)
        expected = sum(label[c] * split.images[c].astype(np.float32) for c in sources)
        np.testing.assert_allclose(image, expected, atol=1e-3)
        mixed += len(sources) == 2
    assert mixed >= 5  # Beta(0.8, 0.8) weights are rarely 0 or 1


def test_cutmix_pastes_a_rectangle_and_mixes_the_labels_by_its_area():
    """Each image is one source with a rectangle of another pasted in, and the label gives the
    pasted source the rectangle's share of the area, up to a row and a column (Keras mixes the
    labels by the weight it drew, of which the rectangle is the rounding to whole pixels)."""
    split = _split(10)
    images, labels = _batches(split, _config(augmentation="cutmix", cutmix_alpha=1.0))[0]
    pasted = 0
    for image, label in zip(images, labels):
        sources = list(np.nonzero(label > 1e-6)[0])
        if len(sources) == 1:
            np.testing.assert_array_equal(image, split.images[sources[0]])
            continue
        readings = []
        for own, other in (sources, sources[::-1]):
            box = np.any(image != split.images[own], axis=-1)
            rows, cols = np.nonzero(box)
            if rows.size and box[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all() \
                    and np.array_equal(image[box], split.images[other][box]):
                readings.append((own, other, box.mean()))
        assert len(readings) == 1
        own, other, area = readings[0]
        assert label[other] == pytest.approx(area, abs=65 / 1024) and label[own] == pytest.approx(1 - label[other])
        pasted += 1
    assert pasted >= 5


def test_both_mixes_listed_take_turns_by_batch():
    """With mixup and cutmix, each batch is one or the other: a batch either has fractional
    pixel values (a MixUp) or only integer ones (a CutMix), and both kinds occur."""
    batches = _batches(_split(200), _config(augmentation="mixup,cutmix"))
    kinds = {bool(np.any(images != np.round(images))) for images, _ in batches}
    assert kinds == {True, False}


def test_random_erasing_erases_a_rectangle_with_its_probability():
    split = _split(10)

    def erased(probability):
        images, labels = _batches(split, _config(augmentation="random_erasing", random_erasing=probability))[0]
        return [np.any(image != split.images[label], axis=-1) for image, label in zip(images, labels)]

    assert not any(mask.any() for mask in erased(0.0))
    for mask in erased(1.0):
        rows, cols = np.nonzero(mask)
        assert rows.size  # and what changed fills a rectangle (noise may repeat a pixel's value)
        assert mask[rows.min():rows.max() + 1, cols.min():cols.max() + 1].mean() > 0.9


def test_rand_augment_changes_images_with_the_configured_operations():
    split = _split(20)
    config = _config(augmentation="rand_augment", rand_augment_ops=3, rand_augment_factor=0.7)
    pipeline = augmentation_lib.Pipeline(config, 10)
    (layer,) = [a.layer for a in pipeline.per_example]
    assert isinstance(layer, keras.layers.RandAugment) and layer.num_ops == 3 and layer.factor[1] == pytest.approx(0.7)
    images, _ = _batches(split, config, batch=20)[0]
    assert images.dtype == np.uint8
    assert sum(not any(np.array_equal(image, s) for s in split.images) for image in images) >= 15


# ------------------------------------------------------------------------------ the Task's pieces


def test_loss_and_accuracy_of_mixed_labels():
    task = Task(_config())
    logits = tf.constant([[2.0, 0.0, -1.0] + [0.0] * 7, [0.0, 1.0, 3.0] + [0.0] * 7])
    mixed = tf.constant([[0.7, 0.3] + [0.0] * 8, [0.0, 0.4, 0.6] + [0.0] * 7])
    expected = -np.sum(mixed.numpy() * tf.nn.log_softmax(logits).numpy(), -1)
    np.testing.assert_allclose(task.per_example_loss(mixed, logits).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(task.per_example_loss(tf.constant([0, 2]), logits).numpy(),
                               -tf.nn.log_softmax(logits).numpy()[[0, 1], [0, 2]], rtol=1e-6)
    np.testing.assert_array_equal(task.sums(expected, mixed, logits).numpy(), [expected.sum(), 2, 2])


def test_adamw_decays_decoupled_and_spares_what_the_model_and_flags_spare():
    """With zero gradients Adam's step is 0, so what moves the weights is the decay alone:
    ``w (1 - lr wd)`` for decayed variables, nothing for spared ones (the biases by
    --no_weight_decay, the attention centers by the model). SGD couples it into the loss instead."""
    config = _config(optimizer="adamw", learning_rate=0.01, weight_decay=0.1, no_weight_decay="bias", dropout=0.0)
    task = Task(config)
    model = task.build_model()
    optimizer = task.build_optimizer(model, config.learning_rate)
    before = [v.numpy() for v in model.trainable_variables]
    optimizer.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)
    decayed = {id(v) for v in task.decayed_variables(model)}
    assert 0 < len(decayed) < len(model.trainable_variables)
    for v, b in zip(model.trainable_variables, before):
        factor = 1 - 0.01 * 0.1 if id(v) in decayed else 1.0
        np.testing.assert_allclose(v.numpy(), b * factor, rtol=1e-6, atol=1e-9, err_msg=v.path)
    assert not OPTIMIZERS["adamw"].couples_weight_decay and OPTIMIZERS["sgd"].couples_weight_decay
    images, labels = tf.zeros((2, 32, 32, 3)), tf.constant([0, 1])
    grads, _ = task.gradients(model, optimizer, images, labels)
    sgd_task = Task(dataclasses.replace(config, optimizer="sgd"))
    coupled, _ = sgd_task.gradients(model, sgd_task.build_optimizer(model, 0.01), images, labels)
    kernel = [i for i, v in enumerate(model.trainable_variables) if id(v) in decayed][0]
    np.testing.assert_allclose(coupled[kernel] - grads[kernel], 0.1 * model.trainable_variables[kernel].numpy(),
                               rtol=1e-4, atol=1e-6)


def test_ema_run_evaluates_and_saves_the_average(tmp_path):
    """With --ema_momentum the validation loss, the saved model and the test are those of the
    weights' moving average; the checkpoint keeps the trained weights and their average, so a
    Trainer restoring it has both."""
    config = _config(ema_momentum=0.9, epochs=1, max_steps=6, model_dir=str(tmp_path), learning_rate=0.05,
                     snapshot_every=1)
    trainer = train_lib.Trainer(config, log=lambda line: None, interactive=False)
    trainer.prepare()
    initial = [v.numpy() for v in trainer.model.trainable_variables]
    results = trainer.run()
    start = keras.models.load_model(tmp_path / "snapshots" / "epoch_000.keras")  # before any step: no average yet
    for weight, value in zip(start.trainable_variables, initial, strict=True):
        np.testing.assert_array_equal(weight.numpy(), value)
    saved = keras.models.load_model(tmp_path / "model.keras")
    again = train_lib.Trainer(config, log=lambda line: None, interactive=False)
    again.prepare()
    again.restore()
    trained = [v.numpy() for v in again.model.trainable_variables]
    with again.averaged_weights():
        for weight, average in zip(again.model.trainable_variables, saved.trainable_variables, strict=True):
            np.testing.assert_array_equal(weight.numpy(), average.numpy())
        validation = again.evaluate(again.task.val_split)
    history = json.loads((tmp_path / "history.json").read_text())
    assert history[-1]["val_loss"] == pytest.approx(validation["loss"], rel=1e-6)
    for weight, value in zip(again.model.trainable_variables, trained):  # the trained weights again
        np.testing.assert_array_equal(weight.numpy(), value)
    assert sum(not np.allclose(a, b.numpy()) for a, b in zip(trained, saved.trainable_variables)) > 10
    assert results["test_loss"] == pytest.approx(trainer.evaluate(trainer.task.test_split)["loss"], rel=1e-6)
    with again.averaged_weights():
        assert again.evaluate(again.task.test_split)["loss"] == pytest.approx(results["test_loss"], rel=1e-6)


def test_ema_averages_the_batch_norm_statistics_too(tmp_path):
    """A ResNet's averaged weights are evaluated with averaged moving statistics, not with those of
    the last steps' weights; --ema_momentum=0 turns the average off under the small_data recipe."""
    config = _config(model="resnet20", num_layers=None, ema_momentum=0.5, epochs=1, max_steps=4,
                     model_dir=str(tmp_path), learning_rate=0.05)
    trainer = train_lib.Trainer(config, log=lambda line: None, interactive=False)
    trainer.prepare()
    trainer.train_epochs(0, [], save=False)
    statistics = [v for v in trainer.model.non_trainable_weights if "moving_mean" in v.path]
    assert statistics and len(trainer.task.averaged_variables(trainer.model)) == \
        len(trainer.model.trainable_variables) + len(trainer.model.non_trainable_weights)
    live = [v.numpy() for v in statistics]
    with trainer.averaged_weights():
        averaged = [v.numpy() for v in statistics]
    assert all(not np.allclose(a, b) for a, b in zip(live, averaged))
    for v, value in zip(statistics, live):
        np.testing.assert_array_equal(v.numpy(), value)
    off = Task(_config(recipe="small_data", ema_momentum=0.0))
    assert not off.build_optimizer(off.build_model(), 0.001).use_ema


# ------------------------------------------------------------------------------ stochastic depth


def test_transformer_block_drops_whole_branches_per_example():
    """In training, each example's output is one of the four blocks with its attention and MLP
    branches kept (scaled by 1 / (1 - rate)) or dropped; all four occur at rate 0.5."""
    rate, x = 0.5, tf.random.stateless_normal((64, 4, 4, 8), seed=(1, 2))
    block = TransformerBlock(16, dropout=0.0, attention_config=dict(num_heads=4, attention_dropout=0.0), drop_path=rate)
    out = block(x, training=True).numpy()
    attended = block.attention_output(block.attention(x))

    def combo(a, m):
        y = block.attention_norm(x + a * attended)
        return block.output_norm(y + m * block.output_dense(exact_gelu(block.intermediate(y)))).numpy()

    scale = 1 / (1 - rate)
    combos = {(a, m): combo(a, m) for a in (0.0, scale) for m in (0.0, scale)}
    found = set()
    for i in range(len(out)):
        matches = [k for k, c in combos.items() if np.allclose(out[i], c[i], atol=1e-5)]
        assert len(matches) == 1, i
        found.add(matches[0])
    assert found == set(combos)
    np.testing.assert_allclose(block(x, training=False).numpy(), combo(1.0, 1.0), atol=1e-5)
    assert block.get_config()["drop_path"] == rate and "drop_path" not in TransformerBlock(16, attention_config=dict(num_heads=4)).get_config()


def test_stochastic_depth_rates_rise_linearly_with_depth():
    model = sa_conv.build_model("sa_quadratic_small", stochastic_depth=0.2)
    assert [b.drop_path_rate for b in sa_conv.attention_blocks(model)] == pytest.approx([0.0, 0.1, 0.2])
    resnet = sa_conv.build_model("resnet20", stochastic_depth=0.16)
    rates = [layer.rate for layer in resnet.layers if layer.name.endswith("_drop_path")]
    assert rates == pytest.approx([0.02 * k for k in range(1, 9)])  # 9 blocks: the first keeps its branch
    assert all(layer.noise_shape == (None, 1, 1, 1) for layer in resnet.layers if layer.name.endswith("_drop_path"))
    with pytest.raises(ValueError, match="stochastic_depth must be in \\[0, 1\\)"):
        sa_conv.get_config("resnet20", stochastic_depth=1.0)


def test_resnet_stochastic_depth_drops_whole_residual_branches_per_example():
    """In training, each example's block output adds to its shortcut the residual branch dropped whole or kept scaled
    by 1 / (1 - rate); both occur at rate 0.5, and in inference the branch is added unchanged."""
    resnet = sa_conv.build_model("resnet20", stochastic_depth=0.5)
    drop, add = resnet.get_layer("stage3_block3_drop_path"), resnet.get_layer("stage3_block3_add")
    assert drop.rate == 0.5  # the last block's: the model's stochastic_depth
    probe = keras.Model(resnet.input, [drop.input, add.input[1], add.output])
    images = tf.random.stateless_uniform((32, 32, 32, 3), seed=(3, 4), maxval=255.0)
    for training, scales in ((True, {0.0, 2.0}), (False, {1.0})):
        branch, shortcut, added = (t.numpy() for t in probe(images, training=training))
        found = set()
        for i in range(len(images)):
            kept = 1.0 / (1.0 - drop.rate) if training else 1.0
            scale = 0.0 if np.allclose(added[i], shortcut[i], atol=1e-6) else kept
            np.testing.assert_allclose(added[i], shortcut[i] + scale * branch[i], rtol=1e-5, atol=1e-5)
            found.add(scale)
        assert found == scales, training


def test_resnet20_is_he_et_al_s_small_cifar_resnet():
    model = sa_conv.build_model("resnet20")
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert params == 272_474  # He et al.'s 0.27 M, plus the two 1x1 projections' 2,560 and their BN
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D) and layer.kernel_size == (3, 3)]
    assert len(convs) == 19 and [c.filters for c in convs[::6]] == [16, 16, 32, 64]  # 6n + 1 = 19, plus the dense
    assert model.output_shape == (None, 10)


def test_the_committed_ablation_plan_varies_only_the_recipes_augmentation():
    """Every run of configs/small_data_ablation.json is `small_data` with the paper's pad-crop-flip and some of the
    field's augmentations, the recipe's own among them; every run the ablation report records was made by that plan's
    settings."""
    from tests.conftest import PROJECT_ROOT
    from trainers import study
    from trainers.augmentation import AUGMENTATIONS

    runs = {run.key: run.flags for run in study.load_plan(str(PROJECT_ROOT / "configs" / "small_data_ablation.json"))}
    augmentations = {flags["augmentation"] for flags in runs.values()}
    assert RECIPES["small_data"]["augmentation"] in augmentations and ",".join(AUGMENTATIONS) in augmentations
    for flags in runs.values():
        config = make_config(overrides=flags)
        assert config.recipe == "small_data" and flags["augmentation"].startswith("pad_crop_flip")
        # No other setting of the recipe overridden: only what says which run it is, and where.
        assert set(flags) == {"model", "recipe", "dataset", "data_dir", "epochs", "seed", "mixed_precision",
                              "snapshot_every", "augmentation"}
    with open(PROJECT_ROOT / "benchmarks" / "results" / "small_data_ablation.json") as f:
        recorded = json.load(f)["runs"]
    assert recorded and all({k: v for k, v in run["flags"].items() if k != "data_dir"} == {
        k: v for k, v in runs[key].items() if k != "data_dir"} for key, run in recorded.items())
