"""The distributed trainer: learning, replicas, workers, resume after SIGKILL, errors (the bad flags
themselves: test_cli, test_schedule, test_data, in process)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import types

import epfml_reference
import numpy as np
import pytest
import tensorflow as tf

import sa_conv
from tests.conftest import PROJECT_ROOT, read_until, reserved_port
from trainers import distribute, process, run_files
from trainers.augmentation import AUGMENTATIONS
from trainers import train as train_lib
from trainers.task import Task, decays
from trainers.config import ConfigError, default_jit_compile, make_config

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)}
TINY_SETTINGS = dict(num_layers=1, global_batch_size=32, eval_batch_size=100)
TINY = [f"--{k}={v}" for k, v in TINY_SETTINGS.items()]


def _cli(*args, env=None, timeout=300, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "trainers.train", *args], cwd=PROJECT_ROOT, env=env or ENV,
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


def _json(path):
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------------------ learning


def test_run_files_read_an_unfinished_run_as_unfinished(tmp_path):
    """A run killed during its third epoch: two epochs done, no results (None, or with
    ``required`` an error naming the directory and how to finish it), the snapshots' epochs in
    order whatever else the folder holds; an empty directory has done nothing, and once the
    results are written the run reads as finished."""
    model_dir = str(tmp_path)
    assert run_files.epochs_done(model_dir) == 0 and run_files.read_history(model_dir) == []
    assert run_files.read_config(model_dir) is None and not run_files.finished(model_dir)
    run_files.write(model_dir, run_files.HISTORY, [{"epoch": 1}, {"epoch": 2}])
    for epoch in (10, 0, 2):
        os.makedirs(os.path.dirname(run_files.snapshot_path(model_dir, epoch)), exist_ok=True)
        open(run_files.snapshot_path(model_dir, epoch), "w").close()
    open(run_files.snapshot_path(model_dir, 4) + ".tmp.keras", "w").close()  # killed while saving
    assert run_files.epochs_done(model_dir) == 2
    assert run_files.snapshot_epochs(model_dir) == [0, 2, 10]
    assert run_files.read_results(model_dir) is None
    with pytest.raises(FileNotFoundError,
                       match=f"{re.escape(model_dir)} holds no finished run.*--model_dir={re.escape(model_dir)}"):
        run_files.read_results(model_dir, required=True)
    run_files.write(model_dir, run_files.RESULTS, {"test_accuracy": 0.5})
    assert run_files.finished(model_dir) and run_files.read_results(model_dir, required=True) == {"test_accuracy": 0.5}


@pytest.mark.slow
def test_short_run_learns_on_real_cifar10(cifar10_mini_dir, tmp_path):
    """60 steps of 32 images of the small preset, one block of it, on the real subset: validation
    accuracy well above chance (0.10; its std over 417 images is 0.015). Measured here: val 0.242,
    test 0.224; the threshold 0.16 leaves margin."""
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, dataset="cifar10_files", data_dir=cifar10_mini_dir, epochs=1,
        max_steps=60, global_batch_size=32, model_dir=str(tmp_path), strategy="one_device",
    ))
    logs = []
    results = train_lib.train(config, log=logs.append)
    assert results["steps"] == 60
    assert results["val_accuracy"] > 0.16, results
    assert results["test_accuracy"] > 0.16, results
    history = _json(tmp_path / "history.json")
    assert len(history) == 1 and history[0]["val_accuracy"] == results["val_accuracy"]
    # The epoch's wall time holds its steps' and the validation after them.
    assert history[0]["epoch_seconds"] > history[0]["train_seconds"] > 0
    assert history[0]["cpu"] == process.cpu_class()  # the class its timings belong to
    for name in ("config.json", "results.json", "model.keras", "best_model.keras"):
        assert (tmp_path / name).is_file(), name
    assert _json(tmp_path / "config.json")["resolved_model"]["hidden_size"] == 64
    # What the programs that read a model directory see of it.
    assert run_files.finished(str(tmp_path)) and run_files.epochs_done(str(tmp_path)) == 1
    assert run_files.read_results(str(tmp_path))["test_accuracy"] == results["test_accuracy"]
    assert run_files.read_config(str(tmp_path))["resolved_model"]["hidden_size"] == 64
    assert results["parameters"] == 59_429 and results["images_per_second"] > 0  # the whole preset: 175,323
    # TensorBoard scalars for loss, accuracy and the learning rate.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "logs" / "train"))
    events.Reload()
    tags = set(events.Tags()["tensors"]) | set(events.Tags()["scalars"])
    assert {"epoch_loss", "epoch_accuracy", "learning_rate"} <= tags
    # Reload the final model: same test predictions as the trainer measured.
    import keras

    model = keras.models.load_model(tmp_path / "model.keras")
    from trainers import data

    test = data.load_cifar10_files(cifar10_mini_dir).test
    accuracy = float(np.mean(model.predict(test.images, verbose=0).argmax(-1) == test.labels))
    assert accuracy == pytest.approx(results["test_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_short_run_learns_on_generated_files(tiny_cifar, tmp_path):
    """The same loop on a dataset this test wrote in the official format."""
    path, _ = tiny_cifar
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, dataset="cifar10_files", data_dir=path, epochs=4,
        global_batch_size=25, validation_size=50, model_dir=str(tmp_path), strategy="one_device",
        learning_rate=0.05,
    ))
    results = train_lib.train(config, log=lambda s: None)
    assert results["steps"] == 4 * (200 // 25)
    assert results["val_accuracy"] >= 0.5, results  # generated classes are easy; chance is 0.1


# ------------------------------------------------------------------------------ weight decay


def test_weight_decay_applies_to_exactly_the_listed_variables(tmp_path):
    config = make_config(overrides=dict(
        model="sa_content_plus_learned_bias_small", num_layers=1, dataset="synthetic", dropout=0.0,
        weight_decay=0.01, model_dir=str(tmp_path), global_batch_size=8, jit_compile=False,
    ))
    config.no_weight_decay = "gamma,beta,bias"  # BERT's convention
    task = Task(config, log=lambda s: None)
    model = task.build_model()
    optimizer = task.build_optimizer(model, task.build_schedule(task.total_steps()))
    excluded = config.weight_decay_exclusions()
    assert sa_conv.no_weight_decay(model) == []  # no quadratic encoding: nothing declared
    names = {v.path: decays(v, excluded) for v in model.trainable_variables}
    assert not any(ok for path, ok in names.items() if path.endswith(("/bias", "/gamma", "/beta")))
    assert all(ok for path, ok in names.items() if path.endswith(("/kernel", "_embeddings")))
    assert [v.path for v in task.decayed_variables(model)] == [p for p, ok in names.items() if ok]
    images = task.train_split.images[:8]
    labels = task.train_split.labels[:8]
    with_decay, _ = task.gradients(model, optimizer, images, labels)
    without, _ = task.gradients(model, optimizer, images, labels, decayed=[])
    for v, g1, g0 in zip(model.trainable_variables, with_decay, without):
        expected = 0.01 * v.numpy() if decays(v, excluded) else np.zeros(v.shape)
        diff = tf.convert_to_tensor(g1) - tf.convert_to_tensor(g0)
        np.testing.assert_allclose(diff.numpy(), expected, atol=1e-6, err_msg=v.path)

    quadratic = make_config(overrides=dict(model="sa_quadratic_full_small", dataset="synthetic", model_dir=str(tmp_path)))
    task = Task(quadratic, log=lambda s: None)
    model = sa_conv.build_model(quadratic.model)
    decayed = {id(v) for v in task.decayed_variables(model)}
    skipped = sorted({v.name for v in model.trainable_variables if id(v) not in decayed})
    assert skipped == ["centers", "spreads"]  # the reference's default: everything else decays


def test_weight_decay_follows_what_the_model_declares_not_variable_names(tmp_path, monkeypatch):
    """The quadratic encodings declare their centers and spreads (``no_weight_decay``): renamed,
    they are still the variables spared, and every other variable still decays."""
    from sa_conv.encodings.quadratic import QuadraticEncoding

    config = make_config(overrides=dict(model="sa_quadratic_small", dataset="synthetic", model_dir=str(tmp_path)))
    task = Task(config, log=lambda s: None)

    def spared(model):
        decayed = {id(v) for v in task.decayed_variables(model)}
        return [v.path for v in model.trainable_variables if id(v) not in decayed]

    declared = spared(sa_conv.build_model(config.model))
    assert len(declared) == 6 and {p.rsplit("/", 1)[1] for p in declared} == {"centers", "spreads"}  # 3 blocks
    add_weight = QuadraticEncoding.add_weight
    renames = {"centers": "offset_means", "spreads": "offset_widths"}
    monkeypatch.setattr(QuadraticEncoding, "add_weight",
                        lambda self, *a, name=None, **k: add_weight(self, *a, name=renames.get(name, name), **k))
    renamed = sa_conv.build_model(config.model)
    assert spared(renamed) == [p.replace("centers", "offset_means").replace("spreads", "offset_widths")
                               for p in declared]
    assert len(task.decayed_variables(renamed)) == len(renamed.trainable_variables) - 6


# ------------------------------------------------------------------------------ replicas


def test_two_replicas_match_one_replica(tiny_cifar, tmp_path):
    """``--strategy=auto`` on 2 logical CPU devices is a MirroredStrategy of 2 replicas: same loss
    curve as 1 replica (OneDeviceStrategy) for the same global batch and seed, under the small-data
    recipe (AdamW, per-image and per-batch augmentation, the validation of the weights' average;
    one block, which stochastic depth spares). The 2 replicas run in a fresh process (devices are
    set before TF starts); the 1 replica in this one."""
    flags = dict(model="sa_quadratic_small", dataset="cifar10_files", data_dir=tiny_cifar[0], epochs=2, dropout=0,
                 validation_size=50, recipe="small_data", augmentation=",".join(AUGMENTATIONS), ema_momentum=0.9,
                 **TINY_SETTINGS)
    train_lib.train(make_config(overrides=dict(flags, strategy="one_device", model_dir=str(tmp_path / "r1"))),
                    log=lambda s: None)
    proc = _cli(*(f"--{k}={v}" for k, v in flags.items()), "--cpu_devices=2", "--strategy=auto",
                f"--model_dir={tmp_path / 'r2'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    histories = {}
    for n in (1, 2):
        assert _json(tmp_path / f"r{n}" / "results.json")["replicas"] == n
        histories[n] = _json(tmp_path / f"r{n}" / "history.json")
    for a, b in zip(histories[1], histories[2]):
        assert a["step"] == b["step"]
        for key in ("train_loss", "val_loss", "train_accuracy"):
            assert a[key] == pytest.approx(b[key], rel=2e-3, abs=2e-3), key


def test_xla_step_matches_the_default_step(tiny_cifar, tmp_path):
    """--jit_compile (XLA, off by default) trains to the same loss curve as the default graph step."""
    histories = {}
    for jit in (False, True):
        config = make_config(overrides=dict(
            model="sa_quadratic_small", num_layers=1, dataset="cifar10_files", data_dir=tiny_cifar[0], epochs=2,
            dropout=0.0, global_batch_size=32, validation_size=50, strategy="one_device",  # 7 steps an epoch
            jit_compile=jit, model_dir=str(tmp_path / f"jit{int(jit)}"), mixed_precision="float32",  # float32's bound
        ))
        train_lib.train(config, log=lambda s: None)
        histories[jit] = _json(tmp_path / f"jit{int(jit)}" / "history.json")
    assert len(histories[True]) == len(histories[False]) == 2
    for a, b in zip(histories[False], histories[True]):
        for key in ("train_loss", "val_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-3), key


def test_xla_is_on_by_default_only_where_content_attention_needs_it_for_memory(tmp_path):
    """XLA by default only for content-based attention whose step, not rematerialized, is estimated above
    --memory_budget_gb: there XLA's buffer reuse keeps it in memory; elsewhere steps train faster without it."""
    on = {name for name in sa_conv.PRESETS if default_jit_compile(sa_conv.get_config(name), 100, 4.0)}
    assert on == {"sa_content_plus_learned_bias", "sa_gated"}
    small = sa_conv.get_config("sa_quadratic_small", encoding="content_with_relative_keys")  # 2.1 GB at batch 100
    assert not default_jit_compile(small, 100, 4.0) and default_jit_compile(small, 100, 1.0)
    assert not default_jit_compile(small, 25, 1.0)  # a replica's batch, not the global one
    assert not default_jit_compile(sa_conv.get_config("sa_gated", remat=True), 100, 4.0)
    # The trainer's --remat=auto rematerializes the paper's content preset at batch 100, which then needs no XLA.
    flags = dict(model="sa_content_plus_learned_bias", dataset="synthetic", model_dir=str(tmp_path))
    remat, kept = Task(make_config(overrides=flags)), Task(make_config(overrides=dict(flags, remat="none")))
    assert (remat.model_config.remat, remat.use_xla()) == (True, False)
    assert (kept.model_config.remat, kept.use_xla()) == (False, True)
    # A replica's batch decides: 2.1 GB for 100 images of the small content preset, 0.53 for 25.
    small_flags = dict(flags, model="sa_content_plus_learned_bias_small", remat="none", memory_budget_gb=1.0)
    assert [Task(make_config(overrides=small_flags), replicas=n).use_xla() for n in (1, 4)] == [True, False]


def test_xla_runs_on_one_device_and_a_task_must_fit_the_trainers_replicas(small_run, tmp_path):
    """XLA stays on with the default and one-device strategies (no several logical CPU replicas);
    a Task made for another replica count than the Trainer's strategy is refused by name."""
    assert distribute.xla_runs_on(tf.distribute.get_strategy())
    assert distribute.xla_runs_on(tf.distribute.OneDeviceStrategy("/cpu:0"))
    config = make_config(overrides=dict(small_run, model_dir=str(tmp_path)))
    task = Task(config, replicas=2, log=lambda s: None)
    with pytest.raises(ConfigError, match=r"made for 2 replica\(s\), the strategy has 1: make it with "
                                          r"Task\(config, replicas=1\)"):
        train_lib.Trainer(config, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), task=task)


def test_one_cpu_replica_iterates_the_dataset_itself():
    """On one CPU replica `distribute.distribute_dataset` gives the dataset itself, not
    tf.distribute's per-device iterator (whose deletion, once an epoch, waits for tf.data's
    autotuning thread), with the batches tf.distribute gives; a replica on another device, or
    several replicas of one CPU device each (workers), go through tf.distribute
    (`test_two_replicas_match_one_replica`: two CPU replicas)."""
    dataset = tf.data.Dataset.range(10).batch(4)
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    for strategy in (one_device, tf.distribute.MirroredStrategy(["/cpu:0"]), tf.distribute.get_strategy()):
        assert distribute.distribute_dataset(strategy, dataset) is dataset, strategy
    assert not distribute.one_cpu_replica(tf.distribute.OneDeviceStrategy("/gpu:0"))
    two_workers = types.SimpleNamespace(extended=types.SimpleNamespace(
        worker_devices=("/job:worker/replica:0/task:0/device:CPU:0",)), num_replicas_in_sync=2)
    assert not distribute.one_cpu_replica(two_workers)
    theirs = [one_device.experimental_local_results(batch)[0].numpy().tolist()
              for batch in one_device.experimental_distribute_dataset(dataset)]
    ours = [batch.numpy().tolist() for batch in distribute.distribute_dataset(one_device, dataset)]
    assert ours == theirs == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_auto_strategy_is_one_device_on_one_device():
    """In this process TensorFlow has one CPU device: ``auto`` takes OneDeviceStrategy there (a
    MirroredStrategy over one device gains nothing);
    `test_two_replicas_match_one_replica` runs ``auto``'s other branch on two logical CPUs."""
    assert len(tf.config.list_logical_devices("CPU")) == 1
    assert isinstance(distribute.create_strategy("auto"), tf.distribute.OneDeviceStrategy)


def test_batch_not_divisible_by_replicas(tmp_path):
    proc = _cli("--dataset=synthetic", "--cpu_devices=2", "--strategy=mirrored",
                "--global_batch_size=33", f"--model_dir={tmp_path}")
    assert proc.returncode != 0
    assert "not divisible by the 2 replicas" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_multi_worker_strategy_two_processes(tmp_path):
    cluster = {"worker": [f"127.0.0.1:{reserved_port()}" for _ in range(2)]}
    procs = []
    for index in range(2):
        env = {**ENV, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "trainers.train", "--model=sa_quadratic_small", "--dataset=synthetic",
             "--epochs=1", "--max_steps=5", "--validation_size=100", "--strategy=multi_worker",
             f"--model_dir={tmp_path}", *TINY],
            cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    chief = _json(tmp_path / "results.json")
    worker = _json(tmp_path / "workers" / "worker_1" / "results.json")
    assert chief["steps"] == worker["steps"] == 5
    assert chief["replicas"] == 2
    assert chief["weights_sha256"] == worker["weights_sha256"]
    assert (tmp_path / "model.keras").is_file()
    assert not (tmp_path / "workers" / "worker_1" / "model.keras").exists()


# ------------------------------------------------------------------------------ resume


class _Killed(Exception):
    pass


def _stopped_after_first_epoch(config, logs=None):
    """Trains ``config`` until its first epoch's line is logged (the epoch is saved by then) and
    stops there, as a kill at that moment would."""
    def log(line):
        if logs is not None:
            logs.append(line)
        if line.startswith("epoch 1/"):
            raise _Killed

    with pytest.raises(_Killed):
        train_lib.train(config, log=log)


@pytest.fixture
def small_run(tiny_cifar):
    """A two-epoch run of one block on the tiny_cifar files: 2 steps of 100 an epoch, 50 validation images."""
    return dict(model="sa_quadratic_small", num_layers=1, dataset="cifar10_files", data_dir=tiny_cifar[0],
                global_batch_size=100, eval_batch_size=100, validation_size=50, epochs=2, strategy="one_device")


@pytest.mark.parametrize("umask, new_file", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_written_atomically_get_the_permissions_open_would_give_them(tmp_path, umask, new_file):
    """A results file, a report or an export's metadata is readable as a file ``open`` made would
    be (not a temporary file's 0o600), and a rewritten file keeps its permissions."""
    from trainers import files

    previous = os.umask(umask)
    try:
        files.write_json(str(tmp_path / "results.json"), {"test_accuracy": 0.5})
        assert os.stat(tmp_path / "results.json").st_mode & 0o777 == new_file
        os.chmod(tmp_path / "results.json", 0o640)
        files.write_json(str(tmp_path / "results.json"), {"test_accuracy": 0.6})
        assert os.stat(tmp_path / "results.json").st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)
    with open(tmp_path / "results.json") as f:
        assert json.load(f) == {"test_accuracy": 0.6}


def test_json_number_lists_are_written_on_one_line_and_read_back_equal(tmp_path):
    value = {"maps": [[[0.1, 0.25], [1e-05, -2]], [[3, 4], [5, 6]]], "names": ["a", "b"], "empty": [],
             "nested": {"offset": [-1.5, 2.0], "mixed": [1, "x"]}, "note": "seeds [0,1] and [ 2 ]"}
    from trainers import files

    for inline in (True, False):
        files.write_json(str(tmp_path / "r.json"), value, inline_numbers=inline)
        text = (tmp_path / "r.json").read_text()
        assert json.loads(text) == value and '"seeds [0,1] and [ 2 ]"' in text  # strings as they were
        assert ("[0.1, 0.25]" in text and "[1e-05, -2]" in text and "[-1.5, 2.0]" in text) == inline


def test_a_second_trainer_on_a_folder_being_trained_into_stops_before_writing(tmp_path, monkeypatch):
    """Two trainers on one --model_dir (a run started again while the first still runs) would
    interleave checkpoints, snapshots and history: the second stops at once, naming the first."""
    import re

    from trainers import files
    from trainers.checkpoints import TrainingError

    config = _tiny(tmp_path / "run")
    built = []
    build_model = train_lib.Trainer.build_model
    monkeypatch.setattr(train_lib.Trainer, "build_model", lambda self: built.append(1) or build_model(self))
    with files.held(str(tmp_path / "run")):
        with pytest.raises(TrainingError, match=rf"Another process is training into "
                                                rf"{re.escape(str(tmp_path / 'run'))} \(it holds"):
            train_lib.train(config, log=lambda s: None)
        assert os.listdir(tmp_path / "run") == []
        assert built == []  # refused before it built the model
    assert train_lib.train(config, log=lambda s: None)["steps"] == 2  # once the first has ended
    assert built == [1]


def test_a_folder_that_cannot_be_locked_is_written_unlocked_with_a_warning(tmp_path, monkeypatch):
    """NFS refuses an exclusive flock on a folder (EBADF): the run goes on, warned, not stopped."""
    import errno
    import fcntl

    from trainers import files

    def refuses(descriptor, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", refuses)
    entered = []
    with pytest.warns(UserWarning, match="cannot be locked here"):
        with files.held(str(tmp_path)):
            entered.append(True)
    assert entered == [True]


def test_resume_with_other_model_flags_names_them(small_run, tmp_path):
    """A restart whose model flags differ from the stopped run's is refused with those flags named
    (not as unreadable checkpoints); config.json keeps the stopped run's, and its flags resume."""
    _stopped_after_first_epoch(make_config(overrides=dict(small_run, model_dir=str(tmp_path))))
    for changed, named in ((dict(num_layers=2), r"--num_layers=1 \(this run: --num_layers=2\)"),
                           (dict(model="sa_learned_small", num_layers=None),
                            r"--model=sa_quadratic_small \(this run: --model=sa_learned_small\); "
                            r"--num_layers=1 \(this run: no --num_layers\)"),
                           (dict(optimizer="adamw", ema_momentum=0.9),
                            r"--optimizer=sgd \(this run: --optimizer=adamw\); "
                            r"no --ema_momentum \(this run: --ema_momentum=0.9\)")):
        logs = []
        with pytest.raises(ConfigError, match=rf"checkpoints in .* were written by a run with other model flags: "
                                              rf"{named}\. To resume it, pass its flags .*another --model_dir"):
            train_lib.train(make_config(overrides=dict(small_run, model_dir=str(tmp_path), **changed)),
                            log=logs.append)
        assert not [line for line in logs if "unreadable" in line]
        assert _json(tmp_path / "config.json")["num_layers"] == 1
    results = train_lib.train(make_config(overrides=dict(small_run, model_dir=str(tmp_path))), log=lambda s: None)
    assert results["resumed_from_epoch"] == 1 and results["epochs"] == 2


def test_a_stopped_run_resumes_from_its_checkpoint_and_keeps_its_snapshots(small_run, tmp_path, monkeypatch):
    """--init_from sets the weights of a run's start only: restarted with the same flags after its
    first epoch, the run trains on from its checkpoint, not from the --init_from model.
    --snapshot_every=2 over 3 epochs keeps epochs 0 (the weights training starts from: the
    --init_from model's), 2 and 3 (the final model's), and the restart keeps the first start's."""
    import keras

    source = str(tmp_path / "source.keras")
    run = tmp_path / "run"
    config = make_config(overrides=dict(small_run, epochs=3, snapshot_every=2, init_from=source, model_dir=str(run)))
    keras.utils.set_random_seed(1)  # another start than the run's own (seed 0)
    Task(config, log=lambda s: None).build_model().save(source)
    train_epochs, starts = train_lib.Trainer.train_epochs, []

    def record_start(self, *args, **kwargs):
        starts.append(self.model.get_weights())
        return train_epochs(self, *args, **kwargs)

    monkeypatch.setattr(train_lib.Trainer, "train_epochs", record_start)
    logs = []
    _stopped_after_first_epoch(config, logs)
    assert any(line.startswith("Initialized ") and source in line for line in logs)
    assert sorted(os.listdir(run / "snapshots")) == ["epoch_000.keras"]
    start_mtime = os.path.getmtime(run / "snapshots" / "epoch_000.keras")
    # The first epoch is the best so far: best_model.keras holds the weights its checkpoint saved.
    after_epoch_1 = keras.models.load_model(run / "best_model.keras").get_weights()

    logs = []
    results = train_lib.train(config, log=logs.append)
    assert results["resumed_from_epoch"] == 1 and results["epochs"] == 3
    assert not [line for line in logs if line.startswith("Initialized ")]
    for started, saved in zip(starts[1], after_epoch_1, strict=True):
        np.testing.assert_array_equal(started, saved)

    def weights(name):
        return keras.models.load_model(run / name).get_weights()

    initial = weights(source)
    assert not all(np.array_equal(a, b) for a, b in zip(after_epoch_1, initial))
    assert sorted(os.listdir(run / "snapshots")) == ["epoch_000.keras", "epoch_002.keras", "epoch_003.keras"]
    assert os.path.getmtime(run / "snapshots" / "epoch_000.keras") == start_mtime
    for a, b, c in zip(weights("snapshots/epoch_000.keras"), starts[0], initial, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    for a, b in zip(weights("snapshots/epoch_003.keras"), weights("model.keras"), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(weights("snapshots/epoch_002.keras"), weights("model.keras")))
    with pytest.raises(ConfigError, match="--snapshot_every must be >= 0"):
        make_config(overrides=dict(small_run, snapshot_every=-1)).validate()


def test_checkpoint_holds_the_seed_generators_and_reads_earlier_ones(tmp_path):
    import keras

    from trainers import checkpoints

    def parts():
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dropout(0.5)(keras.layers.Dense(4)(inputs)))
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
        return model, optimizer, tf.Variable(0, dtype=tf.int64)

    trained, optimizer, epoch = parts()
    for _ in range(3):
        trained(np.ones((2, 4), "float32"), training=True)  # each call advances the dropout's seed
    [state] = checkpoints.seed_states(trained)
    assert state.numpy()[1] == 3 and not any(state is w for w in trained.weights)
    path = checkpoints.training_checkpoint(trained, optimizer, epoch).save(str(tmp_path / "new" / "ckpt"))
    model, *rest = parts()
    checkpoints.restore(checkpoints.training_checkpoint(model, *rest), path)
    np.testing.assert_array_equal(checkpoints.seed_states(model)[0].numpy(), state.numpy())
    np.testing.assert_array_equal(model.get_weights()[0], trained.get_weights()[0])
    # A checkpoint written before the seed states were saved: the rest is restored, and said so.
    earlier = tf.train.Checkpoint(model=trained, optimizer=optimizer, epoch=epoch).save(str(tmp_path / "old" / "ckpt"))
    model, *rest = parts()
    fresh, notes = checkpoints.seed_states(model)[0].numpy(), []
    checkpoints.restore(checkpoints.training_checkpoint(model, *rest), earlier, notes.append)
    np.testing.assert_array_equal(model.get_weights()[0], trained.get_weights()[0])
    np.testing.assert_array_equal(checkpoints.seed_states(model)[0].numpy(), fresh)
    assert len(notes) == 1 and "no dropout seed states" in notes[0]


@pytest.mark.slow
@pytest.mark.parametrize("replicas, policy, recipe", [(1, "mixed_bfloat16", "small_data"), (2, "float32", "paper")])
def test_run_killed_mid_epoch_and_resumed_ends_as_the_uninterrupted_run(replicas, policy, recipe, tiny_cifar,
                                                                        tmp_path):
    """What decides the rest of a run is in its checkpoint (the dropout layers' seed generators
    with the weights and the optimizer) or follows from the seed and the epoch (the data order).
    Killed with SIGKILL in its second and last epoch and started again, a run ends with the losses
    and, bit for bit, the weights of the same run left alone: on one replica in ``mixed_bfloat16``
    (what ``--mixed_precision=auto`` picks on bfloat16 CPUs, and the little-data study ran) with the
    small_data recipe and every augmentation (AdamW, stochastic depth in the second block, the
    weights' moving average, besides dropout), and on two under MirroredStrategy in float32 with the
    paper's."""
    args = ["--model=sa_quadratic_small", "--dataset=cifar10_files", f"--data_dir={tiny_cifar[0]}", "--epochs=2",
            "--validation_size=50", "--global_batch_size=20", "--eval_batch_size=50", "--seed=3",  # dropout 0.1
            f"--recipe={recipe}", f"--num_layers={2 if recipe == 'small_data' else 1}",
            f"--augmentation={','.join(AUGMENTATIONS) if recipe == 'small_data' else 'pad_crop_flip'}",
            f"--cpu_devices={replicas}", "--strategy=mirrored" if replicas > 1 else "--strategy=one_device",
            f"--mixed_precision={policy}"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    env = {**ENV, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "trainers.train", *args]
    uninterrupted = subprocess.Popen([*command, f"--model_dir={whole}"], cwd=PROJECT_ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = subprocess.Popen([*command, f"--model_dir={resumed}"], cwd=PROJECT_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        try:
            # Printed once epoch 1's checkpoint is written: the kill lands in epoch 2.
            read_until(killed, "epoch 1/2", timeout=240)
        finally:
            os.kill(killed.pid, signal.SIGKILL)
            killed.wait()
        assert (resumed / "checkpoints" / "checkpoint").exists() and not (resumed / "results.json").exists()
        killed_history = _json(resumed / "history.json")
        assert [h["epoch"] for h in killed_history] == [1]
        killed_history[0]["cpu"] = "Another CPU, AVX2"  # as if the run resumes on another machine
        (resumed / "history.json").write_text(json.dumps(killed_history))
        rerun = _cli(*args, f"--model_dir={resumed}")
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "Resuming from" in rerun.stdout + rerun.stderr
        said = rerun.stdout + rerun.stderr
        assert f"Earlier epochs ran on Another CPU, AVX2, these on {process.cpu_class()}:" in said
        _, err = uninterrupted.communicate(timeout=300)
        assert uninterrupted.returncode == 0, err[-3000:]
    finally:
        if uninterrupted.poll() is None:  # a failure above: no trainer left running
            uninterrupted.kill()
            uninterrupted.wait()

    expected, results = _json(whole / "results.json"), _json(resumed / "results.json")
    assert expected["resumed_from_epoch"] is None and results["resumed_from_epoch"] == 1
    assert results["replicas"] == expected["replicas"] == replicas
    assert _json(resumed / "config.json")["precision"]["policy"] == policy
    assert results["steps"] == expected["steps"] and results["epochs"] == 2
    history = _json(resumed / "history.json")
    assert [h["epoch"] for h in history] == [1, 2] and history[0] == killed_history[0]  # not trained again
    assert history[1]["cpu"] == process.cpu_class()
    losses = [[h["train_loss"] for h in _json(run / "history.json")] for run in (whole, resumed)]
    assert losses[1] == losses[0]
    assert results["weights_sha256"] == expected["weights_sha256"]


# ------------------------------------------------------------------------------ bad flags


@pytest.mark.parametrize("precision, advice", [("float32", r"--warmup_ratio\.$"),
                                               ("mixed_bfloat16", r", or train in float32 \(this run: mixed_bfloat16\)\.")])
def test_nan_loss_stops_with_a_clear_error(tmp_path, precision, advice):
    """The advice to train in float32 is given to a run that does not."""
    config = make_config(overrides=dict(
        model="sa_quadratic_small", num_layers=1, dataset="synthetic", learning_rate=1e6, warmup_ratio=0.0,
        epochs=2, global_batch_size=50, model_dir=str(tmp_path), strategy="one_device", mixed_precision=precision,
    ))
    with pytest.raises(train_lib.TrainingError, match="loss became (nan|inf).*Lower --learning_rate.*" + advice):
        train_lib.train(config, log=lambda s: None)


def test_config_error_for_model_overrides(tmp_path):
    overrides = dict(model="sa_learned_small", hidden_size=63, encoding="content_with_relative_keys",
                     model_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="hidden_size must be even"):
        make_config(overrides=overrides)
    # A config changed after it was made is checked again when the trainer starts.
    config = dataclasses.replace(make_config(overrides={**overrides, "hidden_size": 64}), hidden_size=63)
    with pytest.raises(ConfigError, match="hidden_size must be even"):
        train_lib.Trainer(config, strategy=tf.distribute.get_strategy())


def test_attention_init_flags_start_the_trained_model_and_are_recorded(tmp_path):
    from sa_conv.attention_init import grid_shifts

    config = make_config(overrides=dict(model="sa_learned_small", num_layers=1, dataset="synthetic",
                                        attention_init="convolutional", locality_strength=2.5, model_dir=str(tmp_path)))
    task = Task(config, log=lambda s: None)
    assert (task.model_config.attention_init, task.model_config.locality_strength) == ("convolutional", 2.5)
    attention = task.build_model().get_layer("block_0").attention
    probabilities = attention.attention_probabilities(np.zeros((1, 16, 16, 64), "float32")).numpy()
    peaks = probabilities[:, 8 * 16 + 8].argmax(-1)  # the center query: each head on its shift
    np.testing.assert_array_equal(np.stack(np.divmod(peaks, 16), -1) - 8, grid_shifts(9))
    # The gated presets start convolutional; --attention_init=random overrides it.
    gated = make_config(overrides=dict(model="sa_gated_small", dataset="synthetic", attention_init="random",
                                       model_dir=str(tmp_path)))
    assert Task(gated, log=lambda s: None).model_config.attention_init == "random"
    with pytest.raises(ConfigError, match="has none. Use one of quadratic"):
        make_config(overrides=dict(model="sa_content_plus_learned_bias_small", dataset="synthetic",
                                   attention_init="convolutional", model_dir=str(tmp_path)))


# ------------------------------------------------------------------------------ normalization


@pytest.mark.parametrize("statistics", ["data", "reference"])
def test_pixel_statistics_decide_the_models_normalization(statistics, tmp_path):
    config = make_config(overrides=dict(model="sa_quadratic_small", num_layers=1, dataset="synthetic",
                                        pixel_statistics=statistics, model_dir=str(tmp_path),
                                        mixed_precision="float32"))  # compared at float32's tolerance
    task = Task(config, log=lambda s: None)
    model = task.build_model()
    images = task.train_split.images
    # "data": the statistics of the official training split (before the validation hold-out).
    scaled = np.concatenate([images, task.val_split.images]).reshape(-1, 3).astype(np.float64) / 255.0
    if statistics == "data":
        mean, std = scaled.mean(0), scaled.std(0)
    else:  # the reference train.py's constants
        mean, std = np.array(epfml_reference.PIXEL_MEAN), np.array(epfml_reference.PIXEL_STD)
    normalized = model.get_layer("normalize")(images[:4]).numpy()
    np.testing.assert_allclose(normalized, (images[:4] / 255.0 - mean) / std, atol=1e-4)
    assert task.model_config.pixel_std == pytest.approx(tuple(std), abs=1e-3)


def test_reference_statistics_refuse_other_channel_counts(tmp_path):
    from trainers import data

    gray = data.make_synthetic(num_train=64, num_test=16, image_shape=(32, 32, 1))
    config = make_config(overrides=dict(model="sa_quadratic_small", dataset="synthetic",
                                        pixel_statistics="reference", model_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="3 channels.*has 1.*--pixel_statistics=data"):
        Task(config, log=lambda s: None, dataset=gray)


# ------------------------------------------------------------------------------ --init_from


def _tiny(tmp_path, **overrides):
    settings = dict(model="sa_quadratic_small", num_layers=1, dataset="synthetic", global_batch_size=50,
                    eval_batch_size=100, validation_size=100, epochs=1, max_steps=2, strategy="one_device",
                    model_dir=str(tmp_path))
    return make_config(overrides={**settings, **overrides})


@pytest.mark.slow
def test_init_from_starts_from_the_saved_weights_and_refuses_other_models(tmp_path):
    source_config = _tiny(tmp_path / "a", seed=1)
    train_lib.train(source_config, log=lambda s: None)
    import keras

    source = keras.saving.load_model(str(tmp_path / "a" / "model.keras"), compile=False)
    # One step at a learning rate of 1e-9: the run ends where it started.
    logs = []
    results = train_lib.Trainer(_tiny(tmp_path / "b", seed=1, max_steps=1, learning_rate=1e-9,
                                      init_from=str(tmp_path / "a" / "model.keras")), log=logs.append).run()
    assert any("Initialized" in line for line in logs)
    trained = keras.saving.load_model(str(tmp_path / "b" / "model.keras"), compile=False)
    assert results["steps"] == 1
    for u, v in zip(source.weights, trained.weights):
        if "seed_generator" not in u.path:
            np.testing.assert_allclose(v.numpy(), u.numpy(), rtol=0, atol=1e-6, err_msg=u.path)
    fresh = train_lib.Trainer(_tiny(tmp_path / "c", seed=1), log=lambda s: None)
    fresh.prepare()
    assert np.abs(fresh.model.weights[0].numpy() - source.weights[0].numpy()).max() > 1e-3  # a fresh start

    with pytest.raises(ConfigError, match="different architecture.*--num_layers"):
        train_lib.Trainer(_tiny(tmp_path / "d", seed=1, num_layers=2, init_from=str(tmp_path / "a" / "model.keras")),
                          log=lambda s: None).run()
    with pytest.raises(ConfigError, match="normalizes with.*--pixel_statistics"):
        train_lib.Trainer(_tiny(tmp_path / "e", seed=1, pixel_statistics="reference",
                                init_from=str(tmp_path / "a" / "model.keras")), log=lambda s: None).run()
    with pytest.raises(ConfigError, match="does not exist"):
        train_lib.Trainer(_tiny(tmp_path / "f", init_from=str(tmp_path / "nowhere.keras")), log=lambda s: None).run()


def test_keras_callbacks_get_every_hook_of_fit_and_can_stop_training(tmp_path):
    """The contract of `model.fit`: batch hooks once per execution of --steps_per_execution steps,
    with the running loss; test hooks around validation; ``model.stop_training`` ends training
    after the epoch in which a callback set it."""
    import keras

    class Recorder(keras.callbacks.Callback):
        def __init__(self, stop_after=None):
            super().__init__()
            self.calls, self.stop_after = [], stop_after

        def on_train_batch_begin(self, batch, logs=None):
            self.calls.append(("batch_begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append(("batch_end", batch, round(float(logs["loss"]), 6)))

        def on_test_begin(self, logs=None):
            self.calls.append(("test_begin",))

        def on_test_end(self, logs=None):
            self.calls.append(("test_end", sorted(logs)))

        def on_epoch_end(self, epoch, logs=None):
            self.calls.append(("epoch_end", epoch))
            if epoch == self.stop_after:
                self.model.stop_training = True

    config = _tiny(tmp_path, epochs=2, max_steps=None, validation_size=100, steps_per_execution=2)
    trainer = train_lib.Trainer(config, log=lambda s: None)
    trainer.prepare()
    assert trainer.steps_per_epoch == 18  # 900 training images, batch 50
    recorder = Recorder(stop_after=0)
    history, _ = trainer.train_epochs(0, [], callbacks=[recorder], save=False)
    assert len(history) == 1  # stopped after the first of two epochs
    batches = [call for call in recorder.calls if call[0] == "batch_end"]
    assert [call[1] for call in batches] == list(range(1, 18, 2))  # each execution's last step
    assert [c[0] for c in recorder.calls if c[0] != "batch_begin"][9:12] == ["test_begin", "test_end", "epoch_end"]
    # The running mean of the epoch's loss: the last batch's is the epoch's.
    assert batches[8][2] == pytest.approx(history[0]["train_loss"], abs=1e-6)
    assert ("test_end", ["accuracy", "loss"]) in recorder.calls
