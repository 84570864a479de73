"""Learning-rate schedules at known steps, and the trainer's configuration."""

import json
import math

import numpy as np
import pytest

from trainers import config as config_lib
from trainers.schedule import WarmupCosineDecay, WarmupStepDecay, make_schedule


def lr(schedule, step):
    return float(schedule(step))


def test_cosine_with_warmup_at_known_steps():
    s = make_schedule("cosine", 0.1, total_steps=1000, warmup_ratio=0.05)
    assert s.warmup_steps == 50
    assert lr(s, 0) == pytest.approx(0.1 / 50)  # the first step already trains
    assert lr(s, 24) == pytest.approx(0.1 * 25 / 50)
    assert lr(s, 49) == pytest.approx(0.1)  # end of warm-up
    assert lr(s, 50) == pytest.approx(0.1)  # start of the cosine
    assert lr(s, 525) == pytest.approx(0.05, rel=1e-5)  # middle of the cosine
    last = 0.05 * (1 + math.cos(math.pi * 949 / 950))
    assert lr(s, 999) == pytest.approx(last, abs=1e-8) and 0 < lr(s, 999) < 1e-5
    assert lr(s, 1000) == pytest.approx(0.0, abs=1e-9)
    values = [lr(s, i) for i in range(50, 1000, 50)]
    assert all(a > b for a, b in zip(values, values[1:]))  # monotone decay


def test_cosine_without_warmup():
    s = WarmupCosineDecay(0.2, total_steps=10, warmup_steps=0)
    assert lr(s, 0) == pytest.approx(0.2)
    assert lr(s, 5) == pytest.approx(0.1, rel=1e-5)


def test_step_schedule_for_resnet_recipe():
    steps_per_epoch = 500
    s = make_schedule("step", 0.1, 300 * steps_per_epoch, 0.0, [80 * 500, 150 * 500, 250 * 500], 10.0)
    assert isinstance(s, WarmupStepDecay)
    assert lr(s, 0) == pytest.approx(0.1)
    assert lr(s, 80 * 500 - 1) == pytest.approx(0.1)
    assert lr(s, 80 * 500) == pytest.approx(0.01)
    assert lr(s, 150 * 500) == pytest.approx(0.001)
    assert lr(s, 299 * 500) == pytest.approx(0.0001)


def test_schedule_errors():
    with pytest.raises(ValueError, match="Unknown lr_schedule 'linear'"):
        make_schedule("linear", 0.1, 10)
    with pytest.raises(ValueError, match="warmup_ratio"):
        make_schedule("cosine", 0.1, 10, warmup_ratio=1.0)
    with pytest.raises(ValueError, match="milestones must be increasing"):
        WarmupStepDecay(0.1, 100, 0, [50, 20])


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "sa_learned_small", "epochs": 7, "learning_rate": 0.05}))
    cfg = config_lib.make_config(config_lib.read_config_file(str(path)), {"epochs": 3})
    assert (cfg.model, cfg.epochs, cfg.learning_rate) == ("sa_learned_small", 3, 0.05)
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("model: resnet18\nlr_schedule: step\nwarmup_ratio: 0.0\n")
    cfg = config_lib.make_config(config_lib.read_config_file(str(yaml_path)))
    assert cfg.lr_schedule == "step" and cfg.milestone_epochs() == (80, 150, 250)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"global_batch_size": -4}, "global_batch_size must be a positive integer"),
        ({"model": "vit"}, "--model='vit' is not one of"),
        ({"strategy": "horovod"}, "--strategy='horovod'"),
        ({"learning_rate": 0}, "learning_rate must be positive"),
        ({"warmup_ratio": 1.5}, "warmup_ratio must be in"),
        ({"lr_milestones": "80,x"}, "comma-separated increasing epochs"),
        ({"lr_milestones": "150,80"}, "comma-separated increasing epochs, got '150,80'"),
        ({"lr_decay_factor": 0}, "lr_decay_factor must be positive"),
        ({"seed": -1}, "--seed must be >= 0, got -1"),
        ({"encoding": "frozen:quadratic"}, "serves a trained model's copy"),
        ({"model": "sa_quadratic_small", "attention_init": "mimetic"}, "'quadratic' is position only"),
        ({"model": "sa_learned_small", "hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"model": "resnet18", "encoding": "learned", "num_heads": 4},
         r"resnet18 \(architecture resnet18\) has no attention: encoding, num_heads would change nothing"),
        ({"validation_size": 0}, "needs a validation split"),
        ({"epoch": 3}, "Unknown setting"),
    ],
)
def test_config_errors(values, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.make_config(overrides=values)


def test_config_file_errors(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="does not exist"):
        config_lib.read_config_file(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(config_lib.ConfigError, match="not valid JSON/YAML"):
        config_lib.read_config_file(str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"lr": 0.1}')
    with pytest.raises(config_lib.ConfigError, match="unknown keys \\['lr'\\]"):
        config_lib.read_config_file(str(unknown))


def test_paper_configs_are_valid():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "configs"
    files = sorted(f for f in root.glob("*.yaml") if f.stem not in config_lib.RECIPES)
    assert {f.stem for f in files} >= {"sa_quadratic", "sa_quadratic_full", "sa_learned", "sa_content_plus_learned_bias", "resnet18"}
    for f in files:
        cfg = config_lib.make_config(config_lib.read_config_file(str(f)))
        assert cfg.model == f.stem and cfg.epochs == 300 and cfg.global_batch_size == 100
        if cfg.model == "resnet18":
            assert cfg.lr_schedule == "step" and cfg.milestone_epochs() == (80, 150, 250) and cfg.warmup_ratio == 0
        else:
            assert cfg.lr_schedule == "cosine" and cfg.warmup_ratio == 0.05 and cfg.learning_rate == 0.1
    np.testing.assert_equal(len(files), 5)
    # A recipe's file: the recipe's settings, under the file's own.
    small = config_lib.make_config(config_lib.read_config_file(str(root / "small_data.yaml")))
    assert (small.recipe, small.optimizer, small.epochs, small.model) == ("small_data", "adamw", 240, "sa_quadratic_small")


def test_per_epoch_updates_follow_the_reference_train_py():
    """--lr_update=epoch: the reference's LambdaLR evaluated at each epoch's first global step
    (utils/learning_rate.py: warm-up ``step / T_warmup``, then cosine over the rest)."""
    steps_per_epoch, epochs, base = 38, 8, 0.1
    total = steps_per_epoch * epochs
    schedule = make_schedule("cosine", base, total, warmup_ratio=0.05, steps_per_update=steps_per_epoch)
    warmup = int(round(0.05 * total))

    def reference(step):
        if step < warmup:
            return step / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    for step in range(total):
        start = step // steps_per_epoch * steps_per_epoch
        assert float(schedule(step)) == pytest.approx(base * reference(start), abs=1e-6), step
    assert float(schedule(steps_per_epoch - 1)) == 0.0  # the reference's first epoch: lr 0
