"""Hyperparameter search with keras-tuner (``python -m trainers.tune``, ``sa-conv-tune``).

Trials train with the trainer's own loop (`trainers.train.Trainer`): the same data and
validation split (never the test split), per-step schedule, weight decay and ``tf.distribute``
strategy (created once and handed to the tuner as ``distribution_strategy``). Each trial's
``HyperModel.fit`` drives the keras-tuner callbacks (best-epoch checkpoint, Hyperband's epoch
reporting) from that loop.

Search spaces are lists of hyperparameters in one JSON form (``--search_space`` is a name from
`SEARCH_SPACES` or a JSON file)::

    {"base_model": "sa_quadratic_small",
     "hyperparameters": [
        {"name": "encoding", "type": "choice", "values": ["quadratic", "learned"]},
        {"name": "num_layers", "type": "int", "min": 1, "max": 3},
        {"name": "learning_rate", "type": "float", "min": 0.01, "max": 0.3, "sampling": "log"},
        {"name": "dropout", "type": "fixed", "value": 0.0}]}

Names are model fields (`MODEL_HYPERPARAMETERS`) or training settings
(`TRAINING_HYPERPARAMETERS`). The space is checked before any trial starts.

Distributed search uses keras-tuner's own mode, the same command on every process: a chief holds
the oracle and workers run trials in parallel, each with the trainer's loop and its own
``--strategy``. Set ``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT`` (the chief's address)
on all, and ``KERASTUNER_TUNER_ID`` to ``chief`` on the chief and a distinct name (``tuner0``,
``tuner1``, ...) on each worker; all share ``--directory`` (a shared filesystem across hosts).
The chief writes the reports once every trial has ended. A worker that dies mid-trial is
restarted with the same ``KERASTUNER_TUNER_ID``: the oracle hands it its unfinished trial again.

Outputs in ``directory/project_name``: keras-tuner's state (a rerun of the same command resumes
the search; finished trials are not run again), ``trials.csv`` (one row per trial:
hyperparameters, objective, epochs, precision, wall time), ``best_hyperparameters.json`` (the best
trial's hyperparameters, score and precision) and, with
``--retrain_best``, ``best_run/``: a normal trainer ``model_dir`` that ``sa-conv-export`` accepts.
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import copy
import csv
import dataclasses
import glob
import io
import json
import os
import time

import keras_tuner as kt

import sa_conv
from trainers import cli, files
from trainers import data as data_lib
from sa_conv.errors import ConfigError
from trainers import distribute
from trainers.checkpoints import TrainingError
from trainers.config import TrainConfig, default_keep_freed_memory, make_config
from trainers.recipes import RECIPES
from trainers.task import Task, resolve_model_config
from trainers.train import Trainer, train

# Trainer settings a trial does without (`SaConvHyperModel.fit`), which the retrained best run takes.
TRIALS_IGNORE = ("init_from", "snapshot_every", "attention_summaries_every")
MODEL_HYPERPARAMETERS = ("encoding", "num_heads", "num_layers", "hidden_size", "mlp_size", "dropout",
                         "attention_dropout", "stochastic_depth")
TRAINING_HYPERPARAMETERS = ("learning_rate", "weight_decay", "warmup_ratio", "momentum", "label_smoothing",
                            "rand_augment_factor", "random_erasing", "mixup_alpha", "cutmix_alpha", "ema_momentum")
TUNERS = ("hyperband", "bayesian", "random")
TYPES = ("choice", "int", "float", "fixed")

_OPTIMIZER = [
    {"name": "learning_rate", "type": "float", "min": 0.01, "max": 0.3, "sampling": "log"},
    {"name": "weight_decay", "type": "float", "min": 1e-5, "max": 1e-3, "sampling": "log"},
    {"name": "warmup_ratio", "type": "float", "min": 0.0, "max": 0.1},
]
# The small-data recipe's (--recipe=small_data) settings around its defaults: the same space for
# an attention preset and for ResNet20, so that both get the same search.
_SMALL_DATA = [
    {"name": "learning_rate", "type": "float", "min": 2e-4, "max": 2e-3, "sampling": "log"},
    {"name": "weight_decay", "type": "float", "min": 0.01, "max": 0.1, "sampling": "log"},
    {"name": "rand_augment_factor", "type": "float", "min": 0.1, "max": 0.9, "step": 0.2},
    {"name": "stochastic_depth", "type": "float", "min": 0.0, "max": 0.2, "step": 0.05},
    {"name": "label_smoothing", "type": "float", "min": 0.0, "max": 0.2, "step": 0.05},
]
SEARCH_SPACES = {
    # The paper's model family at CPU size: encodings, K*K heads, width, depth, regularization.
    "attention_small": {"base_model": "sa_quadratic_small", "hyperparameters": [
        {"name": "encoding", "type": "choice", "values": list(sa_conv.ENCODINGS)},
        {"name": "num_heads", "type": "choice", "values": [4, 9, 16]},
        {"name": "hidden_size", "type": "choice", "values": [32, 64, 128]},
        {"name": "num_layers", "type": "int", "min": 1, "max": 4},
        {"name": "mlp_size", "type": "choice", "values": [64, 128, 256]},
        {"name": "dropout", "type": "float", "min": 0.0, "max": 0.3, "step": 0.1},
        *_OPTIMIZER,
    ]},
    # Around the paper's configuration, for a GPU host.
    "attention": {"base_model": "sa_quadratic", "hyperparameters": [
        {"name": "encoding", "type": "choice", "values": list(sa_conv.ENCODINGS)},
        {"name": "num_heads", "type": "choice", "values": [4, 9, 16]},
        {"name": "hidden_size", "type": "choice", "values": [256, 400, 512]},
        {"name": "num_layers", "type": "int", "min": 4, "max": 8},
        {"name": "mlp_size", "type": "choice", "values": [512, 1024]},
        {"name": "dropout", "type": "float", "min": 0.0, "max": 0.3, "step": 0.1},
        *_OPTIMIZER,
    ]},
    "resnet": {"base_model": "resnet18", "hyperparameters": list(_OPTIMIZER)},
    # With --recipe=small_data: its learning rate, weight decay, augmentation strength, stochastic
    # depth and label smoothing, on an attention preset and on the small ResNet.
    "small_data": {"base_model": "sa_quadratic_small", "recipe": "small_data", "hyperparameters": list(_SMALL_DATA)},
    "small_data_resnet": {"base_model": "resnet20", "recipe": "small_data", "hyperparameters": list(_SMALL_DATA)},
    # A few-second space for smoke tests.
    "tiny": {"base_model": "sa_quadratic_small", "hyperparameters": [
        {"name": "encoding", "type": "choice", "values": ["quadratic", "learned"]},
        {"name": "num_layers", "type": "fixed", "value": 1},
        {"name": "hidden_size", "type": "choice", "values": [16, 32]},
        {"name": "learning_rate", "type": "float", "min": 0.02, "max": 0.2, "sampling": "log"},
    ]},
}


@dataclasses.dataclass
class TuneConfig:
    tuner: str = dataclasses.field(default="hyperband", metadata={"help": "Search algorithm.", "choices": TUNERS})
    max_trials: int = dataclasses.field(default=20, metadata={"help": "Trials (bayesian, random)."})
    max_epochs: int = dataclasses.field(default=10, metadata={"help": "Epochs per trial (Hyperband: the most)."})
    executions_per_trial: int = dataclasses.field(default=1, metadata={"help": "Trainings per trial, averaged."})
    objective: str = dataclasses.field(default="val_accuracy", metadata={
        "help": "Validation metric to optimize.", "choices": ("val_accuracy", "val_loss")})
    search_space: str = dataclasses.field(default="attention_small", metadata={
        "help": f"A named space ({', '.join(SEARCH_SPACES)}) or a JSON file."})
    directory: str = dataclasses.field(default="tuning", metadata={"help": "Root of the tuner's projects."})
    project_name: str = dataclasses.field(default="sa_conv", metadata={"help": "Project (subdirectory)."})
    overwrite: bool = dataclasses.field(default=False, metadata={
        "help": "Start the search over; off: an interrupted search resumes."})
    retrain_best: bool = dataclasses.field(default=False, metadata={
        "help": "Train the best configuration with the full trainer (--epochs) into project/best_run."})

    def validate(self):
        if self.tuner not in TUNERS:
            raise ConfigError(f"--tuner={self.tuner!r} is not one of {TUNERS}.")
        for name in ("max_trials", "max_epochs", "executions_per_trial"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be a positive integer, got {getattr(self, name)}.")
        if self.tuner == "hyperband" and self.max_epochs < 2:
            raise ConfigError("--tuner=hyperband needs --max_epochs >= 2.")


# ------------------------------------------------------------------------------ search spaces


def load_search_space(spec: str | dict, base: TrainConfig | None = None) -> dict:
    """A named space, a JSON file path or a dict; validated for the search's ``base`` settings
    (see `validate_search_space`)."""
    if isinstance(spec, dict):
        space = spec
    elif spec in SEARCH_SPACES:
        space = copy.deepcopy(SEARCH_SPACES[spec])
    elif os.path.isfile(spec):
        try:
            with open(spec) as f:
                space = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--search_space file {spec!r} is not valid JSON: {exc}") from None
    else:
        raise ConfigError(f"--search_space {spec!r} is neither a named space ({', '.join(SEARCH_SPACES)}) nor a file.")
    validate_search_space(space, base)
    return space


def _values(entry):
    kind = entry["type"]
    if kind == "choice":
        return list(entry["values"])
    if kind == "fixed":
        return [entry["value"]]
    return [entry["min"], entry["max"]]


def validate_search_space(space: dict, settings: TrainConfig | None = None) -> None:
    """Raises ConfigError naming the entry, before any trial: unknown names or types, bad
    ranges, and values that no model of the model the trials train (`trial_model`) accepts with
    the search's model ``settings`` (each value tried on its own)."""
    if not isinstance(space, dict) or "hyperparameters" not in space:
        raise ConfigError("A search space is a JSON object with 'base_model' and 'hyperparameters'.")
    base = trial_model(space, settings)
    fixed = settings.model_overrides() if settings else {}
    if base not in sa_conv.PRESETS:
        raise ConfigError(f"search space base_model {base!r} is not a preset ({', '.join(sa_conv.PRESETS)}).")
    try:  # the search's own model settings on the trials' model, whatever the space searches
        sa_conv.get_config(base, **fixed)
    except ValueError as exc:
        raise ConfigError(f"The search's model settings on its base_model {base}: {exc}") from None
    if space.get("recipe", "paper") not in RECIPES:
        raise ConfigError(f"search space recipe {space['recipe']!r} is not one of {', '.join(RECIPES)}.")
    seen = set()
    for i, entry in enumerate(space["hyperparameters"]):
        where = f"search space entry {i} ({entry.get('name', '?') if isinstance(entry, dict) else entry!r})"
        if not isinstance(entry, dict) or "name" not in entry or "type" not in entry:
            raise ConfigError(f"{where}: each entry needs 'name' and 'type'.")
        name, kind = entry["name"], entry["type"]
        if name not in MODEL_HYPERPARAMETERS + TRAINING_HYPERPARAMETERS:
            raise ConfigError(f"{where}: unknown hyperparameter; known: "
                              f"{', '.join(MODEL_HYPERPARAMETERS + TRAINING_HYPERPARAMETERS)}.")
        if name in seen:
            raise ConfigError(f"{where}: {name!r} appears twice.")
        seen.add(name)
        if kind not in TYPES:
            raise ConfigError(f"{where}: type {kind!r} is not one of {TYPES}.")
        required = {"choice": ("values",), "fixed": ("value",), "int": ("min", "max"), "float": ("min", "max")}[kind]
        missing = [key for key in required if key not in entry]
        if missing:
            raise ConfigError(f"{where}: a {kind} needs {missing}.")
        if kind == "choice" and not isinstance(entry["values"], list):
            raise ConfigError(f"{where}: 'values' must be a list, got {entry['values']!r}.")
        if kind == "choice" and not entry["values"]:
            raise ConfigError(f"{where}: 'values' is empty.")
        if kind in ("int", "float"):
            number = int if kind == "int" else (int, float)
            for key in ("min", "max", "step"):
                value = entry.get(key)
                if key in entry and value is not None and (isinstance(value, bool) or not isinstance(value, number)):
                    raise ConfigError(f"{where}: {key} must be {'an integer' if kind == 'int' else 'a number'}, "
                                      f"got {value!r}.")
            if not entry["min"] < entry["max"]:
                raise ConfigError(f"{where}: min {entry['min']} must be below max {entry['max']}.")
            if entry.get("sampling", "linear") not in ("linear", "log", "reverse_log"):
                raise ConfigError(f"{where}: sampling must be linear, log or reverse_log.")
            if entry.get("sampling") == "log" and entry["min"] <= 0:
                raise ConfigError(f"{where}: log sampling needs min > 0.")
        for value in _values(entry):
            try:
                if name in MODEL_HYPERPARAMETERS:
                    sa_conv.get_config(base, **{**fixed, name: value})
                else:
                    make_config(overrides={name: value})
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where}: value {value!r} is invalid: {exc}") from None


def define_hyperparameters(hp: kt.HyperParameters, space: dict) -> dict:
    """Registers the space's hyperparameters on ``hp``; returns their current values."""
    values = {}
    for entry in space["hyperparameters"]:
        name, kind = entry["name"], entry["type"]
        if kind == "choice":
            values[name] = hp.Choice(name, entry["values"])
        elif kind == "fixed":
            values[name] = hp.Fixed(name, entry["value"])
        elif kind == "int":
            values[name] = hp.Int(name, entry["min"], entry["max"], step=entry.get("step", 1),
                                  sampling=entry.get("sampling", "linear"))
        else:
            values[name] = hp.Float(name, entry["min"], entry["max"], step=entry.get("step"),
                                    sampling=entry.get("sampling", "linear"))
    return values


def trial_model(space: dict, base: TrainConfig | None = None) -> str:
    """The preset the trials train: the space's ``base_model``, else ``--model``."""
    return space.get("base_model", base.model if base else TrainConfig.model)


def trial_config(base: TrainConfig, space: dict, values: dict, epochs: int, model_dir: str) -> TrainConfig:
    """The trainer's configuration for one set of hyperparameter values."""
    overrides = {**dataclasses.asdict(base), "model": trial_model(space, base), "epochs": epochs,
                 "model_dir": model_dir, "max_steps": None}
    overrides.update({k: v for k, v in values.items()})
    return make_config(overrides=overrides)


# ------------------------------------------------------------------------------ hypermodel


class SaConvHyperModel(kt.HyperModel):
    """Builds sa_conv models from a search space; ``fit`` trains with the trainer's loop."""

    def __init__(self, space: dict, base: TrainConfig, strategy, dataset: data_lib.ImageData, log=print):
        super().__init__(name="sa_conv")
        if base.prune_degenerate_heads:
            raise ConfigError(
                "--prune_degenerate_heads changes a model's architecture during a trial, which "
                "keras-tuner cannot reload; search without it, then train the chosen configuration "
                "with sa-conv-train --prune_degenerate_heads."
            )
        self.space, self.base, self.strategy, self.dataset, self.log = space, base, strategy, dataset, log
        self.tasks = {}  # id(model) -> the Task that built it, until its fit

    def task(self, config: TrainConfig) -> Task:
        return Task(config, replicas=self.strategy.num_replicas_in_sync, dataset=self.dataset, log=self.log)

    def build(self, hp):
        """The trial's model, from its `Task` (which ``fit`` then trains: the model configuration
        is resolved once per trial)."""
        values = define_hyperparameters(hp, self.space)
        # No output folder: --model_dir may hold another run, whose precision a Task resuming it would keep
        # (`trainers.precision.training_policy`); a trial resolves its own.
        config = trial_config(self.base, self.space, values, self.base.epochs, "")
        task = self.task(config)
        # Every trial starts from --seed: its initial weights, dropout and data order do not depend
        # on the trials before it (nor, in a distributed search, on which worker runs it).
        process.seed(self.base.seed)
        with self.strategy.scope():
            model = task.build_model()
        self.tasks[id(model)] = task
        return model

    def fit(self, hp, model, *args, epochs=1, initial_epoch=0, callbacks=(), trial_dir=None, **kwargs):
        values = {entry["name"]: hp.get(entry["name"]) for entry in self.space["hyperparameters"]}
        config = trial_config(self.base, self.space, values, epochs, trial_dir or self.base.model_dir)
        task = self.tasks.pop(id(model), None)
        trainer = Trainer(config, strategy=self.strategy, log=self.log, task=task or self.task(config))
        trainer.prepare(model)
        start = time.perf_counter()
        history, _ = trainer.train_epochs(initial_epoch, [], callbacks=callbacks, save=False)
        if trial_dir:
            files.write_json(_record_path(trial_dir),
                             {**_read_record(trial_dir), "status": "completed", "epochs": epochs,
                              "initial_epoch": initial_epoch, "precision": trainer.task.precision, "history": history,
                              "wall_time_seconds": time.perf_counter() - start})
        best = max(history, key=lambda h: h["val_accuracy"])
        return {"val_accuracy": best["val_accuracy"], "val_loss": best["val_loss"]}


def search_keeps_freed_memory(base: TrainConfig, space: dict, dataset, strategy) -> bool:
    """The allocator setting of a whole search (set once per process, `trainers.process`):
    ``--keep_freed_memory``, or its default for the space's base model on this data."""
    if base.keep_freed_memory is not None:
        return base.keep_freed_memory
    base = dataclasses.replace(base, model=trial_model(space, base))
    model_config = resolve_model_config(base, dataset, base.global_batch_size // strategy.num_replicas_in_sync, log=None)
    return default_keep_freed_memory(model_config)


ORACLE_ENVIRONMENT = ("KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT", "KERASTUNER_TUNER_ID")


def search_role() -> str:
    """``"single"``, or in keras-tuner's distributed mode ``"chief"`` or ``"worker"``, from its
    environment variables (checked here so that a missing one is named before any work)."""
    if "KERASTUNER_ORACLE_IP" not in os.environ:
        return "single"
    missing = [name for name in ORACLE_ENVIRONMENT if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"KERASTUNER_ORACLE_IP is set (distributed search) but {', '.join(missing)} is not: set "
            "KERASTUNER_ORACLE_PORT to the chief's port and KERASTUNER_TUNER_ID to 'chief' on the chief "
            "and to a distinct name (tuner0, tuner1, ...) on each worker."
        )
    return "chief" if "chief" in os.environ["KERASTUNER_TUNER_ID"] else "worker"


def _record_path(trial_dir):
    return os.path.join(trial_dir, "sa_conv_trial.json")


def _read_record(trial_dir) -> dict:
    path = _record_path(trial_dir)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def write_json_atomically(path: str, value) -> None:
    """``value`` as compact JSON at ``path``, whole or not at all, on any file system TensorFlow
    reads (`trainers.files.write_text`: ``gs://...`` included, where the rename is a copy)."""
    files.write_text(path, json.dumps(value))


class OracleFiles:
    """Mixed in before a keras-tuner Oracle: ``oracle.json`` and each ``trial.json`` written by
    `write_json_atomically` (keras-tuner truncates then writes: a search killed in between would
    leave a file its rerun cannot read)."""

    def save(self):
        write_json_atomically(self._get_oracle_fname(), self.get_state())

    def _save_trial(self, trial):
        write_json_atomically(os.path.join(self._get_trial_dir(trial.trial_id), "trial.json"), trial.get_state())


class TunerFiles:
    """Mixed in before a keras-tuner tuner: its own state file written by `write_json_atomically`."""

    def save(self):
        if not self._is_worker():
            self.oracle.save()
        write_json_atomically(self._get_tuner_fname(), self.get_state())


class HyperbandOracle(OracleFiles, kt.oracles.HyperbandOracle):
    pass


class BayesianOracle(OracleFiles, kt.oracles.BayesianOptimizationOracle):
    pass


class RandomOracle(OracleFiles, kt.oracles.RandomSearchOracle):
    pass


class _Tuner(TunerFiles):
    """Adds the trial directory to ``fit``'s arguments and records who ran each trial how often
    (``tuner_id``, ``attempts`` in ``sa_conv_trial.json``). Built on the oracle given, one of the
    `OracleFiles` oracles (keras-tuner's tuner classes would make their own)."""

    def __init__(self, hypermodel, oracle, **kwargs):
        kt.Tuner.__init__(self, oracle=oracle, hypermodel=hypermodel, **kwargs)

    def run_trial(self, trial, *args, **kwargs):
        trial_dir = self.get_trial_dir(trial.trial_id)
        os.makedirs(trial_dir, exist_ok=True)
        attempts = _read_record(trial_dir).get("attempts", 0) + 1
        files.write_json(_record_path(trial_dir), {"tuner_id": self.tuner_id, "attempts": attempts,
                                                   "status": "running"})
        self.hypermodel.log(f"Trial {trial.trial_id} started on {self.tuner_id} (attempt {attempts}).")
        return super().run_trial(trial, *args, trial_dir=trial_dir, **kwargs)

    def on_trial_end(self, trial):
        super().on_trial_end(trial)  # the oracle records the trial's end
        self.hypermodel.log(f"Trial {trial.trial_id} ended and is recorded ({self.tuner_id}).")


class HyperbandTuner(_Tuner, kt.Hyperband):
    pass


class BayesianTuner(_Tuner, kt.BayesianOptimization):
    pass


class RandomTuner(_Tuner, kt.RandomSearch):
    pass


def make_oracle(config: TuneConfig, seed: int | None = None):
    """The oracle of ``config.tuner``; ``seed`` (the trainer's ``--seed``) seeds its draws, so that a
    search repeats, and two searches of one space try the same points."""
    objective = kt.Objective(config.objective, "max" if config.objective == "val_accuracy" else "min")
    seed = None if seed is None else seed + 1  # keras-tuner's oracles take a seed of 0 for none
    if config.tuner == "hyperband":
        return HyperbandOracle(objective, max_epochs=config.max_epochs, factor=3, seed=seed)
    if config.tuner == "bayesian":
        return BayesianOracle(objective, max_trials=config.max_trials, seed=seed)
    return RandomOracle(objective, max_trials=config.max_trials, seed=seed)


def make_tuner(config: TuneConfig, hypermodel, strategy, seed: int | None = None):
    """The tuner of ``config.tuner`` over `make_oracle`'s oracle."""
    common = dict(directory=config.directory, project_name=config.project_name, overwrite=config.overwrite,
                  executions_per_trial=config.executions_per_trial, distribution_strategy=strategy)
    tuner = {"hyperband": HyperbandTuner, "bayesian": BayesianTuner}.get(config.tuner, RandomTuner)
    return tuner(hypermodel, make_oracle(config, seed), **common)


# ------------------------------------------------------------------------------ reports


def write_reports(tuner, space: dict, project_dir: str) -> list[dict]:
    """``trials.csv`` (one row per finished trial) and ``best_hyperparameters.json``. A trial's ``precision`` is
    the dtype policy it trained in (``--mixed_precision=auto`` resolved by the host that ran it)."""
    names = [entry["name"] for entry in space["hyperparameters"]]
    rows = []
    for trial in sorted(tuner.oracle.trials.values(), key=lambda t: (len(t.trial_id), t.trial_id)):
        if trial.status != "COMPLETED" or trial.score is None:
            continue
        record = _read_record(tuner.get_trial_dir(trial.trial_id))
        rows.append({
            "trial_id": trial.trial_id,
            **{name: trial.hyperparameters.values.get(name) for name in names},
            "objective": trial.score,
            "epochs": record.get("epochs"),
            "precision": record.get("precision"),
            "wall_time_seconds": round(record.get("wall_time_seconds", float("nan")), 2),
        })
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=["trial_id", *names, "objective", "epochs", "precision",
                                               "wall_time_seconds"])
    writer.writeheader()
    writer.writerows(rows)
    files.write_text(os.path.join(project_dir, "trials.csv"), table.getvalue())
    best = tuner.oracle.get_best_trials(1)
    if best:
        summary = {
            "trial_id": best[0].trial_id, "objective": tuner.oracle.objective.name, "score": best[0].score,
            "base_model": space.get("base_model"),
            "hyperparameters": {k: v for k, v in best[0].hyperparameters.values.items() if k in names},
            "precision": next((row["precision"] for row in rows if row["trial_id"] == best[0].trial_id), None),
            "process": process.describe(),  # what this process's trials ran with
        }
        files.write_json(os.path.join(project_dir, "best_hyperparameters.json"), summary)
    return rows


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "(no finished trials)"
    keys = list(rows[0])
    cells = [[str(round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def check_resumable(project_dir: str) -> None:
    """Raises ConfigError naming the file when a search to resume has an unreadable JSON file
    (written by a search killed mid-write before writes were atomic)."""
    for path in [os.path.join(project_dir, "oracle.json")] + sorted(
            glob.glob(os.path.join(project_dir, "trial_*", "trial.json"))):
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"Cannot resume the search in {project_dir}: {path} is unreadable ({exc}). Delete that file "
                "(a trial.json: its trial runs again) or start over with --overwrite.") from None


def tune(config: TuneConfig, base: TrainConfig, strategy=None, log=print) -> dict:
    """Flag-free entry point: runs (or resumes) the search, writes the reports, optionally
    retrains the best configuration. Returns a summary."""
    config.validate()
    role = search_role()
    if role == "worker" and config.overwrite:
        raise ConfigError("--overwrite on a worker would delete the shared search; only the chief may start over.")
    ignored = [f"--{name}" for name in TRIALS_IGNORE if getattr(base, name)]
    if ignored:
        log(f"{', '.join(ignored)}: not used by the trials, which train from their initialization and write no "
            "snapshots or summaries (--retrain_best's run uses them).")
    if base.max_steps:
        log("--max_steps: not used by a search: its trials and --retrain_best's run train whole epochs.")
    space = load_search_space(config.search_space, base)  # before any trial
    if base.model not in (TrainConfig.model, trial_model(space, base)):  # a --model the space overrides
        log(f"--search_space={config.search_space} trains its base_model {trial_model(space, base)}: --model="
            f"{base.model} is not used.")
    if space.get("recipe", base.recipe) != base.recipe:
        raise ConfigError(f"--search_space={config.search_space} searches the {space['recipe']} recipe's settings: "
                          f"add --recipe={space['recipe']}.")
    searched = {entry["name"] for entry in space["hyperparameters"]}
    if "rand_augment_factor" in searched and "rand_augment" not in base.augmentation.split(","):
        raise ConfigError(f"--search_space={config.search_space} searches --rand_augment_factor, which does nothing "
                          f"without RandAugment: add rand_augment to --augmentation (the recorded small_data searches "
                          f"ran with --augmentation=pad_crop_flip,rand_augment,random_erasing,mixup,cutmix).")
    if config.tuner == "hyperband" and (base.ema_momentum or "ema_momentum" in searched):
        raise ConfigError("--tuner=hyperband continues trials from their weights with a new optimizer, whose average "
                          "of the weights (--ema_momentum, set or searched) would start from zero: use --tuner=random "
                          "or bayesian, or --ema_momentum=0 and a space without it.")
    strategy = strategy or distribute.create_strategy(base.strategy)
    dataset = data_lib.load_dataset(base.dataset, base.data_dir, seed=base.seed, image_size=base.image_size, log=log)
    process.keep_freed_memory(search_keeps_freed_memory(base, space, dataset, strategy))
    hypermodel = SaConvHyperModel(space, base, strategy, dataset, log=log)
    project_dir = os.path.join(config.directory, config.project_name)
    if not config.overwrite:
        check_resumable(project_dir)
    tuner = make_tuner(config, hypermodel, strategy, seed=base.seed)
    kwargs = {} if config.tuner == "hyperband" else {"epochs": config.max_epochs}
    tuner.search(**kwargs)  # on the chief: serves the oracle until every trial has ended
    if role == "worker":
        log(f"Worker {os.environ['KERASTUNER_TUNER_ID']}: no trials left; the chief writes the reports.")
        return {"project_dir": project_dir, "role": role}
    rows = write_reports(tuner, space, project_dir)
    log(format_table(rows))
    summary = {"project_dir": project_dir, "role": role, "trials": rows}
    best_path = os.path.join(project_dir, "best_hyperparameters.json")
    if os.path.isfile(best_path):
        summary["best"] = json.load(open(best_path))
        log(f"Best trial {summary['best']['trial_id']}: {config.objective} = {summary['best']['score']:.4f} "
            f"with {summary['best']['hyperparameters']}")
    if config.retrain_best:
        if "best" not in summary:
            raise TrainingError("No finished trial to retrain.")
        run_dir = os.path.join(project_dir, "best_run")
        retrain = trial_config(base, space, summary["best"]["hyperparameters"], base.epochs, run_dir)
        summary["best_run"] = train(retrain, strategy=strategy, log=log)
        summary["best_run_dir"] = run_dir
    return summary


# ------------------------------------------------------------------------------ CLI


def main():
    base = make_config(cli.settings(TrainConfig, TrainConfig, TuneConfig), {})
    distribute.configure_cpu_devices(base.cpu_devices)
    tune(cli.make(TuneConfig, cli.settings(TuneConfig, TrainConfig, TuneConfig)), base)


def run():
    """Console script ``sa-conv-tune``: the trainer's flags (and ``--config_file``, which may
    hold both the trainer's and the search's settings) plus the search's."""
    cli.run("sa-conv-tune", main, TrainConfig, TuneConfig)


if __name__ == "__main__":
    run()
