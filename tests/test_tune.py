"""Hyperparameter search: tiny searches, reports, resume after SIGKILL, search-space errors."""

import csv
import json
import os
import signal
import subprocess
import sys

import keras
import pytest

from tests.conftest import PROJECT_ROOT, chief_and_two_workers, read_until
from trainers import files
from trainers import tune as tune_lib
from trainers.config import ConfigError, make_config

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)}


def _rows(project):
    with open(project / "trials.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize("tuner", ["random", "bayesian", "hyperband"])
def test_tiny_search_writes_reports(tuner, tiny_cifar, tmp_path):
    base = make_config(overrides=dict(dataset="cifar10_files", data_dir=tiny_cifar[0], global_batch_size=25,
                                      validation_size=50, strategy="one_device", epochs=1, mixed_precision="float32"))
    # One epoch a trial, but hyperband's brackets need at least two.
    config = tune_lib.TuneConfig(tuner=tuner, max_trials=2, max_epochs=2 if tuner == "hyperband" else 1,
                                 search_space="tiny",
                                 directory=str(tmp_path), project_name="p")
    summary = tune_lib.tune(config, base, log=lambda s: None)
    project = tmp_path / "p"
    rows = _rows(project)
    assert len(rows) >= 2
    assert set(rows[0]) == {"trial_id", "encoding", "num_layers", "hidden_size", "learning_rate", "objective",
                            "epochs", "precision", "wall_time_seconds"}
    assert {row["precision"] for row in rows} == {"float32"}  # the policy each trial trained in
    for row in rows:
        assert row["encoding"] in ("quadratic", "learned") and row["num_layers"] == "1"
        assert 0.02 <= float(row["learning_rate"]) <= 0.2 and float(row["wall_time_seconds"]) > 0
    best = json.load(open(project / "best_hyperparameters.json"))
    assert best["score"] == max(float(r["objective"]) for r in rows)
    assert best["process"]["keras"] == keras.__version__ and best["process"]["cpu"]["machine"]
    assert best["precision"] == "float32"
    # Exactly the space's hyperparameters (hyperband's own tuner/* values are not ones), each the
    # winning row's value as trials.csv wrote it.
    assert set(best["hyperparameters"]) == {"encoding", "num_layers", "hidden_size", "learning_rate"}
    winner = next(r for r in rows if r["trial_id"] == best["trial_id"])
    assert {k: str(v) for k, v in best["hyperparameters"].items()} == {k: winner[k] for k in best["hyperparameters"]}
    assert summary["best"]["trial_id"] == best["trial_id"]


@pytest.mark.slow
def test_retrain_best_leaves_an_exportable_model_dir(tiny_cifar, tmp_path):
    base = make_config(overrides=dict(dataset="cifar10_files", data_dir=tiny_cifar[0], global_batch_size=25,
                                      validation_size=50, strategy="one_device", epochs=2))
    config = tune_lib.TuneConfig(tuner="random", max_trials=1, max_epochs=1, search_space="tiny",
                                 directory=str(tmp_path), project_name="p", retrain_best=True)
    summary = tune_lib.tune(config, base, log=lambda s: None)
    run_dir = tmp_path / "p" / "best_run"
    results = json.load(open(run_dir / "results.json"))
    assert results["epochs"] == 2 and results["steps"] == 2 * (200 // 25)
    resolved = json.load(open(run_dir / "config.json"))
    for name, value in summary["best"]["hyperparameters"].items():
        assert resolved[name] == value, name
    from export.export import export

    version = export(model_dir=str(run_dir), export_dir=str(tmp_path / "exported"), log=lambda s: None)
    assert os.path.isfile(os.path.join(version, "saved_model.pb"))


@pytest.mark.slow
def test_sigkill_then_rerun_reuses_finished_trials(tiny_cifar, tmp_path):
    args = [sys.executable, "-m", "trainers.tune", "--search_space=tiny", "--tuner=random", "--max_trials=2",
            "--max_epochs=1", f"--directory={tmp_path}", "--project_name=p", "--dataset=cifar10_files",
            f"--data_dir={tiny_cifar[0]}", "--validation_size=50", "--global_batch_size=50", "--strategy=one_device"]
    proc = subprocess.Popen(args, cwd=PROJECT_ROOT, env={**ENV, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        read_until(proc, "Trial 0 ended and is recorded", timeout=240)  # the search's own event
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    first = tmp_path / "p" / "trial_0"
    assert json.load(open(first / "trial.json"))["status"] == "COMPLETED"
    record = first / "sa_conv_trial.json"
    stamp = os.path.getmtime(record)
    score = json.load(open(first / "trial.json"))["score"]

    rerun = subprocess.run(args, cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert os.path.getmtime(record) == stamp  # trial 0 was not run again
    rows = _rows(tmp_path / "p")
    assert [r["trial_id"] for r in rows] == ["0", "1"]
    assert float(rows[0]["objective"]) == score


@pytest.mark.slow
def test_distributed_search_chief_and_two_workers_survives_a_killed_worker(tmp_path):
    """keras-tuner's distributed mode, the unchanged command in three local processes: the chief
    serves the oracle, two workers run the trials. Worker tuner1 is killed mid-trial and restarted
    with the same id: it gets its unfinished trial back. Every trial completes; the others ran
    exactly once; the count equals a single-process search's (--max_trials); the chief alone
    writes the reports."""
    max_trials = 3
    args = [sys.executable, "-m", "trainers.tune", "--search_space=tiny", "--tuner=random",
            f"--max_trials={max_trials}", "--max_epochs=1", f"--directory={tmp_path}", "--project_name=p",
            "--dataset=synthetic", "--global_batch_size=50", "--strategy=one_device"]

    def records():
        found = {}
        for trial_dir in (tmp_path / "p").glob("trial_*"):
            path = trial_dir / "sa_conv_trial.json"
            if path.exists():
                try:
                    found[trial_dir.name] = json.loads(path.read_text())
                except json.JSONDecodeError:  # being written
                    pass
        return found

    def trial(lines):  # the trial tuner1 was killed in: on its start, as the worker reports it
        return "trial_" + lines[-1].split("Trial ", 1)[1].split(" ", 1)[0]

    def killed(lines):
        assert records()[trial(lines)] == {"tuner_id": "tuner1", "attempts": 1, "status": "running"}

    victim = trial(chief_and_two_workers(args, ENV, tmp_path, "started on tuner1", on_kill=killed))
    final = records()
    assert len(final) == max_trials
    assert all(r["status"] == "completed" for r in final.values()), final
    assert final[victim]["attempts"] == 2 and final[victim]["tuner_id"] == "tuner1"
    assert all(r["attempts"] == 1 for t, r in final.items() if t != victim)
    assert {r["tuner_id"] for r in final.values()} == {"tuner0", "tuner1"}  # trials ran on both workers
    rows = _rows(tmp_path / "p")
    assert sorted(r["trial_id"] for r in rows) == sorted(t.split("_", 1)[1] for t in final)
    assert all(float(r["objective"]) >= 0 for r in rows)
    assert "the chief writes the reports" in (tmp_path / "tuner0.log").read_text()


def test_distributed_search_names_a_missing_variable(monkeypatch):
    monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
    monkeypatch.delenv("KERASTUNER_ORACLE_PORT", raising=False)
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    with pytest.raises(ConfigError, match="KERASTUNER_ORACLE_PORT is not"):
        tune_lib.search_role()
    monkeypatch.setenv("KERASTUNER_ORACLE_PORT", "8000")
    assert tune_lib.search_role() == "worker"
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "chief")
    assert tune_lib.search_role() == "chief"
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    with pytest.raises(ConfigError, match="only the chief may start over"):
        tune_lib.tune(tune_lib.TuneConfig(overwrite=True, search_space="tiny"), make_config())


@pytest.mark.parametrize(
    "space,message",
    [
        ({"hyperparameters": [{"name": "lr", "type": "float", "min": 0.1, "max": 1}]}, "unknown hyperparameter"),
        ({"hyperparameters": [{"name": "encoding", "type": "choice", "values": ["gauss"]}]}, "value 'gauss' is invalid"),
        ({"hyperparameters": [{"name": "learning_rate", "type": "float", "min": 0.3, "max": 0.1}]}, "min 0.3 must be below"),
        ({"hyperparameters": [{"name": "learning_rate", "type": "float", "min": 0, "max": 0.1, "sampling": "log"}]}, "log sampling"),
        ({"hyperparameters": [{"name": "num_heads", "type": "int", "min": 0, "max": 4}]}, "value 0 is invalid"),
        ({"hyperparameters": [{"name": "dropout", "type": "uniform"}]}, "type 'uniform'"),
        ({"hyperparameters": [{"name": "num_layers", "type": "choice"}]}, "needs \\['values'\\]"),
        ({"base_model": "vit", "hyperparameters": []}, "base_model 'vit'"),
        ({"base_model": "sa_content_plus_learned_bias_small",
          "hyperparameters": [{"name": "encoding", "type": "choice", "values": ["learned", "nope"]}]},
         "value 'nope' is invalid"),
    ],
)
def test_invalid_search_space(space, message):
    with pytest.raises(ConfigError, match=message):
        tune_lib.validate_search_space(space)


def test_a_trial_resolves_its_precision_whatever_run_the_model_dir_holds(tmp_path):
    """--mixed_precision=auto keeps the precision of a run it resumes: a trial is no resumption of whatever
    --model_dir holds, and takes this machine's choice."""
    import keras_tuner as kt
    import tensorflow as tf

    from trainers import data as data_lib, precision, run_files

    held = tmp_path / "held"
    run_files.write(str(held), run_files.CONFIG, {"precision": {"policy": "mixed_float16", "why": "requested"}})
    run_files.write(str(held), run_files.HISTORY, [{"epoch": 1}])
    base = make_config(overrides=dict(dataset="synthetic", model_dir=str(held), mixed_precision="auto"))
    space = tune_lib.load_search_space("tiny")
    hypermodel = tune_lib.SaConvHyperModel(space, base, tf.distribute.get_strategy(),
                                           data_lib.load_dataset("synthetic", seed=0), log=lambda s: None)
    model = hypermodel.build(kt.HyperParameters())
    assert hypermodel.tasks[id(model)].precision == precision.training_policy("auto")[0] != "mixed_float16"


def test_invalid_search_space_file_fails_before_any_trial(tmp_path):
    bad = tmp_path / "space.json"
    bad.write_text(json.dumps({"hyperparameters": [{"name": "encoding", "type": "choice", "values": ["conv"]}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.tune", f"--search_space={bad}", f"--directory={tmp_path / 'd'}",
         "--dataset=synthetic"], cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "value 'conv' is invalid" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "d").exists()


def test_named_spaces_are_valid():
    for name in tune_lib.SEARCH_SPACES:
        space = tune_lib.load_search_space(name)
        assert space["base_model"]


def test_small_data_spaces_search_the_recipe_alike_for_attention_and_resnet20(tmp_path):
    """The two small-data spaces differ in their model alone, and a trial keeps the recipe's
    settings but the ones it searches."""
    attention, resnet = tune_lib.SEARCH_SPACES["small_data"], tune_lib.SEARCH_SPACES["small_data_resnet"]
    assert attention["hyperparameters"] == resnet["hyperparameters"]
    assert (attention["base_model"], resnet["base_model"]) == ("sa_quadratic_small", "resnet20")
    base = make_config(overrides=dict(recipe="small_data", dataset="synthetic"))
    trial = tune_lib.trial_config(base, resnet, {"learning_rate": 1e-3, "stochastic_depth": 0.05}, 3, str(tmp_path))
    assert (trial.model, trial.learning_rate, trial.stochastic_depth, trial.epochs) == ("resnet20", 1e-3, 0.05, 3)
    assert (trial.optimizer, trial.augmentation, trial.ema_momentum) == (base.optimizer, base.augmentation, 0.999)


def test_an_unreadable_search_file_stops_the_resume_with_its_name(tmp_path):
    """oracle.json left empty by a search killed mid-write (before writes were atomic): the
    rerun names the file and the two ways on, instead of keras-tuner's JSONDecodeError."""
    project = tmp_path / "project"
    (project / "trial_0").mkdir(parents=True)
    (project / "trial_0" / "trial.json").write_text('{"trial_id": "0"}')
    tune_lib.check_resumable(str(project))  # readable, or absent: nothing to say
    (project / "oracle.json").write_text("")
    with pytest.raises(tune_lib.ConfigError, match=r"oracle.json is unreadable .* --overwrite"):
        tune_lib.check_resumable(str(project))


def test_tuner_files_are_written_atomically(tmp_path, monkeypatch):
    """The oracles' state files go through `write_json_atomically` (subclasses, keras-tuner's own
    writer left as it is), which replaces a file whole or not at all."""
    import keras_tuner as kt
    from keras_tuner.src import utils as tuner_utils

    target = tmp_path / "oracle.json"
    target.write_text('{"old": 1}')
    monkeypatch.setattr(files.os, "replace", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        tune_lib.write_json_atomically(str(target), {"new": 2})
    assert json.loads(target.read_text()) == {"old": 1}
    monkeypatch.undo()
    tune_lib.write_json_atomically(str(target), {"new": 2})
    assert json.loads(target.read_text()) == {"new": 2}

    original, writes = tuner_utils.save_json, []
    monkeypatch.setattr(tune_lib, "write_json_atomically", lambda path, value: writes.append(os.path.basename(path)))
    oracle = tune_lib.RandomOracle(kt.Objective("val_accuracy", "max"), max_trials=1)
    oracle._set_project_dir(str(tmp_path), "p")
    oracle.create_trial("tuner0")
    assert writes == ["trial.json", "oracle.json"] and tuner_utils.save_json is original


@pytest.mark.parametrize("entry,message", [
    ({"name": "num_layers", "type": "int", "min": "num_layers", "max": 0}, "min must be an integer, got 'num_layers'"),
    ({"name": "num_layers", "type": "int", "min": 1, "max": 2.5}, "max must be an integer, got 2.5"),
    ({"name": "dropout", "type": "float", "min": 0.0, "max": True}, "max must be a number, got True"),
    ({"name": "dropout", "type": "float", "min": 0.0, "max": 0.3, "step": "0.1"}, "step must be a number"),
    # A choice's values that are not a list reached list() as a TypeError (found the same way).
    ({"name": "num_layers", "type": "choice", "values": 1}, "'values' must be a list, got 1"),
    ({"name": "encoding", "type": "choice", "values": "quadratic"}, "'values' must be a list, got 'quadratic'"),
])
def test_range_bounds_of_the_wrong_type_are_named(entry, message):
    """Found by tests/test_fuzz.py (hypothesis): a string bound reached the comparison as a TypeError."""
    with pytest.raises(tune_lib.ConfigError, match=message):
        tune_lib.load_search_space({"hyperparameters": [entry]})


@pytest.mark.parametrize("search, base, message", [
    (dict(search_space="small_data"), {}, "searches the small_data recipe's settings: add --recipe=small_data"),
    (dict(search_space="small_data"), dict(recipe="small_data"), "add rand_augment to --augmentation"),
    (dict(search_space="tiny", tuner="hyperband"), dict(ema_momentum=0.99), "would start from zero"),
    (dict(search_space={"base_model": "sa_quadratic_small", "hyperparameters": [  # a user's space
        {"name": "ema_momentum", "type": "choice", "values": [0.99, 0.999]}]}, tuner="hyperband"), {},
     "would start from zero"),
    # The trials' model with the search's settings: --model (the space names none) and --attention_init.
    (dict(search_space={"hyperparameters": [
        {"name": "encoding", "type": "choice", "values": ["learned", "content_with_relative_keys"]}]}, tuner="random"),
     dict(model="sa_learned_small", attention_init="convolutional"),
     "value 'content_with_relative_keys' is invalid: attention_init='convolutional' needs an encoding with a"),
    (dict(search_space={"base_model": "sa_quadratic_small", "hyperparameters": [
        {"name": "learning_rate", "type": "float", "min": 0.01, "max": 0.1}]}, tuner="random"),
     dict(model="sa_content_plus_learned_bias_small", attention_init="mimetic"),
     "model settings on its base_model sa_quadratic_small: attention_init='mimetic' starts the query and key"),
])
def test_searches_the_recipe_cannot_run_are_refused_before_any_trial(search, base, message, tmp_path):
    if isinstance(search["search_space"], dict):
        path = tmp_path / "space.json"
        path.write_text(json.dumps(search["search_space"]))
        search = {**search, "search_space": str(path)}
    config = tune_lib.TuneConfig(directory=str(tmp_path / "d"), **search)
    with pytest.raises(ConfigError, match=message):
        tune_lib.tune(config, make_config(overrides=dict(dataset="synthetic", **base)))
    assert not (tmp_path / "d").exists()


def test_a_search_says_which_trainer_settings_its_trials_do_not_use(tmp_path):
    logs = []
    base = make_config(overrides=dict(dataset="synthetic", snapshot_every=5, max_steps=3, global_batch_size=50,
                                      validation_size=100, epochs=1, strategy="one_device", mixed_precision="float32"))
    tune_lib.tune(tune_lib.TuneConfig(tuner="random", max_trials=1, max_epochs=1, search_space="tiny",
                                      directory=str(tmp_path), project_name="p"), base, log=logs.append)
    assert logs[0].startswith("--snapshot_every: not used by the trials")
    assert logs[1].startswith("--max_steps: not used by a search")
    assert not any(path.name.startswith("epoch_") for path in tmp_path.rglob("*.keras"))  # no snapshot taken


def test_searches_of_one_seed_try_the_same_points():
    """The oracle draws from the trainer's --seed: a search repeats, and the small-data searches
    of an attention preset and of resnet20 try the same settings."""
    import keras_tuner as kt

    def draws(seed, space):
        oracle = tune_lib.make_oracle(tune_lib.TuneConfig(tuner="random", max_trials=4, search_space=space), seed)
        hp = kt.HyperParameters()
        tune_lib.define_hyperparameters(hp, tune_lib.SEARCH_SPACES[space])
        oracle.update_space(hp)
        return [oracle.populate_space(str(i))["values"] for i in range(4)]

    first = draws(0, "small_data")
    assert first == draws(0, "small_data_resnet") and first != draws(1, "small_data")
    assert len({tuple(sorted(values.items())) for values in first}) == 4
