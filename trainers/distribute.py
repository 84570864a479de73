"""`tf.distribute` strategy creation (once per process), logical CPU devices, and a Task's
single-replica steps run on every replica of a strategy (what the Trainer does with its Task)."""

import json
import os

import numpy as np
import tensorflow as tf

from trainers.config import ConfigError


def configure_cpu_devices(count: int) -> None:
    """Splits the first CPU into ``count`` logical devices, so that a MirroredStrategy has
    ``count`` replicas on a CPU-only host. Must run before TensorFlow initializes its devices."""
    if count <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing != count:
            raise ConfigError(
                f"--cpu_devices={count} must be set before TensorFlow initializes (it already has "
                f"{existing} CPU device(s)); start a new process."
            ) from None


def _tf_config_workers() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {exc}") from None
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def create_strategy(name: str) -> tf.distribute.Strategy:
    """The strategy ``name``:

    * ``auto``: MultiWorkerMirroredStrategy when TF_CONFIG names several workers, else
      MirroredStrategy over all GPUs (or all logical CPU devices when there is no GPU) when there
      are several, else ``one_device``: over one device a MirroredStrategy gains nothing.
    * ``mirrored``: MirroredStrategy over all GPUs, or all logical CPU devices.
    * ``multi_worker``: MultiWorkerMirroredStrategy from TF_CONFIG.
    * ``one_device``: the first GPU, else the CPU.
    * ``tpu``: TPUStrategy on the TPU found by TPUClusterResolver.
    """
    # Multi-worker first: listing devices would initialize TensorFlow's context, after which
    # collective ops can no longer be configured.
    if name == "auto":
        if _tf_config_workers() > 1:
            name = "multi_worker"
        else:
            several = len(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")) > 1
            name = "mirrored" if several else "one_device"
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if _tf_config_workers() < 1:
            raise ConfigError(
                "--strategy=multi_worker needs TF_CONFIG with a 'cluster' of workers and this "
                "process's 'task' (see tf.distribute.MultiWorkerMirroredStrategy)."
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as exc:
            raise ConfigError(f"--strategy=tpu: no TPU found ({exc}).") from None
        return tf.distribute.TPUStrategy(resolver)
    raise ConfigError(f"Unknown strategy {name!r}.")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes the run's artefacts (always true on one host)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict())


def worker_id(strategy: tf.distribute.Strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(resolver.task_id) if resolver is not None and resolver.task_id is not None else 0


# ------------------------------------------------------------------------------ replicated steps


def _worker_devices(strategy: tf.distribute.Strategy):
    """``strategy``'s devices that compute replicas; None for the default strategy, which
    computes its one replica on this process's device and has no such list."""
    try:
        return strategy.extended.worker_devices
    except RuntimeError:
        return None


def xla_runs_on(strategy: tf.distribute.Strategy) -> bool:
    """False where XLA cannot address the replicas: several logical devices of one CPU."""
    devices = _worker_devices(strategy)
    if devices is None:
        return True
    on_cpus = bool(devices) and all("CPU" in d.upper().rsplit("/DEVICE:", 1)[-1] for d in devices)
    return not (on_cpus and strategy.num_replicas_in_sync > len({d.split("/device:")[0] for d in devices}))


def replicated_train_steps(strategy: tf.distribute.Strategy, step):
    """``train_steps(iterator, steps)``: ``steps`` optimizer steps, each ``step(images, labels)``
    (`trainers.task.Task.train_step`) on every replica's share of the next batch of ``iterator``
    (of a dataset distributed by `distribute_dataset`); returns the steps' sums, reduced across
    replicas."""

    @tf.function
    def train_steps(iterator, steps):
        totals = tf.zeros([3])
        for _ in tf.range(steps):
            images, labels = next(iterator)
            sums = strategy.run(step, args=(images, labels))
            totals += strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)
        return totals

    return train_steps


def replicated_eval_step(strategy: tf.distribute.Strategy, step):
    """``eval_step(batch)``: ``step(images, labels)`` (`trainers.task.Task.eval_step`) on every
    replica's share of ``batch``, its sums reduced across replicas."""

    @tf.function
    def eval_step(batch):
        sums = strategy.run(step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)

    return eval_step


def one_cpu_replica(strategy: tf.distribute.Strategy) -> bool:
    """True when ``strategy`` computes one replica in all, on a CPU device (or is the default
    strategy): its batches need no splitting across replicas or workers."""
    devices = _worker_devices(strategy)
    if devices is None:
        return True
    return strategy.num_replicas_in_sync == 1 and len(devices) == 1 and \
        tf.DeviceSpec.from_string(devices[0]).device_type == "CPU"


def distribute_dataset(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
    """``dataset``'s global batches split across ``strategy``'s replicas; on one CPU replica
    (`one_cpu_replica`), ``dataset`` itself.

    tf.distribute iterates through a per-device tf.data iterator whose datasets have tf.data's
    default options, the autotuning model on, whatever ``dataset``'s say; deleting that iterator
    waits for the model's thread to wake, up to its optimization period, which doubles on every
    wake and so grows over an epoch (benchmarks/iterator_deletion.py). The trainer deletes one
    iterator per epoch; on one CPU replica the per-device iterator only re-buffers batches already
    in the replica's memory, so it is skipped there.
    """
    if one_cpu_replica(strategy):
        return dataset
    return strategy.experimental_distribute_dataset(dataset)


def evaluate(strategy: tf.distribute.Strategy, eval_step, dataset: tf.data.Dataset) -> dict:
    """Mean loss and accuracy over ``dataset`` (`trainers.task.Task.eval_dataset`) with
    ``eval_step`` (`replicated_eval_step`)."""
    totals = np.zeros(3)
    for batch in distribute_dataset(strategy, dataset):
        totals += eval_step(batch).numpy()
    return {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}


def local_train_steps(task, model, optimizer):
    """`replicated_train_steps` of ``task``'s step on the default strategy (this process's one
    device, outside any strategy scope), for loops over ``iter(task.train_dataset(epoch))`` (the
    benchmarks')."""
    return replicated_train_steps(tf.distribute.get_strategy(), task.train_step(model, optimizer))


def local_evaluate(task, model, split) -> dict:
    """`evaluate` of ``model`` on ``split`` with ``task``'s step on the default strategy."""
    strategy = tf.distribute.get_strategy()
    return evaluate(strategy, replicated_eval_step(strategy, task.eval_step(model)), task.eval_dataset(split))
