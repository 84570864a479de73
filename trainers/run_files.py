"""The files a training run (`trainers.train`) leaves in its ``--model_dir`` for other programs
to read, named once here so that the trainer and its readers agree on them:

* ``config.json``: the resolved flags and the process (`trainers.process`), written at the start;
* ``history.json``: one record per finished epoch, written just before the epoch's checkpoint,
  so a run interrupted at any moment has trained exactly the epochs it records; each names the
  CPU class it ran on (`trainers.process.cpu_class`), as a run may resume on another machine;
* ``model.keras``, the trained model, then ``results.json``, the test evaluation, written last
  (`programs.import_reference` writes both for an imported model): a directory with a
  ``results.json`` holds a finished run;
* ``snapshots/epoch_<EEE>.keras``: the model at the start, every ``--snapshot_every`` epochs and
  at the end.
"""

from __future__ import annotations

import json
import os
import re

from trainers import files

CONFIG = "config.json"
HISTORY = "history.json"
RESULTS = "results.json"
MODEL = "model.keras"
BEST_MODEL = "best_model.keras"  # the model at its best validation accuracy so far
SNAPSHOTS = "snapshots"
CHECKPOINTS = "checkpoints"  # the training checkpoints a resumed run restores (`trainers.checkpoints`)
# A snapshot being written is `epoch_<EEE>.keras.tmp.keras` (`checkpoints.save_keras_atomically`).
_SNAPSHOT = re.compile(r"epoch_(\d+)\.keras")


def write(model_dir: str, name: str, value) -> None:
    """Writes ``value`` to the file ``name`` (one of the names above) in ``model_dir``,
    atomically (`trainers.files.write_json`)."""
    files.write_json(os.path.join(model_dir, name), value, sort_keys=True)


def read_config(model_dir: str) -> dict | None:
    """The run's resolved flags and process, or None when ``model_dir`` has no ``config.json``."""
    return _read(model_dir, CONFIG, None)


def data_location(config: dict) -> tuple[str | None, str | None]:
    """``(dataset, data_dir)`` of the run whose ``config.json`` is ``config``, their paths absolute
    as the trainer resolved them (``data_location``; runs from before it recorded that: as given,
    relative to the directory it was started from)."""
    location = config.get("data_location") or config
    return location.get("dataset"), location.get("data_dir")


def read_precision(model_dir: str) -> str:
    """The dtype policy the run in ``model_dir`` trains in (``--mixed_precision=auto`` resolved), as its
    ``config.json`` records it."""
    return read_config(model_dir)["precision"]["policy"]


def read_history(model_dir: str) -> list[dict]:
    """The run's per-epoch records, oldest first; ``[]`` before its first epoch has finished."""
    return _read(model_dir, HISTORY, [])


def read_results(model_dir: str, required: bool = False) -> dict | None:
    """The finished run's results, or None while it is unfinished; with ``required``, an
    unfinished run raises FileNotFoundError naming the directory and how to finish it."""
    results = _read(model_dir, RESULTS, None)
    if results is None and required:
        raise FileNotFoundError(
            f"{model_dir} holds no finished run (no {RESULTS}): run sa-conv-train --model_dir={model_dir} "
            f"with the flags it was started with to finish it.")
    return results


def finished(model_dir: str) -> bool:
    """Whether ``model_dir`` holds a finished run (its ``results.json``)."""
    return files.exists(os.path.join(model_dir, RESULTS))


def epochs_done(model_dir: str) -> int:
    """The epochs the run in ``model_dir`` has trained, as its ``history.json`` records them."""
    return last_epoch(read_history(model_dir))


def last_epoch(history: list[dict]) -> int:
    """The last epoch a run's ``history.json`` records (`read_history`); 0 before any."""
    return max((record["epoch"] for record in history), default=0)


def snapshot_path(model_dir: str, epoch: int) -> str:
    """The path of the model snapshot taken after ``epoch`` epochs (0: at the start)."""
    return os.path.join(model_dir, SNAPSHOTS, f"epoch_{epoch:03d}.keras")


def snapshot_epochs(model_dir: str) -> list[int]:
    """The epochs of the snapshots in ``model_dir``, ascending; ``[]`` without any."""
    folder = os.path.join(model_dir, SNAPSHOTS)
    if not files.isdir(folder):
        return []
    return sorted(int(match[1]) for match in map(_SNAPSHOT.fullmatch, files.listdir(folder)) if match)


def _read(model_dir: str, name: str, missing):
    try:
        return json.loads(files.read_text(os.path.join(model_dir, name)))
    except FileNotFoundError:
        return missing
