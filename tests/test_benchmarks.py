"""The benchmark harness (`benchmarks.harness`): one way to start a side, its answer, the machine
record and the report; and every benchmark's reference side runs in an interpreter without
Keras, as it must in the reference's own (torch and NumPy only)."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from benchmarks import harness
from tests.conftest import PROJECT_ROOT
from trainers import data

# Blocks what the reference's interpreter does not have, at startup (Python imports
# `sitecustomize` from the path before anything else).
NO_KERAS = '''import importlib.abc
import importlib.machinery
import sys


class Absent(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}: this interpreter has no Keras", name=spec.name)

    def exec_module(self, module):
        pass


class NoKeras:
    # A spec without an origin (what a probe like torch's reads as nothing to trace) whose
    # loader refuses: an import fails as it would where the package is not installed.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("keras", "tensorflow", "sa_conv", "jax"):
            return importlib.machinery.ModuleSpec(name, Absent())
        return None


sys.meta_path.insert(0, NoKeras())
'''

# Stand-ins for the reference's `models` package (its code is never copied here): a model of
# each kind it builds, the size of a CIFAR image, so each side runs its own loop for real.
MODELS = '''import torch


class BertImage(torch.nn.Module):
    def __init__(self, config, num_classes):
        super().__init__()
        self.config = config
        self.classifier = torch.nn.Linear(3 * 32 * 32, num_classes)

    def forward(self, x):
        return self.classifier(x.flatten(1))


def ResNet18(num_classes=10):
    return BertImage({}, num_classes)
'''


@pytest.fixture
def without_keras(tmp_path):
    """``(python, env, reference_dir)``: this interpreter with Keras, TensorFlow and sa_conv
    unimportable, and a reference directory of stand-in models."""
    pytest.importorskip("torch", reason="the reference's sides run torch (make test-backends has it)")
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_KERAS)
    reference = tmp_path / "reference"
    (reference / "models").mkdir(parents=True)
    (reference / "models" / "__init__.py").write_text(MODELS)
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    probe = subprocess.run([sys.executable, "-c", "import keras"], env=env, capture_output=True, text=True)
    assert "this interpreter has no Keras" in probe.stderr  # the blocker works
    return sys.executable, env, str(reference)


def _side(module, flags, python, env):
    proc = harness.run_module(module, ["--side=reference", *flags], python, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return harness.parse_result("reference", proc.returncode, proc.stdout, proc.stderr)


PRESET = {"architecture": "attention", "encoding": "quadratic", "num_layers": 1, "num_heads": 4, "hidden_size": 16,
          "mlp_size": 16, "dropout": 0.0, "attention_dropout": 0.0, "pooling_width": 2}


def test_serving_reference_side_runs_without_keras(without_keras):
    python, env, reference = without_keras
    result = _side("benchmarks.serving", [f"--path={json.dumps(PRESET)}", "--steps=1", f"--reference_dir={reference}",
                                          "--matmul_size=128"], python, env)
    assert result["side"] == "reference" and result["images_per_second_batch1"] > 0
    assert result["images_per_second_batch100"] > 0 and result["matmul_gflops"]["float32"] > 0


def test_vs_reference_reference_side_runs_without_keras(without_keras, tmp_path):
    python, env, reference = without_keras
    result = _side("benchmarks.vs_reference", ["--preset=sa_quadratic_small", "--batch=4", "--train_steps=1",
                                               "--infer_steps=1", f"--workdir={tmp_path}", f"--reference_dir={reference}",
                                               f"--preset_config={json.dumps(PRESET)}"], python, env)
    assert result["parameters"] == 3 * 32 * 32 * 10 + 10
    assert result["train_images_per_second"] > 0 and result["inference_images_per_second_batch4"] > 0


def test_vs_reference_training_reference_side_runs_without_keras(without_keras, tmp_path):
    import numpy as np

    python, env, reference = without_keras
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, train_images=rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8),
             train_labels=rng.integers(0, 10, 20), test_images=rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8),
             test_labels=rng.integers(0, 10, 10))
    result = _side("benchmarks.vs_reference_training", ["--encoding=quadratic", "--seed=0", "--epochs=2",
                                                        f"--reference_dir={reference}", f"--data={data}"], python, env)
    assert result["steps"] == 2 and len(result["epochs"]) == 2  # one batch of 20 per epoch
    assert 0.0 <= result["test_accuracy"] <= 1.0 and all(np.isfinite(e["train_loss"]) for e in result["epochs"])


def test_a_failed_side_is_an_error_with_its_exit_and_standard_error():
    with pytest.raises(harness.SideError, match=r"reference failed \(exit 2\)") as failure:
        harness.run_side("benchmarks.serving", "reference", ["--no_such_flag"])
    assert failure.value.returncode == 2 and "unrecognized arguments: --no_such_flag" in failure.value.stderr
    assert harness.parse_result("x", 0, "noise\nRESULT {\"a\": 1}\nRESULT {\"a\": 2}\n", "") == {"a": 2}
    with pytest.raises(harness.SideError):
        harness.parse_result("x", 0, "no result line", "")


def test_the_report_merges_and_records_the_machine(tmp_path):
    path = str(tmp_path / "report.json")
    harness.write_report(path, {"presets": {"a": 1, "b": 2}})
    written = harness.write_report(path, {"presets": {"b": 3, "c": 4}}, merge=True)
    assert written["presets"] == {"a": 1, "b": 3, "c": 4}
    assert json.loads((tmp_path / "report.json").read_text()) == written
    written = json.loads((tmp_path / "report.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps({**written, "notes": ["kept"]}))
    rerun = harness.write_report(path, {"presets": {"c": 5}, "notes": ["new"]})
    assert rerun["presets"] == {"c": 5} and rerun["notes"] == ["kept", "new"]  # no --merge: only this run's, and notes
    machine = written["machine"]
    assert machine["cpu"]["cores"] == os.cpu_count() and machine["cpu"]["memory_gb"] > 0
    assert set(machine["cpu"]["features"]) <= set(harness.CPU_FEATURES) and written["date"]


def test_benchmarks_share_one_harness_and_change_nothing_on_import():
    """No benchmark holds a program in a string, starts a process but through the harness,
    measures a matmul peak of its own or changes ``sys.path`` when imported; each is importable
    without side effects (its module-level statements are imports, constants and definitions)."""
    import ast

    for path in sorted((PROJECT_ROOT / "benchmarks").glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        if path.name != "harness.py":
            assert "subprocess" not in imported or path.name == "scaling.py", path.name  # scaling: TimeoutExpired
            assert "subprocess.run" not in source and "Popen" not in source and '"-c"' not in source, path.name
            assert "def matmul" not in source and "def fastest" not in source, path.name
        own = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Name)}
        for node in tree.body:
            # An expression statement is the docstring or a call on one of its own constants
            # (``CASES.update(...)``); nothing touches another module's state.
            own_call = (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name)
                        and node.value.func.value.id in own)
            assert own_call or isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                                 ast.AnnAssign, ast.If)) or (isinstance(node, ast.Expr)
                                                                            and isinstance(node.value, ast.Constant)), \
                f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}"
            assert "sys.path" not in ast.unparse(node) or isinstance(node, ast.FunctionDef), path.name
            if isinstance(node, ast.If):
                assert ast.unparse(node.test) == "__name__ == '__main__'", path.name


SLEEPER = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
"""


@pytest.mark.parametrize("runner", ["run_module", "run_module_watched"])
def test_a_benchmark_stopped_with_sigterm_stops_the_child_it_runs(tmp_path, runner):
    """``kill`` on a benchmark (a study stopped to be started again) ends its child too, as
    Ctrl-C does: a training left running would write into the run the restarted study resumes."""
    import signal
    import time

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "child.pid"
    (tmp_path / "bench.py").write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        "from benchmarks import harness\n"
        "harness.parse(harness.arguments('A benchmark.', 'x.json', merge=False))\n"
        f"harness.{runner}('sleeper', [{str(pid_file)!r}], env={{**os.environ, 'PYTHONPATH': {str(tmp_path)!r}}})\n")
    parent = subprocess.Popen([sys.executable, str(tmp_path / "bench.py"), f"--output={tmp_path / 'x.json'}"])
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # killed, and reaped by the benchmark
            os.kill(child, 0)
    finally:
        parent.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_benchmark_offers_merge_only_when_it_reads_it():
    """``--merge`` is the harness's flag; a benchmark whose report is always merged (a resumable
    study) or always written whole does not offer it, rather than accept it and do nothing."""
    import ast

    for path in sorted((PROJECT_ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) ==
                 "harness.arguments"]
        if not calls:
            continue
        offers = not any(k.arg == "merge" and ast.literal_eval(k.value) is False for k in calls[0].keywords)
        reads = any(isinstance(node, ast.Attribute) and node.attr == "merge" and ast.unparse(node.value) == "args"
                    for node in ast.walk(tree))
        assert offers == reads, f"{path.name}: offers --merge {offers}, reads args.merge {reads}"
    parser = harness.arguments("A benchmark.", "x.json", merge=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--merge"])
    assert harness.arguments("A benchmark.", "x.json").parse_args(["--merge"]).merge is True


@pytest.mark.parametrize("features, units", [
    (["avx2", "fma"], "AVX2"),
    (["avx2", "avx_vnni"], "AVX2 VNNI"),
    (["avx2", "avx512f", "avx512_vnni", "avx512_bf16"], "AVX-512 VNNI BF16"),
    (["avx2", "avx512f"], "AVX-512"),
    (["avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"], "AMX"),
    ([], "no AVX2"),
])
def test_cpu_class_names_the_widest_matrix_units(features, units):
    assert harness.cpu_class({"model": "Some model", "features": features}) == f"Some model, {units}"
    # trainers.process's record spells the list "extensions"
    assert harness.cpu_class({"model": "Some model", "extensions": features}) == f"Some model, {units}"


@pytest.mark.parametrize("model, name", [
    ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "Intel Xeon Platinum 8480+"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "Intel Core i7-8700"),
    ("AMD EPYC 9654 96-Core Processor", "AMD EPYC 9654 96-Core"),
    ("AMD EPYC", "AMD EPYC"),
    ("", "unknown CPU"),
])
def test_cpu_class_names_the_cpu_without_marks_or_clock(model, name):
    assert harness.cpu_class({"model": model, "features": ["avx2"]}) == f"{name}, AVX2"


def test_a_benchmark_and_a_trainer_name_this_cpu_alike():
    """A benchmark files its results under `harness.cpu_class`, a trainer its epochs under
    `trainers.process.cpu_class`: the study compares the two, so they read the CPU alike."""
    from trainers import process

    assert harness.cpu_class() == process.cpu_class()
    assert harness.cpu()["model"] == process.cpu_info()["model"]
    assert set(harness.cpu()["features"]) == set(harness.CPU_FEATURES) & set(process.cpu_info()["extensions"])


def test_a_merged_serving_run_keeps_each_earlier_sides_day_and_load(tmp_path, monkeypatch):
    """`benchmarks.serving --merge` times some sides again: the sides it keeps say the day and the
    other load of the run that timed them (the preset's own, else its run's), not this run's."""
    from benchmarks import serving

    monkeypatch.setattr(harness, "cpu", lambda: {"model": "CPU A", "features": ["avx2"]})
    busy, quiet = {"cores": 0.5, "seconds": 100.0}, {"cores": 0.0, "seconds": 50.0}
    path = tmp_path / "serving.json"
    assert serving.earlier_presets(str(path)) == {}
    path.write_text(json.dumps({"runs": {"CPU A, AVX2": {"other_load": busy, "presets": {
        "p1": {"date": "d1", "sides": {"onnx": {"x": 1}}},
        "p2": {"date": "d2", "other_load": quiet, "sides": {"onnx": {"x": 2, "date": "d0"}}}}},
        "CPU B, AVX2": {"presets": {"p3": {}}}}}))
    earlier = serving.earlier_presets(str(path))
    assert set(earlier) == {"p1", "p2"}
    assert serving.kept_sides(earlier["p1"]) == {"onnx": {"x": 1, "date": "d1", "other_load": busy}}
    assert serving.kept_sides(earlier["p2"]) == {"onnx": {"x": 2, "date": "d0", "other_load": quiet}}
    assert serving.kept_sides(None) == {}


def test_runs_of_other_cpus_stay_and_a_merge_keeps_unmeasured_presets(tmp_path, monkeypatch):
    """The serving report's layout: one run per `cpu_class` (``section``)."""
    path = str(tmp_path / "serving.json")

    def write(record, merge=False):
        return harness.write_report(path, record, merge=merge, section=harness.cpu_class())

    monkeypatch.setattr(harness, "cpu", lambda: {"model": "CPU A", "features": ["avx2"]})
    write({"process": {}, "presets": {"p1": {"x": 1}, "p2": {"x": 2}}})
    monkeypatch.setattr(harness, "cpu", lambda: {"model": "CPU B", "features": ["avx2", "avx512f"]})
    write({"process": {}, "presets": {"p1": {"x": 3}}})
    written = write({"process": {}, "presets": {"p2": {"x": 4}}}, merge=True)
    with open(path) as f:
        runs = json.load(f)["runs"]
    assert written == {"runs": runs}
    assert set(runs) == {"CPU A, AVX2", "CPU B, AVX-512"}
    assert runs["CPU A, AVX2"]["presets"] == {"p1": {"x": 1}, "p2": {"x": 2}}
    assert runs["CPU B, AVX-512"]["presets"] == {"p1": {"x": 3}, "p2": {"x": 4}}
    assert runs["CPU B, AVX-512"]["machine"]["cpu"]["model"] == "CPU B"
    write({"process": {}, "presets": {"p2": {"x": 5}}})  # no merge: this class's run replaced
    with open(path) as f:
        assert json.load(f)["runs"]["CPU B, AVX-512"]["presets"] == {"p2": {"x": 5}}


def test_serving_ratios_are_of_sides_timed_in_one_run():
    """`benchmarks.serving --sides=... --merge` times some sides again: a ratio of two of them is
    computed; any other is the earlier run's, where that run timed both; none divides one run's
    images/s by another's."""
    from benchmarks import serving

    def side(batch1, batch100):
        return {"images_per_second_batch1": batch1, "images_per_second_batch100": batch100}

    sides = {"saved_model": side(10.0, 100.0), "openvino": side(30.0, 250.0), "onnx": side(20.0, 150.0),
             "tflite": side(5.0, 40.0), "openvino_int8": {"skipped": "nncf not installed"}}
    earlier = {"tflite_over_saved_model": {"batch1": 0.25, "batch100": 0.5},
               "openvino_over_saved_model": {"batch1": 9.0, "batch100": 9.0}}
    ratios = serving.ratios_of(sides, {"saved_model", "openvino"}, earlier)
    assert ratios["openvino_over_saved_model"] == {"batch1": 3.0, "batch100": 2.5}  # timed now, not the earlier 9
    assert "openvino_over_onnx" not in ratios and "onnx_over_saved_model" not in ratios  # one side of each run
    assert ratios["tflite_over_saved_model"] == {"batch1": 0.25, "batch100": 0.5}  # the earlier run's, not 5/10
    assert "openvino_int8_over_openvino" not in ratios  # skipped
    untouched = serving.ratios_of(sides, {"openvino"}, earlier)
    assert untouched["tflite_over_saved_model"] == {"batch1": 0.25, "batch100": 0.5}  # both of the earlier run
    assert set(untouched) == {"tflite_over_saved_model", "openvino_over_saved_model"}  # both the earlier run's
    assert untouched["openvino_over_saved_model"] == {"batch1": 9.0, "batch100": 9.0}


@pytest.mark.parametrize("module, flags", [
    ("benchmarks.epoch_overhead", []),
    ("benchmarks.iterator_deletion", []),
    ("benchmarks.data_efficiency", []),
    ("benchmarks.reproduction", ["--models=learned", "--epochs=1", "--directory={tmp}/runs"]),
    ("benchmarks.vs_reference_training", ["--reference_dir=."]),
])
def test_a_data_dir_without_cifar10_files_stops_the_benchmark_before_its_runs(module, flags, tmp_path):
    """The parent checks ``--data_dir`` once, as a usage error that names the path and the fix,
    rather than start a child per run that each fails inside with its own traceback."""
    missing = tmp_path / "missing"
    proc = harness.run_module(module, [f"--data_dir={missing}", f"--output={tmp_path / 'report.json'}",
                                       *(flag.format(tmp=tmp_path) for flag in flags)])
    assert proc.returncode == 2, proc.stderr
    assert (f"--data_dir={missing}: CIFAR-10 path {str(missing)!r} does not exist. Point --data_dir at a "
            "cifar-10-batches-py/ directory") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []  # no report, no run directory


def test_an_encoding_the_reference_lacks_stops_the_training_comparison_before_its_runs(tiny_cifar, tmp_path):
    proc = harness.run_module("benchmarks.vs_reference_training", [
        "--reference_dir=.", f"--data_dir={tiny_cifar[0]}", "--encodings=quadratic,gated",
        f"--output={tmp_path / 'report.json'}"])
    assert proc.returncode == 2 and "--encodings ['gated']: the reference trains quadratic," in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag, error", [("--modes=train,inferr", "--modes ['inferr']: each is one of train, infer"),
                                         ("--paths=dense,seperable", "--paths ['seperable']: each is one of"),
                                         ("--presets=sa_quadratic,resnet18,sa_quadratic_full",
                                          "--presets ['resnet18', 'sa_quadratic_full']: each is a preset with the "
                                          "separable path (sa_quadratic, sa_learned, ")])
def test_the_scaling_benchmark_refuses_an_unknown_mode_path_or_preset_before_its_cases(flag, error, tmp_path):
    proc = harness.run_module("benchmarks.scaling", [flag, f"--output={tmp_path / 'report.json'}"])
    assert proc.returncode == 2 and error in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


def test_the_throughput_benchmark_times_more_steps_than_one_epoch_of_its_data():
    """One epoch of the synthetic data is 9 batches of 100: --train_steps=12 (and the warm-up call)
    run on into the next epoch instead of ending the case with 'End of sequence'."""
    pytest.importorskip("tensorflow", reason="the trainer's steps (make test-backends runs without it)")
    proc = harness.run_module("benchmarks.throughput", ["--side=sa_quadratic_small", "--train_steps=12",
                                                        "--infer_steps=1"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = harness.parse_result("sa_quadratic_small", proc.returncode, proc.stdout, proc.stderr)
    assert result["case"] == "sa_quadratic_small" and result["precision"] == "float32"
    assert 0 < result["train_images_per_second_median"] <= result["train_images_per_second"]


def test_resolution_transfer_checks_its_fine_tuning_before_it_trains(tiny_cifar, tmp_path):
    pytest.importorskip("tensorflow", reason="the trainer's settings (make test-backends runs without it)")
    proc = harness.run_module("benchmarks.resolution_transfer", [
        f"--data_dir={tiny_cifar[0]}", "--fine_tune_epochs=0", f"--output={tmp_path / 'report.json'}"])
    assert proc.returncode == 1, proc.stderr
    assert "resolution_transfer's fine_tuned_at64 run: --epochs must be a positive integer, got 0." in proc.stderr
    assert "[at32]" not in proc.stdout and os.listdir(tmp_path) == []


def test_resolution_transfer_refuses_a_trained_run_of_other_settings(tiny_cifar, tmp_path):
    """--trained_run stands for step 1: a run of another precision or learning rate is refused
    before the 64x64 runs train, naming each setting that differs."""
    pytest.importorskip("tensorflow", reason="the trainer's settings (make test-backends runs without it)")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"epochs": 2, "model_config": {"image_size": 32},
                                                  "test_accuracy": 0.3}))
    (run / "config.json").write_text(json.dumps({
        "model": "sa_quadratic_small", "dataset": "cifar10", "global_batch_size": 100, "learning_rate": 0.05,
        "data_location": {"dataset": "cifar10", "data_dir": str(tiny_cifar[0])},
        "precision": {"policy": "mixed_bfloat16"}}))
    proc = harness.run_module("benchmarks.resolution_transfer", [
        f"--data_dir={tiny_cifar[0]}", "--model=sa_quadratic_small", "--epochs=2", f"--trained_run={run}",
        f"--output={tmp_path / 'report.json'}"])
    assert proc.returncode == 1, proc.stderr
    assert (f"--trained_run={run} trained with other settings than this call's: --learning_rate=0.05 (this call: "
            "--learning_rate=0.1); precision mixed_bfloat16 (this call trains in float32).") in proc.stderr
    assert "[fine_tuned_at64]" not in proc.stdout and not (tmp_path / "report.json").exists()
    # The run of this call's settings, as the trainer records them, passes.
    from benchmarks import resolution_transfer
    from trainers.config import make_config

    wanted = make_config(overrides=dict(model="sa_quadratic_small", dataset="cifar10", data_dir=str(tiny_cifar[0]),
                                        global_batch_size=100, learning_rate=0.1, mixed_precision="float32", epochs=2,
                                        model_dir=str(tmp_path / "w")))
    same = {**wanted.to_dict(), "data_location": {"dataset": "cifar10", "data_dir": str(tiny_cifar[0])},
            "precision": {"policy": "float32"}}
    assert resolution_transfer.trained_run_differences(same, wanted, str(tiny_cifar[0])) == []
    assert resolution_transfer.trained_run_differences({**same, "num_heads": 4}, wanted, str(tiny_cifar[0])) == [
        "--num_heads=4 (this run: no --num_heads)"]


def test_a_data_dir_is_taken_as_an_absolute_path_when_it_holds_cifar10_files(tiny_cifar, tmp_path, monkeypatch,
                                                                             capsys):
    import argparse

    data_dir = tiny_cifar[0]
    monkeypatch.chdir(os.path.dirname(data_dir))
    assert harness.cifar10_dir(argparse.ArgumentParser(), os.path.basename(data_dir)) == data_dir
    assert harness.cifar10_dir(argparse.ArgumentParser(), ".") == os.path.dirname(data_dir)  # holds one
    download = tmp_path / "download"  # holds only the downloaded archive
    download.mkdir()
    archive = data.write_cifar10_files(str(tmp_path / "written"), tiny_cifar[1], archive=True)
    os.replace(archive, download / data.CIFAR10.archive)
    assert harness.cifar10_dir(argparse.ArgumentParser(), str(download)) == str(download)
    shutil.rmtree(tmp_path / "written")
    with pytest.raises(SystemExit) as stop:
        harness.cifar10_dir(argparse.ArgumentParser(), str(tmp_path))
    assert stop.value.code == 2
    assert (f"--data_dir={tmp_path}: CIFAR-10 directory {str(tmp_path)!r} is missing batch file(s) "
            "['data_batch_1', 'data_batch_2', 'data_batch_3', 'data_batch_4', 'data_batch_5', 'test_batch']"
            ) in capsys.readouterr().err


def test_tflite_runtimes_ratios_are_of_files_in_one_interpreter_and_of_one_file_in_both():
    from benchmarks import tflite_runtimes as bench

    def side(float32, full, dynamic):
        return {name: {"images_per_second_batch1": v, "images_per_second_batch100": 2 * v}
                for name, v in (("float32", float32), ("full_integer", full), ("dynamic_range", dynamic))}

    ratios = bench.ratios({"litert": side(20.0, 12.0, 40.0), "tensorflow": side(25.0, 37.5, 50.0)})
    assert ratios["litert_full_integer_over_float32"] == {"batch1": 0.6, "batch100": 0.6}
    assert ratios["tensorflow_dynamic_range_over_float32"] == {"batch1": 2.0, "batch100": 2.0}
    assert ratios["litert_over_tensorflow_full_integer"]["batch1"] == pytest.approx(0.32)
    assert len(ratios) == 2 * 2 + len(bench.FILES)


def test_serving_names_every_low_precision_side_slower_than_its_float32_side():
    from benchmarks import serving

    ratios = {"tflite_int8_over_tflite": {"batch1": 0.53, "batch100": 1.2}, "onnx_int8_over_onnx": {"batch1": 1.5,
              "batch100": 1.1}, "bfloat16_over_float32_export": {"batch1": 0.9, "batch100": 0.8},
              "tflite_over_saved_model": {"batch1": 0.5, "batch100": 0.5}}  # not a low-precision pair
    assert serving.slower_than_float32(ratios) == {"tflite_int8": {"batch1": 0.53},
                                                   "saved_model_bfloat16": {"batch1": 0.9, "batch100": 0.8}}


def test_the_op_breakdown_reads_the_profilers_op_statistics_by_type_and_category():
    """A step that is one large matmul and a little elementwise work: the profiler's statistics say
    most of its op time is the matmul, and the fractions add up to the whole."""
    tf = pytest.importorskip("tensorflow", reason="TensorFlow's profiler (make test-backends runs without it)")
    from benchmarks import throughput

    a = tf.random.stateless_uniform((1024, 1024), seed=(1, 2))
    step = tf.function(lambda: tf.reduce_sum(tf.matmul(a, a) * 2.0))
    step()
    breakdown = throughput.op_breakdown(lambda: step().numpy(), 3)
    assert breakdown["categories"]["matmul"] > 0.5 and "IDLE" not in breakdown["types"], breakdown
    assert sum(breakdown["types"].values()) == pytest.approx(1.0)
    assert sum(breakdown["categories"].values()) == pytest.approx(1.0)
    assert breakdown["op_seconds_per_step"] > 0
    assert [throughput.op_category(t) for t in ("_MklBatchMatMulV2", "Conv2DBackpropFilter", "StatelessRandomUniformV2",
                                                "_MklTranspose", "BiasAddGrad", "Mul")] == [
        "matmul", "matmul", "random", "layout", "reduction", "elementwise"]


def test_a_report_says_how_many_cores_other_processes_took_while_it_ran(tmp_path, monkeypatch):
    """`harness.other_load` counts the machine's busy CPU time that is not the benchmark's: a process
    it has not reaped (as good as another program, for its own accounting) shows as other load, and
    once reaped its time is the benchmark's own; `write_report` records the load since the command
    line was parsed."""
    start = harness.cpu_seconds()
    if start is None:
        pytest.skip("no /proc/stat")
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass"
    other = subprocess.Popen([sys.executable, "-c", spin])
    with open(f"/proc/{other.pid}/stat") as f:
        while f.read().rsplit(")", 1)[1].split()[0] != "Z":  # ended, not yet reaped
            time.sleep(0.05)
            f.seek(0)
    ended = harness.cpu_seconds()
    other.wait()
    reaped = harness.cpu_seconds()
    load = harness.other_load(start, ended)
    assert load["cores"] * load["seconds"] >= 0.9  # its second of CPU, beside whatever else ran
    assert reaped[2] - ended[2] >= 0.9  # now the benchmark's own
    # Busy is every state's time but idle, I/O wait and steal, in clock ticks; others, busy less the benchmark's own.
    (tmp_path / "stat").write_text("cpu  100 5 20 1000 50 1 2 3 0 0\ncpu0 50 2 10 500 25 0 1 1 0 0\n")
    assert harness.cpu_seconds(str(tmp_path / "stat"))[1] == pytest.approx(128 / os.sysconf("SC_CLK_TCK"))
    assert harness.other_load((0.0, 10.0, 1.0), (4.0, 16.0, 3.0)) == {"cores": 1.0, "seconds": 4.0}
    assert harness.other_load((0.0, 10.0, 1.0), (4.0, 11.0, 3.0))["cores"] == 0  # never below nothing
    monkeypatch.setattr(harness, "LOAD_SINCE", start)
    written = harness.write_report(str(tmp_path / "report.json"), {"results": []})
    assert written["other_load"]["seconds"] >= load["seconds"] and written["other_load"]["cores"] >= 0
    # A merged run's load is its own; the entries it kept say the load of the run that measured them.
    busy = {"cores": 0.5, "seconds": 100.0}
    path = str(tmp_path / "merged.json")
    harness.write_report(path, {"presets": {"a": {"x": 1}, "b": {"x": 2}}, "other_load": busy})
    merged = harness.write_report(path, {"presets": {"b": {"x": 3}}}, merge=True)
    assert merged["presets"] == {"a": {"x": 1, "other_load": busy}, "b": {"x": 3}}
    assert merged["other_load"] != busy and merged["other_load"]["seconds"] >= load["seconds"]
    again = harness.write_report(path, {"presets": {"b": {"x": 4}}}, merge=True)
    assert again["presets"]["a"]["other_load"] == busy  # an entry's own load stays with it
    # An earlier run that recorded no load: its entries say so, not the load of this run, which
    # writes after each of its own entries.
    old = str(tmp_path / "old.json")
    with open(old, "w") as f:
        json.dump({"presets": {"a": {"x": 1}}}, f)
    harness.write_report(old, {"presets": {"b": {"x": 2}}}, merge=True)
    second = harness.write_report(old, {"presets": {"c": {"x": 3}}}, merge=True)
    assert second["presets"]["a"]["other_load"] is None
    assert set(second["presets"]["b"]["other_load"]) == {"cores", "seconds"}  # the load of the write that measured it
