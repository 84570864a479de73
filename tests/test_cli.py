"""One command-line style: every program defines its flags from one config type, reads
--config_file, exits 2 with `prog: error: message` and no traceback on the project's errors, and
keeps the console to progress, results and real warnings unless --verbosity asks for more."""

import json
import os
import pathlib
import platform
import subprocess
import sys

import pytest

from trainers import cli
from sa_conv.errors import ConfigError
from tests.conftest import PROJECT_ROOT

ENV = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
ENV["PYTHONPATH"] = str(PROJECT_ROOT)


def _run(module, *args, timeout=300, env=ENV):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("module,prog,args,message", [
    ("trainers.tune", "sa-conv-tune", ["--search_space=nope"], "neither a named space"),
    ("export.export", "sa-conv-export", ["--model_path=/nonexistent.keras"], "does not exist"),
    ("programs.visualize", "sa-conv-visualize", [], "exactly one of --model_dir or --model_path"),
    ("programs.demo", "make demo", ["--dataset=mnist"], "Unknown dataset 'mnist'"),
    ("trainers.train", "sa-conv-train", ["stray"], "unexpected arguments ['stray']"),
    ("programs.import_reference", "sa-conv-import-reference", ["--checkpoint=/nonexistent.npz",
     "--config=/nonexistent.yaml", "--model_dir=/tmp/unused"], "--config '/nonexistent.yaml' does not exist"),
])
def test_project_errors_exit_2_with_the_message_and_no_traceback(module, prog, args, message):
    """Every program's own errors; the flag checks behind them are tested in process (below,
    test_schedule, test_data, test_train, test_models)."""
    proc = _run(module, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{prog}: error: " in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_more_of_the_programs_errors_in_process(monkeypatch, tmp_path):
    """Errors that reach the exit above by the same `cli.run` (one process per program there)."""
    from programs.import_reference import import_checkpoint
    from trainers import distribute

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="--strategy=multi_worker needs TF_CONFIG"):
        distribute.create_strategy("multi_worker")
    with pytest.raises(ConfigError, match="--checkpoint is required"):
        import_checkpoint(checkpoint=None, config="x", model_dir=str(tmp_path))


@pytest.mark.slow
def test_config_file_is_read_by_tune_like_the_trainer(tmp_path):
    # Both kinds of keys go in one file; the flags on the command line win over it.
    path = tmp_path / "search.yaml"
    path.write_text("max_trials: 0\nglobal_batch_size: 32\n")
    proc = _run("trainers.tune", f"--config_file={path}", "--tuner=random")
    assert proc.returncode == 2 and "--max_trials must be a positive integer, got 0" in proc.stderr
    path.write_text("tuner: random\nglobal_batch_size: -4\n")
    proc = _run("trainers.tune", f"--config_file={path}")
    assert proc.returncode == 2 and "--global_batch_size must be a positive integer, got -4" in proc.stderr
    # A key of neither kind: the same reading of the file, in process (the runs above show tune
    # reads it with both kinds of keys).
    from trainers.config import TrainConfig
    from trainers.tune import TuneConfig

    path.write_text("tunr: random\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['tunr'\]"):
        cli.read_config_file(str(path), TrainConfig, TuneConfig)


@pytest.mark.slow
def test_console_is_quiet_unless_verbosity_asks_and_records_the_kernels(tmp_path):
    """Quiet by default: standard output holds the run's own three lines (start, epoch, result),
    and the run records that it hid TensorFlow's C++ logs; --verbosity=1 leaves them on.

    The program turns TensorFlow's oneDNN kernels on on x86-64 unless the user set
    TF_ENABLE_ONEDNN_OPTS, whose setting wins; config.json says which ran and why. (What
    TensorFlow does by default on this CPU is not asserted: it differs between CPUs.) The user's
    settings, "0" and "1", are `test_process.py`'s, in process: the quiet run, started without
    the variable, shows that the program records what `trainers.process` decided."""
    args = ["--dataset=synthetic", "--num_layers=1", "--hidden_size=16", "--mlp_size=16", "--epochs=1",
            "--max_steps=2", "--global_batch_size=20", "--eval_batch_size=100", "--strategy=one_device"]
    unset = {k: v for k, v in ENV.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    quiet = _run("trainers.train", *args, f"--model_dir={tmp_path / 'a'}", env=unset)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    lines = quiet.stdout.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("Training sa_quadratic_small") and lines[1].startswith("epoch 1/1")
    assert "Test accuracy" in lines[-1]
    recorded = json.loads((tmp_path / "a" / "config.json").read_text())["process"]
    assert recorded["configured_by_program"] and recorded["environment"]["TF_CPP_MIN_LOG_LEVEL"] == "2"
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert recorded["cpu"]["machine"] == platform.machine() and recorded["tensorflow"]
    setting = "1" if x86 else None
    assert recorded["environment"].get("TF_ENABLE_ONEDNN_OPTS") == setting
    if setting is not None:
        assert recorded["onednn"]["on"] is (setting == "1")
        assert recorded["onednn"]["why"].endswith("this program (on x86-64)")
    loud = _run("trainers.train", *args, f"--model_dir={tmp_path / 'b'}", "--verbosity=1")
    assert loud.returncode == 0
    assert "TF_CPP_MIN_LOG_LEVEL" not in json.loads((tmp_path / "b" / "config.json").read_text())["process"]["environment"]


def test_make_type_checks_values_from_files():
    from trainers.config import TrainConfig

    with pytest.raises(ConfigError, match="--epochs must be an integer, got '3'"):
        cli.make(TrainConfig, {"epochs": "3"})
    with pytest.raises(ConfigError, match="--learning_rate must be a number, got True"):
        cli.make(TrainConfig, {"learning_rate": True})
    assert cli.make(TrainConfig, {"learning_rate": 1}).learning_rate == 1


@pytest.mark.slow
def test_make_demo_trains_exports_and_serves_end_to_end(tmp_path):
    """`make demo`, the README's first command, through the Makefile (with the virtualenv this
    suite runs in), on generated data: it trains, evaluates, exports, and the reloaded SavedModel
    answers."""
    venv = pathlib.Path(sys.executable).parent.parent
    if not (venv / ".installed").exists():
        pytest.skip(f"{venv} was not made by `make venv`")
    # -o: the virtualenv is taken as made (no reinstall however setup.py's time compares).
    proc = subprocess.run(["make", "--no-print-directory", "-o", f"{venv}/.installed", "demo", f"VENV={venv}", f"DEMO_DIR={tmp_path}",
                           "DEMO_ARGS=--dataset=synthetic --epochs=1 --max_steps=3"],
                          cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Test accuracy" in proc.stdout and "The reloaded SavedModel predicts test image 0 as" in proc.stdout
    results = json.loads((tmp_path / "sa_quadratic_small" / "results.json").read_text())
    assert results["steps"] == 3 and 0.0 <= results["test_accuracy"] <= 1.0
    (version,) = (tmp_path / "exported").glob("*/*/saved_model.pb")
    assert (version.parent / "assets.extra" / "metadata.json").is_file()
