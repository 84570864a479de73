"""Import a checkpoint of the reference implementation (``epfml/attention-cnn``) as an sa-conv
model (``python -m programs.import_reference``, ``sa-conv-import-reference``).

    sa-conv-import-reference --checkpoint=best.checkpoint --config=config.yaml --model_dir=DIR
    sa-conv-export --model_dir=DIR

``--config`` is the reference run's ``config.yaml`` (or the same as JSON); it decides the model
(`sa_conv.reference.model_config`). ``--checkpoint`` is its PyTorch checkpoint (needs torch:
``pip install .[reference]``) or an ``.npz`` of the state dict (see
`sa_conv.reference.read_state_dict`). Writes ``DIR/model.keras``, ``DIR/results.json`` (what
`sa-conv-export` records) and ``DIR/reference_config.json``; an existing ``model.keras`` is
replaced only with ``--overwrite``.
"""

from __future__ import annotations

from trainers import process

process.configure_if_main(__name__)  # run as a program: before TensorFlow loads

import dataclasses
import hashlib
import os
from typing import Optional

import numpy as np

from sa_conv import reference
from trainers import cli, files, run_files
from trainers.data import CIFAR10_LABEL_NAMES
from sa_conv.errors import ConfigError

_field = cli.config_field


@dataclasses.dataclass
class ImportConfig:
    checkpoint: Optional[str] = _field(None, "The reference's checkpoint (.checkpoint/.pt, or .npz of its state dict).")
    config: Optional[str] = _field(None, "The reference run's config.yaml (or JSON).")
    model_dir: Optional[str] = _field(None, "Output directory: model.keras and results.json, for sa-conv-export.")
    overwrite: bool = _field(False, "Replace an existing model.keras in --model_dir.")


def import_checkpoint(checkpoint: str, config: str, model_dir: str, overwrite: bool = False, log=print) -> str:
    """Flag-free entry point: imports ``checkpoint`` with the reference ``config`` file; returns
    the path of the written ``model.keras``."""
    for name, value in (("checkpoint", checkpoint), ("config", config), ("model_dir", model_dir)):
        if not value:
            raise ConfigError(f"--{name} is required.")
    if not os.path.isfile(config):
        raise ConfigError(f"--config {config!r} does not exist.")
    target = os.path.join(model_dir, run_files.MODEL)
    if os.path.exists(target) and not overwrite:
        raise ConfigError(f"{target} exists: choose another --model_dir or pass --overwrite.")
    reference_config = reference.read_reference_config(config)
    state = reference.read_state_dict(checkpoint)
    model = reference.import_reference(state, reference_config)
    os.makedirs(model_dir, exist_ok=True)
    tmp = f"{target}.tmp.keras"
    model.save(tmp)
    os.replace(tmp, target)
    with open(checkpoint, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    classes = int(model.outputs[0].shape[-1])
    parameters = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    files.write_json(os.path.join(model_dir, "reference_config.json"), reference_config, sort_keys=True)
    run_files.write(model_dir, run_files.RESULTS, {
        "preset": model.name,
        "model_config": reference.model_config(reference_config).to_dict(),
        "parameters": parameters,
        "label_names": list(CIFAR10_LABEL_NAMES) if classes == 10 else [f"class_{i}" for i in range(classes)],
        "imported_from": {"checkpoint": os.path.abspath(checkpoint), "sha256": digest, "tensors": len(state)},
        "process": process.describe(),
    })
    log(f"Imported {len(state)} tensors of {checkpoint} into {model.name} ({parameters:,} parameters): {target}")
    return target


def main():
    config = cli.make(ImportConfig, cli.settings(ImportConfig))
    import_checkpoint(**dataclasses.asdict(config))


def run():
    """Console script ``sa-conv-import-reference``."""
    cli.run("sa-conv-import-reference", main, ImportConfig)


if __name__ == "__main__":
    run()
