"""The study engine (`trainers.study`): a fixed plan of runs as a keras-tuner search, shared by
workers in keras-tuner's chief/worker mode, each run resumed after a kill."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT, chief_and_two_workers
from trainers import study

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT), "PYTHONUNBUFFERED": "1"}
TINY = {"model": "sa_quadratic_small", "dataset": "synthetic", "global_batch_size": 50, "strategy": "one_device",
        "num_layers": 1, "hidden_size": 16}


def write_plan(path, keys=("seed=0", "seed=0, again", "seed=1", "seed=2"), epochs=2):
    """A plan of runs named ``seed=S`` (anything after the seed names another run of the same settings)."""
    plan = [{"key": key, "flags": {**TINY, "seed": int(key.split("=")[1].split(",")[0]), "epochs": epochs}}
            for key in keys]
    path.write_text(json.dumps(plan))
    return str(path)


def command(plan, directory, name="s"):
    return [sys.executable, "-m", "trainers.study", f"--plan={plan}", f"--directory={directory}", f"--name={name}"]


def trained(log_text):
    """The keys a process started training, in order."""
    return [line.split(":", 1)[0] for line in log_text.splitlines() if ": training in " in line]


@pytest.mark.slow
def test_two_workers_share_a_plan_and_a_killed_worker_resumes_its_run(tmp_path):
    """A chief and two workers on one machine make a four-run plan: every run once, on both
    workers; one worker, killed with SIGKILL after its run's first epoch and started again with
    its id, resumes that run (not from the start) and ends with the weights of the same run made
    by the other worker uninterrupted (the plan's first two runs have the same settings, and the
    workers take one each)."""
    lines = chief_and_two_workers(command(write_plan(tmp_path / "plan.json"), tmp_path / "shared"), ENV, tmp_path,
                                  "epoch 1/2")
    victim = trained("".join(lines))[-1]
    texts = {name: (tmp_path / f"{name}.log").read_text() for name in ("chief", "tuner0", "tuner1")}
    assert "Resuming from" in texts["tuner1"].split(f"{victim}: training in")[-1]
    runs = trained(texts["tuner0"]) + trained(texts["tuner1"])
    assert sorted(runs) == sorted(["seed=0", "seed=0, again", "seed=1", "seed=2", victim])  # the victim twice
    assert trained(texts["tuner0"]) and trained(texts["tuner1"])  # both shared the plan
    assert not trained(texts["chief"])
    assert victim in ("seed=0", "seed=0, again") and victim not in trained(texts["tuner0"])
    report = json.loads((tmp_path / "shared" / "s.json").read_text())
    shas = {key: run["weights_sha256"] for key, run in report["runs"].items()}
    assert sorted(shas) == ["seed=0", "seed=0, again", "seed=1", "seed=2"] and len(set(shas.values())) == 3
    assert shas["seed=0"] == shas["seed=0, again"]  # the killed run ends as the uninterrupted one


def test_the_oracle_hands_out_the_plan_in_order_once_and_then_stops(tmp_path):
    import keras_tuner as kt

    oracle = study.PlanOracle(["a", "b", "c"], record=lambda key, trial_dir: None)
    oracle._set_project_dir(str(tmp_path), "p")
    first, second = oracle.create_trial("w0"), oracle.create_trial("w1")
    assert [first.hyperparameters.values["run"], second.hyperparameters.values["run"]] == ["a", "b"]
    assert oracle.create_trial("w0") is first  # a restarted worker gets its run back
    reloaded = study.PlanOracle(["a", "b", "c"], record=lambda key, trial_dir: None)
    reloaded._set_project_dir(str(tmp_path), "p")
    reloaded.reload()  # a restarted chief: each run under way stays with its worker
    assert reloaded.create_trial("w5").hyperparameters.values["run"] == "c"
    assert reloaded.create_trial("w1").hyperparameters.values["run"] == "b"
    assert reloaded.create_trial("w6").status == kt.engine.trial.TrialStatus.STOPPED


def test_a_plan_naming_a_run_twice_or_an_unknown_setting_is_refused(tmp_path):
    with pytest.raises(ValueError, match="names a run twice"):
        study.StudyTuner([study.Run("a", TINY), study.Run("a", TINY)], study.read_results, None,
                         directory=str(tmp_path), project_name="p")
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps([{"key": "a", "flags": {**TINY, "learning_rat": 0.1}}]))
    with pytest.raises(study.ConfigError, match="Run 'a': .*learning_rat"):
        study.check(study.load_plan(str(bad)))


@pytest.mark.slow
def test_a_plan_asking_for_logical_cpu_devices_trains_on_them(tmp_path):
    """The study process splits its CPU as its runs ask (``cpu_devices``), once: one count for all."""
    mirrored = {**TINY, "epochs": 1, "strategy": "mirrored", "cpu_devices": 2}
    with pytest.raises(study.ConfigError, match=r"ask for \[1, 2\] logical CPU devices"):
        study.run_study("p", [study.Run("a", {**TINY, "epochs": 1}), study.Run("b", mirrored)], study.read_results,
                        lambda key, reading: None, str(tmp_path), log=lambda s: None)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"key": "a", "flags": mirrored}]))
    proc = subprocess.run(command(str(plan), str(tmp_path / "d")), cwd=PROJECT_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 replica(s)" in proc.stdout + proc.stderr


def test_a_run_the_model_cannot_take_stops_the_study_before_any_run_trains(tmp_path):
    """The settings of every run are checked up front, the model's too: a plan whose second run asks
    for mimetic initialization of position-only attention trains nothing."""
    runs = [study.Run("a", {**TINY, "epochs": 1}), study.Run("b", {**TINY, "epochs": 1, "attention_init": "mimetic"})]
    with pytest.raises(study.ConfigError, match="Run 'b': attention_init='mimetic' starts the query and key maps"):
        study.run_study("p", runs, study.read_results, lambda key, reading: None, str(tmp_path), log=lambda s: None)
    assert not os.path.exists(tmp_path / "p")


def test_a_process_handed_a_run_its_plan_lacks_says_to_share_the_plan(tmp_path):
    """A chief restarted with a longer plan hands a worker still on the shorter one a run it does
    not know: the worker stops, naming the fix."""
    import keras_tuner as kt

    tuner = study.StudyTuner([study.Run("a", TINY)], study.read_results, lambda key, trial_dir: None,
                             directory=str(tmp_path), project_name="p")
    hyperparameters = kt.HyperParameters()
    hyperparameters.Fixed("run", "b")
    with pytest.raises(kt.errors.FatalError, match="run 'b', which its plan does not have: start the chief and "
                                                   "every worker with the same plan"):
        tuner.run_trial(kt.engine.trial.Trial(hyperparameters, trial_id="0"))


def test_the_report_keeps_every_run_and_what_it_derives(tmp_path):
    report = study.Report(str(tmp_path / "r.json"), derive=lambda runs: {"count": len(runs)},
                          keep=lambda reading: {"acc": reading["acc"]}, note="why")
    report.record("a", {"acc": 0.5, "big": [1] * 10})
    written = report.record("b", {"acc": 0.7})
    assert written == json.loads((tmp_path / "r.json").read_text())
    assert written == {"runs": {"a": {"acc": 0.5}, "b": {"acc": 0.7}}, "notes": ["why"], "count": 2}
    # A rule that keeps less by now holds for the runs recorded before it, when the next run lands.
    report.keep = lambda reading: {"acc": reading["acc"], **({"key": reading["key"]} if reading["acc"] > 0.6 else {})}
    assert report.record("c", {"acc": 0.9})["runs"] == {"a": {"acc": 0.5}, "b": {"acc": 0.7, "key": "b"},
                                                        "c": {"acc": 0.9, "key": "c"}}
    # By default a run as read, its key aside: the report holds it under the key.
    assert study.Report(str(tmp_path / "d.json")).record("a", {"key": "a", "acc": 0.5})["runs"] == {"a": {"acc": 0.5}}


def test_a_trial_directory_holding_another_run_is_refused_not_reused(tmp_path):
    """A study directory reused with another plan: a run never takes another's reading or resumes
    another's checkpoints."""
    from trainers import files

    run = study.Run("seed=0", {**TINY, "seed": 0, "epochs": 2})
    files.write_json(str(tmp_path / "a" / study.READING), {"key": "seed=1"})
    with pytest.raises(study.ConfigError, match="holds run 'seed=1', not 'seed=0'"):
        study.train_and_read(run, str(tmp_path / "a"), study.read_results)
    files.write_json(str(tmp_path / "b" / "config.json"), {**TINY, "seed": 1, "epochs": 2})
    with pytest.raises(study.ConfigError, match=r"other settings \(seed\)"):
        study.train_and_read(run, str(tmp_path / "b"), study.read_results)


def test_a_study_lives_on_any_file_system_tensorflow_reads(tmp_path, monkeypatch):
    """A study directory and report on TensorFlow's in-memory file system (``ram://``, which stands
    for ``gs://``): a run trained, read, recorded and found there by `status`, with nothing written
    to the local disk (``os`` would have made a folder ``ram:`` in the working directory)."""
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    directory = f"ram://{tmp_path.name}/studies"
    runs = [study.Run("seed=0", {**TINY, "seed": 0, "epochs": 1})]
    report = study.Report(f"{directory}/s.json")
    assert study.run_study("s", runs, study.read_results, report.record, directory, log=lambda line: None) == [
        "seed=0"]
    assert list(report.read()["runs"]) == ["seed=0"]
    assert study.status("s", runs, directory) == {"seed=0": "read"}
    assert {"reading.json", "config.json", "history.json", "model.keras", "results.json", "checkpoints"} <= {
        name.rstrip("/") for name in tf.io.gfile.listdir(f"{directory}/s/trial_0000")}
    assert not list(tmp_path.iterdir())
