"""One command-line style: every program defines its flags from one config type, reads
--config_file, exits 2 with `prog: error: message` and no traceback on the project's errors, and
keeps the console to progress, results and real warnings unless --verbosity asks for more."""

import os
import platform
import subprocess
import sys

import pytest

from sa_conv import cli
from sa_conv.errors import ConfigError
from tests.conftest import PROJECT_ROOT

ENV = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
ENV["PYTHONPATH"] = str(PROJECT_ROOT)


def _run(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=PROJECT_ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("module,prog,args,message", [
    ("trainers.train", "sa-conv-train", ["--global_batch_size=0"], "--global_batch_size must be a positive integer"),
    ("trainers.tune", "sa-conv-tune", ["--search_space=nope"], "neither a named space"),
    ("export.export", "sa-conv-export", ["--model_path=/nonexistent.keras"], "does not exist"),
    ("trainers.visualize", "sa-conv-visualize", [], "exactly one of --model_dir or --model_path"),
    ("trainers.demo", "make demo", ["--dataset=mnist"], "Unknown dataset 'mnist'"),
    ("trainers.train", "sa-conv-train", ["stray"], "unexpected arguments ['stray']"),
    ("export.import_reference", "sa-conv-import-reference", ["--checkpoint=/nonexistent.npz",
     "--config=/nonexistent.yaml", "--model_dir=/tmp/unused"], "--config '/nonexistent.yaml' does not exist"),
    ("export.import_reference", "sa-conv-import-reference", ["--config=x"], "--checkpoint is required"),
])
def test_project_errors_exit_2_with_the_message_and_no_traceback(module, prog, args, message):
    proc = _run(module, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{prog}: error: " in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_config_file_is_read_by_tune_like_the_trainer(tmp_path):
    # Both kinds of keys go in one file; the flags on the command line win over it.
    path = tmp_path / "search.yaml"
    path.write_text("max_trials: 0\nglobal_batch_size: 32\n")
    proc = _run("trainers.tune", f"--config_file={path}", "--tuner=random")
    assert proc.returncode == 2 and "--max_trials must be a positive integer, got 0" in proc.stderr
    path.write_text("tuner: random\nglobal_batch_size: -4\n")
    proc = _run("trainers.tune", f"--config_file={path}")
    assert proc.returncode == 2 and "--global_batch_size must be a positive integer, got -4" in proc.stderr
    path.write_text("tunr: random\n")
    proc = _run("trainers.tune", f"--config_file={path}")
    assert proc.returncode == 2 and "unknown keys ['tunr']" in proc.stderr


def test_console_is_quiet_unless_verbosity_asks(tmp_path):
    args = ["--dataset=synthetic", "--num_layers=1", "--hidden_size=16", "--mlp_size=16", "--epochs=1",
            "--max_steps=2", "--global_batch_size=20", "--eval_batch_size=100", "--strategy=one_device"]
    quiet = _run("trainers.train", *args, f"--model_dir={tmp_path / 'a'}")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    lines = (quiet.stdout + quiet.stderr).strip().splitlines()
    assert len(lines) <= 4, lines  # start, one epoch, result
    assert lines[0].startswith("Training sa_quadratic_small") and "Test accuracy" in lines[-1]
    assert not any(token in quiet.stderr for token in ("cpu_feature_guard", "I0000", "Sharding callback"))
    loud = _run("trainers.train", *args, f"--model_dir={tmp_path / 'b'}", "--verbosity=1")
    assert loud.returncode == 0
    assert "Sharding callback" in loud.stderr or "cpu_feature_guard" in loud.stderr
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "oneDNN custom operations are on" in loud.stderr  # the programs turn them on (trainers)


ONEDNN_NOTICE = "oneDNN custom operations are on"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's x86-64 kernels")
@pytest.mark.parametrize("package", ["trainers", "export", "benchmarks"])
def test_programs_turn_on_onednn_before_tensorflow_loads(package):
    def run(code, **env):
        base = {k: v for k, v in ENV.items() if k not in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")}
        proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env={**base, **env},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip(), proc.stderr

    show = "import os, tensorflow; print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"
    # TensorFlow's own notice, shown when its logs are: the kernels are really on.
    out, err = run(f"import {package}; {show}", TF_CPP_MIN_LOG_LEVEL="0")
    assert out == "1" and ONEDNN_NOTICE in err
    out, err = run(f"import {package}; {show}")  # quiet by default: the notice is hidden too
    assert out == "1" and ONEDNN_NOTICE not in err and "I0000" not in err
    out, err = run(f"import {package}; {show}", TF_CPP_MIN_LOG_LEVEL="0", TF_ENABLE_ONEDNN_OPTS="0")
    assert out == "0" and ONEDNN_NOTICE not in err  # the user's setting wins
    out, err = run(f"import tensorflow, {package}; {show}", TF_CPP_MIN_LOG_LEVEL="0")
    assert out == "None" and ONEDNN_NOTICE not in err  # too late once TensorFlow has loaded: untouched


def test_make_type_checks_values_from_files():
    from trainers.config import TrainConfig

    with pytest.raises(ConfigError, match="--epochs must be an integer, got '3'"):
        cli.make(TrainConfig, {"epochs": "3"})
    with pytest.raises(ConfigError, match="--learning_rate must be a number, got True"):
        cli.make(TrainConfig, {"learning_rate": True})
    assert cli.make(TrainConfig, {"learning_rate": 1}).learning_rate == 1
