"""Studies: a fixed list of training runs, made as a keras-tuner search.

A study is a plan, a list of `Run` (a key, and the trainer settings that make the run), and a
reader that turns a finished run's model directory into what the study keeps of it. `PlanOracle`
hands the runs out in the plan's order as keras-tuner trials; `StudyTuner` trains each through the
trainer (`trainers.train.train`) in its trial directory, where an interrupted run resumes from its
own checkpoints, reads it there into ``reading.json`` and reports it; the process that holds the
oracle passes each reading to the study's recorder as its trial ends.

One process runs the whole plan. Several share it through keras-tuner's own chief/worker mode,
as ``sa-conv-tune`` does (`trainers.tune.search_role`): the same command on every process, with
``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT`` (the chief's address) set on all, and
``KERASTUNER_TUNER_ID`` ``chief`` on the chief and a distinct name on each worker, all sharing the
study's directory. The chief only hands out runs and records them. A worker (or a single process)
killed mid-run and started again with the same ``KERASTUNER_TUNER_ID`` gets its run back and
resumes it; a restarted chief hands each run under way back to its worker. A run that fails stops
its process with the error; started again, it tries that run again.
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import dataclasses
import json
import os
from typing import Callable

import keras_tuner as kt
from keras_tuner.engine import base_tuner

from sa_conv.errors import ConfigError
from trainers import cli, files, run_files, tune

READING = "reading.json"  # a read run, in its trial directory
OBJECTIVE = kt.Objective("best_val_accuracy", "max")  # keras-tuner needs one; a study chooses nothing


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a plan: ``key`` names it in the study's report, ``flags`` are its
    `trainers.config.TrainConfig` settings (``model_dir`` aside: its trial directory)."""
    key: str
    flags: dict


class PlanOracle(tune.OracleFiles, kt.Oracle):
    """Hands out the runs of ``keys`` in order, each once; a run's trial holds its key as the
    fixed hyperparameter ``run``. ``record(key, trial_dir)`` is called in this process as each
    run's trial completes."""

    def __init__(self, keys, record: Callable[[str, str], None]):
        super().__init__(objective=OBJECTIVE)
        self.keys, self.record = list(keys), record
        self.verbose = 0  # `StudyTuner` says what runs; keras-tuner's table has one column, the key
        self._held = {}

    def populate_space(self, trial_id):
        started = {trial.hyperparameters.values.get("run") for trial in self.trials.values()}
        for key in self.keys:
            if key not in started:
                return {"status": kt.engine.trial.TrialStatus.RUNNING, "values": {"run": key}}
        return {"status": kt.engine.trial.TrialStatus.STOPPED}

    @kt.synchronized
    def end_trial(self, trial):
        super().end_trial(trial)
        trial = self.trials[trial.trial_id]
        if trial.status == kt.engine.trial.TrialStatus.COMPLETED:
            # keras-tuner's lock is not released when this raises: the chief would never exit. The
            # run stays completed, and `run_study` records it again at the end.
            try:
                self.record(trial.hyperparameters.values["run"], self._get_trial_dir(trial.trial_id))
            except Exception as error:  # noqa: BLE001
                print(f"Run {trial.hyperparameters.values['run']} not recorded yet: {error!r}", flush=True)

    def set_state(self, state):
        super().set_state(state)
        self._held = dict(self.ongoing_trials)

    def reload(self):
        """As keras-tuner's, but each run under way stays with the worker that had it (started
        again with its ``KERASTUNER_TUNER_ID``, it resumes it), and only the runs no worker holds,
        those a kill caught between keras-tuner's two writes included, are handed out again, the
        plan's order first."""
        super().reload()
        running = kt.engine.trial.TrialStatus.RUNNING
        self.ongoing_trials = {tuner: trial for tuner, trial in self._held.items() if trial.status == running}
        held = {trial.trial_id for trial in self.ongoing_trials.values()}
        self._retry_queue = sorted((i for i, trial in self.trials.items() if trial.status == running and i not in held),
                                   reverse=True)


class StudyTuner(tune.TunerFiles, base_tuner.BaseTuner):
    """Trains and reads the plan's runs: ``read(model_dir, run)`` is the study's reader."""

    def __init__(self, runs, read, record, directory: str, project_name: str, log=print):
        self.runs, self.read, self.log = {run.key: run for run in runs}, read, log
        if len(self.runs) != len(runs):
            raise ValueError("The plan names a run twice: each key once.")
        super().__init__(oracle=PlanOracle(self.runs, record), directory=directory, project_name=project_name)

    def on_search_begin(self):
        # A process killed in its first run has written no tuner file, without which keras-tuner
        # would not reload the oracle: the run would start again as another trial.
        if not self._is_worker():
            self.save()

    def on_trial_begin(self, trial):
        key = trial.hyperparameters.values["run"]
        position = list(self.runs).index(key) + 1 if key in self.runs else "?"
        self.log(f"[{position}/{len(self.runs)}] {key}: trial {trial.trial_id} on {self.tuner_id}")

    def run_trial(self, trial, *args, **kwargs):
        run = self.runs.get(trial.hyperparameters.values["run"])
        if run is None:
            raise kt.errors.FatalError(
                f"The study's state in {self.project_dir} hands this process run "
                f"{trial.hyperparameters.values['run']!r}, which its plan does not have: start the chief and every "
                f"worker with the same plan (a worker keeps the plan it started with), or give this plan another "
                f"directory.")
        trial_dir = self.get_trial_dir(trial.trial_id)
        try:
            return {OBJECTIVE.name: train_and_read(run, trial_dir, self.read, self.log)[OBJECTIVE.name]}
        except Exception as error:  # stop the worker: started again, it resumes this run
            raise kt.errors.FatalError(f"Run {run.key} failed in {trial_dir}: {error}") from error


def train_and_read(run: Run, model_dir: str, read, log=print) -> dict:
    """Trains ``run`` in ``model_dir`` unless it has finished (resuming from its checkpoints),
    reads it with ``read(model_dir, run)`` into `READING` unless it has been read, and returns the
    reading: ``key``, ``flags``, the trainer's ``best_val_accuracy`` and ``precision``, then the
    reader's."""
    if files.exists(os.path.join(model_dir, READING)):
        reading = read_trial(model_dir)
        if reading["key"] != run.key:
            raise ConfigError(f"{model_dir} holds run {reading['key']!r}, not {run.key!r}: give this plan its own "
                              f"study directory.")
        return reading
    recorded = run_files.read_config(model_dir) or {}
    changed = sorted(k for k, v in run.flags.items() if k in recorded and recorded[k] != v)
    if changed:
        raise ConfigError(f"{model_dir} holds a run with other settings ({', '.join(changed)}) than {run.key!r}: give "
                          f"this plan its own study directory.")
    import keras

    from trainers import config as config_lib
    from trainers import train

    if not run_files.finished(model_dir):
        log(f"{run.key}: training in {model_dir} ...")
        train.train(config_lib.make_config(overrides={**run.flags, "model_dir": model_dir}), log=log)
        keras.backend.clear_session()
    log(f"{run.key}: reading ...")
    results = run_files.read_results(model_dir, required=True)
    reading = {"key": run.key, "flags": run.flags, "best_val_accuracy": results["best_val_accuracy"],
               "precision": run_files.read_precision(model_dir), **read(model_dir, run)}
    keras.backend.clear_session()
    tune.write_json_atomically(os.path.join(model_dir, READING), reading)
    return reading


def read_trial(trial_dir: str) -> dict:
    """The `READING` of a completed trial."""
    return json.loads(files.read_text(os.path.join(trial_dir, READING)))


def run_study(name: str, runs: list[Run], read, record, directory: str, log=print) -> list[str]:
    """Makes every run of ``runs`` not yet made in ``directory``/``name`` (in this process, or
    with its share in keras-tuner's distributed mode), passing each completed run to
    ``record(key, reading)`` in the process that holds the oracle; there, at the end, every
    completed run of the plan is passed again (a record is idempotent), so that a run whose
    trial ended just before a kill is not lost. Returns the keys this process recorded. Every run's
    settings are checked first (`check`), and the process split into the logical CPU devices they
    ask for (``cpu_devices``, one count for the study: its runs share the process)."""
    from trainers import distribute

    counts = sorted({config.cpu_devices for config in check(runs)})
    if len(counts) > 1:
        raise ConfigError(f"The plan's runs ask for {counts} logical CPU devices (cpu_devices); its runs train in one "
                          "process, which splits its CPU once: give them one count.")
    distribute.configure_cpu_devices(counts[0] if counts else 1)
    role = tune.search_role()
    recorded = []

    def on_end(key, trial_dir):
        record(key, read_trial(trial_dir))
        recorded.append(key)

    tuner = StudyTuner(runs, read, on_end, directory=directory, project_name=name, log=log)
    tuner.search()
    if role == "worker":
        return recorded
    done = {trial.hyperparameters.values["run"]: trial for trial in tuner.oracle.trials.values()
            if trial.status == kt.engine.trial.TrialStatus.COMPLETED}
    for key, trial in done.items():
        if key in tuner.runs and key not in recorded:
            on_end(key, tuner.get_trial_dir(trial.trial_id))
    missing = [run.key for run in runs if run.key not in done]
    if missing:
        log(f"Not made: {', '.join(missing)} (their trials failed; see keras-tuner's trial.json).")
    return recorded


def status(name: str, runs: list[Run], directory: str) -> dict:
    """``{key: "read" | "trained, to read" | "under way after epoch N" | "to train"}`` for the plan's runs, from the
    trial directories in ``directory``/``name`` (read only; no oracle is started)."""
    project = os.path.join(directory, name)
    found = {}
    for trial in sorted(files.listdir(project)) if files.isdir(project) else []:
        path = os.path.join(project, trial, "trial.json")
        if files.exists(path):
            key = json.loads(files.read_text(path))["hyperparameters"]["values"].get("run")
            found[key] = os.path.join(project, trial)
    result = {}
    for run in runs:
        trial_dir = found.get(run.key)
        if trial_dir and files.exists(os.path.join(trial_dir, READING)):
            result[run.key] = "read"
        elif trial_dir and run_files.finished(trial_dir):
            result[run.key] = "trained, to read"
        elif trial_dir and (done := run_files.epochs_done(trial_dir)):
            result[run.key] = f"under way after epoch {done}"
        else:
            result[run.key] = "to train"
    return result


def read_results(model_dir: str, run: Run) -> dict:
    """The reader of a study that keeps what the trainer's ``results.json`` says of a run."""
    results = run_files.read_results(model_dir, required=True)
    return {name: results[name] for name in ("test_accuracy", "train_accuracy", "best_epoch", "parameters",
                                             "epochs", "images_per_second", "weights_sha256")}


class Report:
    """A study's JSON at ``path``: ``runs`` (each reading by its key, as ``keep`` keeps it),
    ``notes``, and what ``derive(runs)`` makes of the runs. Written only by the process that holds
    the oracle, atomically, after each run. ``keep`` sees each reading with its ``key``, and sees again the runs the
    report holds: what it keeps is the same run kept again, and a run recorded under an earlier rule follows today's."""

    def __init__(self, path: str, derive=lambda runs: {}, keep=None, note: str | None = None):
        # By default a run as it was read, but its key: the report holds it under the key.
        keep = keep or (lambda reading: {k: v for k, v in reading.items() if k != "key"})
        self.path, self.derive, self.keep, self.note = path, derive, keep, note

    def read(self) -> dict:
        if not files.exists(self.path):
            return {"runs": {}, "notes": []}
        return json.loads(files.read_text(self.path))

    def record(self, key: str, reading: dict) -> dict:
        report = self.read()
        report["runs"] = {k: self.keep({**run, "key": k}) for k, run in {**report["runs"], key: reading}.items()}
        if self.note and self.note not in report.setdefault("notes", []):
            report["notes"].append(self.note)
        report.update(self.derive(report["runs"]))
        files.write_json(self.path, report, indent=1, inline_numbers=True)
        return report


# ------------------------------------------------------------------------------ CLI


@dataclasses.dataclass
class StudyConfig:
    plan: str = cli.config_field("", "A JSON file: a list of runs, each {\"key\": ..., \"flags\": {trainer settings}}.")
    directory: str = cli.config_field("studies", "Root of the studies' trial directories.")
    name: str = cli.config_field("study", "The study (its subdirectory of --directory).")
    output: str = cli.config_field("", "The study's report (JSON); default: DIRECTORY/NAME.json.")
    dry_run: bool = cli.config_field(False, "List the plan's runs and where each stands; train nothing.")

    def validate(self):
        if not self.plan:
            raise ConfigError("--plan is required: a JSON file listing the runs.")


def check(runs: list[Run]) -> list:
    """Each run's `trainers.config.TrainConfig`; ConfigError naming the first run whose settings no trainer
    config takes (`TrainConfig.validate`): a study stops before any run trains, not when it reaches the wrong one
    hours later."""
    from trainers.config import make_config

    configs = []
    for run in runs:
        try:
            configs.append(make_config(overrides=run.flags))
        except ConfigError as exc:
            raise ConfigError(f"Run {run.key!r}: {exc}") from None
    return configs


def load_plan(path: str) -> list[Run]:
    """The runs of a plan file; ConfigError naming what is wrong with the file (`run_study` checks
    the runs' settings)."""
    try:
        entries = json.loads(files.read_text(path))
        runs = [Run(entry["key"], dict(entry["flags"])) for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"--plan {path!r}: {error!r}; a plan is a JSON list of "
                          '{"key": "...", "flags": {...}}.') from None
    return runs


def main():
    config = cli.make(StudyConfig, cli.settings(StudyConfig))
    runs = load_plan(config.plan)
    if config.dry_run:
        check(runs)
        for key, state in status(config.name, runs, config.directory).items():
            print(f"{key}: {state}")
        return
    report = Report(config.output or os.path.join(config.directory, f"{config.name}.json"))
    run_study(config.name, runs, read_results, report.record, files.absolute(config.directory))


def run():
    """Console script ``sa-conv-study``."""
    cli.run("sa-conv-study", main, StudyConfig)


if __name__ == "__main__":
    run()
